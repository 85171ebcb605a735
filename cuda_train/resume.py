"""Resuming a run on PyTorch: the optimizers' state put back from a checkpoint (a module of its own:
only resuming imports it, in `TorchBackend.load_optimizer_state`, so a packaged run leaves it out)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from cuda_train.backend import state_keys
from cuda_train.optim import Muon

if TYPE_CHECKING:  # names for annotations alone
    from cuda_train.backend import TorchBackend


def restore_optimizers(backend: TorchBackend, state: dict[str, np.ndarray], step: int) -> None:
    """Each optimizer's state after `step` steps, from the canonical layout (core.model.backend) of
    `state`, which core/artifact/load.py's `check_resumable` found complete."""
    names = {p: n for n, p in backend.model.named_parameters()}
    for opt in backend.optimizers:
        for p in opt.param_groups[0]["params"]:
            # In the parameter's dtype: fp32 for Muon's matrices, the embedding's own for Adam.
            opt.state[p] = {
                key: torch.from_numpy(np.asarray(state[f"{key}/{names[p]}"]))
                .to(backend.torch_device, torch.float32)
                .to(p.dtype)
                for key in state_keys(opt)
            }
            if not isinstance(opt, Muon):  # on the device only for the fused kernel
                where = p.device if opt.defaults.get("fused") else "cpu"
                opt.state[p]["step"] = torch.tensor(float(step), dtype=torch.float32, device=where)
