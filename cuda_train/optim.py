"""The optimizers in PyTorch (mirrors mlx_train/optim.py): Muon for the block matrices, AdamW for the rest.

The groups, learning rates and weight decays come from the parameter table
(core/model/params.py) through core.model.optim.GROUPS. Muon: Nesterov momentum, then
core.model.optim.newton_schulz, scaled for the matrix shape, after the decoupled
weight decay. With several ranks each matrix is orthogonalised by one rank
(round-robin) and a single all-reduce of a flat buffer shares the updates.
Newton-Schulz runs in bf16 on CUDA, as the challenge's script does, and in fp32
elsewhere (bf16 matmuls are slow or emulated on CPUs); with `compile` on it is
`torch.compile`d (one graph per matrix shape).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from core.config.fields import Config
from core.model.optim import GROUPS, base_lr, muon_scale, newton_schulz, ns_coefficients, weight_decay
from core.model.params import ParamSpec
from cuda_train.model import maybe_compile


class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr: float, momentum: float, weight_decay: float, orthogonalise: Callable):
        super().__init__(
            params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, base_weight_decay=weight_decay)
        )
        self.orthogonalise = orthogonalise

    @torch.no_grad()
    def step(self, closure=None):
        distributed = dist.is_available() and dist.is_initialized()
        world, rank = (dist.get_world_size(), dist.get_rank()) if distributed else (1, 0)
        for group in self.param_groups:
            params = group["params"]  # never empty: torch.optim refuses an empty group
            lr, momentum, decay = group["lr"], group["momentum"], group["weight_decay"]
            flat = torch.zeros(sum(p.numel() for p in params), device=params[0].device, dtype=torch.float32)
            parts = flat.split([p.numel() for p in params])  # views of flat, one per matrix
            for i, (p, part) in enumerate(zip(params, parts, strict=True)):
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, dtype=torch.float32)
                # Every rank keeps every buffer (grads are identical after DDP), so any rank
                # can checkpoint the whole state; only the orthogonalisation is dealt out.
                buf = state["momentum_buffer"]
                buf.mul_(momentum).add_(p.grad)
                if i % world == rank:
                    update = self.orthogonalise(p.grad.float() + momentum * buf)
                    part.copy_(update.float().flatten() * muon_scale(*p.shape))
            if distributed:
                dist.all_reduce(flat)
            for p, part in zip(params, parts, strict=True):
                if decay:
                    p.mul_(1.0 - lr * decay)
                p.add_(part.view_as(p).to(p.dtype), alpha=-lr)


def orthogonaliser(cfg: Config, cuda: bool, compile_on: bool) -> Callable[[Tensor], Tensor]:
    coefficients = ns_coefficients(cfg)
    dtype = torch.bfloat16 if cuda else torch.float32

    def orthogonalise(g: Tensor) -> Tensor:
        return newton_schulz(g.to(dtype), coefficients, cfg.muon_row_normalize)

    return maybe_compile(orthogonalise, compile_on, cfg.compile_backend)


def build_optimizers(
    model: nn.Module, specs: dict[str, ParamSpec], cfg: Config, compile_on: bool = False
) -> list[torch.optim.Optimizer]:
    """One optimizer per group of the parameter table, each remembering its base lr."""
    members: dict[str, list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        members.setdefault(specs[name].group, []).append(p)
    cuda = next(model.parameters()).is_cuda
    optimizers: list[torch.optim.Optimizer] = []
    for group, params in members.items():
        lr, decay = base_lr(cfg, group), weight_decay(cfg, group)
        if GROUPS[group].muon:
            opt: torch.optim.Optimizer = Muon(
                params, lr, cfg.muon_momentum, decay, orthogonaliser(cfg, cuda, compile_on)
            )
        else:
            betas = (cfg.beta1, cfg.beta2)
            opt = torch.optim.AdamW(
                params, lr=lr, betas=betas, eps=cfg.adam_eps, weight_decay=decay, fused=cuda
            )
        opt.param_groups[0]["base_lr"] = lr
        optimizers.append(opt)
    return optimizers
