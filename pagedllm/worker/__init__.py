"""Workers hold the model and the KV cache tensors and run the steps the scheduler plans."""
