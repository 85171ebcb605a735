"""Test-time training's device side on PyTorch (core/eval/ttt.py runs it): LoRA adapters
scored then trained chunk by chunk, and SGD on the model's own weights, on the model of the backend
that makes it (`TorchBackend.ttt`), through what `TTTHost` names of it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

import torch
import torch.distributed as dist

from core.model.lora import adapter_shapes
from cuda_train.model import GPT, maybe_compile

if TYPE_CHECKING:  # names for annotations alone
    import numpy as np

    from core.config.fields import Config


class TTTHost(Protocol):
    """What test-time training uses of the backend that makes it."""

    cfg: Config
    model: GPT
    torch_device: torch.device
    autocast: AbstractContextManager
    looping: bool
    world_size: int

    def to_device(self, a: np.ndarray) -> torch.Tensor: ...


class TorchTTT:
    """The operations of core.model.backend's `TTT` on a backend's model, for one evaluation."""

    def __init__(self, backend: TTTHost):
        self.backend, self.cfg, self.model = backend, backend.cfg, backend.model
        # The LoRA forward, adapters in and their gradients out: each batch of documents has its own window
        # length, so its shapes are dynamic.
        on_gpu = backend.torch_device.type == "cuda"
        self._losses = maybe_compile(
            self.model.token_losses, self.cfg.uses_compile(on_gpu), self.cfg.compile_backend, dynamic=True
        )
        self._sgd: torch.optim.SGD | None = None

    def new_adapters(self, a: dict[str, np.ndarray]) -> tuple:
        """LoRA adapters (core/model/lora.py) as fp32 tensors {name: (A, B)}, and their optimizer."""
        cfg, device = self.cfg, self.backend.torch_device
        shapes = adapter_shapes(cfg, next(iter(a.values())).shape[0])
        # Leaf tensors, not nn.Parameter: torch.compile holds a Parameter's shape fixed, and a batch of
        # another size (the last, smaller one) would compile the LoRA forward again.
        pairs = {
            name: (
                torch.tensor(a[name], device=device, requires_grad=True),
                torch.zeros(b_shape, device=device, requires_grad=True),
            )
            for name, (_, b_shape) in shapes.items()
        }
        params = [t for pair in pairs.values() for t in pair]
        if cfg.ttt_optimizer == "sgd":
            optimizer = torch.optim.SGD(
                params, lr=cfg.ttt_lora_lr, momentum=cfg.ttt_beta1, weight_decay=cfg.ttt_weight_decay
            )
        else:
            optimizer = torch.optim.AdamW(
                params,
                lr=cfg.ttt_lora_lr,
                betas=(cfg.ttt_beta1, cfg.ttt_beta2),
                eps=1e-10,
                weight_decay=cfg.ttt_weight_decay,
                fused=device.type == "cuda",
            )
        return pairs, optimizer

    @torch.no_grad()
    def restart_adapters(self, adapters: tuple, a: dict[str, np.ndarray] | None = None) -> None:
        """B back to zero, A to `a` (or kept), the optimizer's state forgotten."""
        pairs, optimizer = adapters
        for name, (a_t, b_t) in pairs.items():
            b_t.zero_()
            if a is not None:
                a_t.copy_(torch.from_numpy(a[name]))
        optimizer.state.clear()

    def score_then_adapt(
        self,
        adapters: tuple,
        x: np.ndarray,
        y: np.ndarray,
        train_rows: np.ndarray,
        train_from: int,
        train_len: int,
    ) -> np.ndarray:
        backend, model = self.backend, self.model
        model.eval()
        pairs, optimizer = adapters
        xt, yt = backend.to_device(x), backend.to_device(y)
        rows = torch.tensor(train_rows, dtype=torch.float32, device=backend.torch_device)
        steps = self.cfg.ttt_grad_steps if train_rows.any() else 0
        model.requires_grad_(False)  # the model's own weights out of autograd: only adapters learn
        try:
            for step in range(max(steps, 1)):
                with torch.set_grad_enabled(steps > 0), backend.autocast:
                    nll = self._losses(xt, yt, backend.looping, pairs)
                if step == 0:
                    scored = nll.detach().float().cpu().numpy()  # before any step has seen the chunk
                if steps == 0:
                    break
                per_row = nll[:, train_from : train_from + train_len].mean(dim=-1)
                optimizer.zero_grad(set_to_none=True)
                (per_row * rows).sum().backward()
                optimizer.step()
        finally:
            model.requires_grad_(True)
        return scored

    def sgd_reset(self, momentum: float, frozen: tuple[str, ...] = ()) -> None:
        params = [p for n, p in self.model.named_parameters() if not n.startswith(frozen)]
        self._sgd = torch.optim.SGD(params, lr=0.0, momentum=momentum)

    def sgd_step(
        self, x: np.ndarray, y: np.ndarray, lr: float, total_tokens: int, clip: float, doc_mask: bool = True
    ) -> None:
        backend, model = self.backend, self.model
        model.train()
        group = self._sgd.param_groups[0]
        params = group["params"]
        self._sgd.zero_grad(set_to_none=False)
        if x.shape[0]:
            with backend.autocast, model.walk.plain_causal(not doc_mask):
                loss = model(
                    backend.to_device(x), backend.to_device(y), reduction="sum", looping=backend.looping
                )
            (loss / total_tokens).backward()
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if backend.world_size > 1:
                dist.all_reduce(p.grad)
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        group["lr"] = lr
        self._sgd.step()
        model.zero_grad(set_to_none=True)  # frozen weights got gradients too
        model.eval()
