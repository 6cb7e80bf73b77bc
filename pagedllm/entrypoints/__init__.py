"""User-facing entry points: the command line and the OpenAI-compatible server."""
