"""Muon for the block matrices and Adam for the rest, in PyTorch (mirrors mlx_train/muon.py).

Muon (SPEC section 5): Nesterov momentum, then the quintic Newton-Schulz
orthogonalisation, scaled for the matrix shape. With several ranks each matrix
is orthogonalised by one rank (round-robin) and a single all-reduce of a flat
buffer shares the updates. Newton-Schulz runs in bf16 on CUDA, as the challenge's
script does, and in fp32 elsewhere (bf16 matmuls are slow or emulated on CPUs);
with `compile` on it is `torch.compile`d (one graph per matrix shape).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from core.config import Config
from core.optim import NS_COEFFS, NS_EPS, base_lr, muon_scale
from core.params import param_group


def newton_schulz(g: Tensor, steps: int) -> Tensor:
    """Approximately orthogonalise a matrix with the quintic Newton-Schulz iteration."""
    a, b, c = NS_COEFFS
    x = g.to(torch.bfloat16 if g.is_cuda else torch.float32)
    x = x / (x.norm() + NS_EPS)
    transposed = g.size(0) > g.size(1)
    if transposed:
        x = x.T
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if transposed else x


class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr: float, momentum: float, backend_steps: int, orthogonalise=newton_schulz):
        super().__init__(params, {"lr": lr, "momentum": momentum, "backend_steps": backend_steps})
        self.orthogonalise = orthogonalise

    @torch.no_grad()
    def step(self, closure=None):
        distributed = dist.is_available() and dist.is_initialized()
        world, rank = (dist.get_world_size(), dist.get_rank()) if distributed else (1, 0)
        for group in self.param_groups:
            params = group["params"]
            if not params:
                continue
            lr, momentum = group["lr"], group["momentum"]
            flat = torch.zeros(sum(p.numel() for p in params), device=params[0].device, dtype=torch.float32)
            offset = 0
            for i, p in enumerate(params):
                if p.grad is None:
                    offset += p.numel()
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, dtype=torch.float32)
                # Every rank keeps every buffer (grads are identical after DDP), so any rank
                # can checkpoint the whole state; only the orthogonalisation is dealt out.
                buf = state["momentum_buffer"]
                buf.mul_(momentum).add_(p.grad)
                if i % world == rank:
                    update = self.orthogonalise(p.grad.float() + momentum * buf, group["backend_steps"])
                    flat[offset : offset + p.numel()] = update.float().flatten() * muon_scale(*p.shape)
                offset += p.numel()
            if distributed:
                dist.all_reduce(flat)
            offset = 0
            for p in params:
                p.add_(flat[offset : offset + p.numel()].view_as(p).to(p.dtype), alpha=-lr)
                offset += p.numel()


def build_optimizers(model: nn.Module, cfg: Config, compile_on: bool = False) -> list[torch.optim.Optimizer]:
    """One optimizer per group of core.params.param_group, each group remembering its base lr."""
    orthogonalise = (
        torch.compile(newton_schulz, dynamic=False, fullgraph=True) if compile_on else newton_schulz
    )
    groups: dict[str, list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        groups.setdefault(param_group(name), []).append(p)
    fused = next(model.parameters()).is_cuda
    optimizers: list[torch.optim.Optimizer] = []
    for group, params in groups.items():
        lr = base_lr(cfg, group)
        if group == "matrix":
            opt: torch.optim.Optimizer = Muon(
                params, lr, cfg.muon_momentum, cfg.muon_backend_steps, orthogonalise
            )
        else:
            opt = torch.optim.Adam(params, lr=lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps, fused=fused)
        opt.param_groups[0]["base_lr"] = lr
        opt.param_groups[0]["group"] = group
        optimizers.append(opt)
    return optimizers
