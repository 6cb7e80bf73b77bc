"""Speculative decoding: cheap proposals of the next tokens, verified by the target model in one forward pass.

`config.py` parses vLLM's `speculative_config`; `ngram.py` and `draft_model.py` propose tokens on the worker
after each step; `verify.py` turns the target's logits at every proposed position into the accepted tokens
(`rejection.py`: greedy prefix match, or rejection sampling that keeps the target distribution).
"""
