"""Pooling models: tasks, pooler settings and sentence-transformers folders (no torch here)."""
