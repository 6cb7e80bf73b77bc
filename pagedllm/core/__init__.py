"""Pure-Python bookkeeping of requests, KV cache blocks and scheduling; no model, no torch."""
