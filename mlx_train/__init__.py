"""MLX backend: the v1 GPT, Muon and a compiled, memory-aware training step for Apple silicon."""
