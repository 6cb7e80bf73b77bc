"""Turning logits into tokens: the per-batch sampling metadata and the sampler pipeline."""
