"""The engine: requests in, scheduled steps through the executor, RequestOutputs out."""
