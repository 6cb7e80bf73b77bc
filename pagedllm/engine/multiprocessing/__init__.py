"""The engine in its own process behind the HTTP server, as vLLM's MQLLMEngine does for V0."""
