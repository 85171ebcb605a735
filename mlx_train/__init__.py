"""MLX backend: the GPT, Muon and a compiled, memory-aware training step for Apple silicon."""
