"""PyTorch backend: the GPT, Muon, torch.compile and DDP (via torchrun) for CUDA GPUs, or a CPU."""
