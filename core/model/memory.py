"""The memory a training run needs, against what its device has, checked before any work starts.

`check_config` is what `train` and `bench` call first: the shared checks of the config, those
of the backend's own options, then `check_memory`: `memory_estimate` against the memory the
backend's `device_memory` (`<package>.memory`) reports. (A packaged run checks no memory: it imports none of this.)
"""

from __future__ import annotations

import importlib
import math
import os
from dataclasses import dataclass

from core.common.errors import PgolfError
from core.config.fields import Config
from core.model.backend import backend_module, pick
from core.model.optim import optimizer_state_shapes
from core.model.params import count_params, mlp_hidden


def memory_estimate(cfg: Config, bf16: bool, forward_tokens: int | None = None) -> dict[str, int]:
    """Bytes one device needs to train `cfg`, a rough lower estimate, by part:

    - "params": the parameters and their gradients, fp32 (4 + 4 bytes each);
    - "optimizer": the optimizer state of `optimizer_state_shapes`, fp32;
    - "activations": what one micro-batch keeps for its backward pass. `forward_tokens` tokens
      (at most a micro-batch, train_batch_tokens // grad_accum_steps) times, per layer visited,
      12 x model_dim + 3 x MLP width values in the compute dtype (2 bytes in bf16, else 4),
      plus 3 x vocab_size fp32 values for the logits, their softmax and its gradient.
    Workspaces, compile caches and fragmentation come on top: a run refused by this estimate
    cannot fit, one that passes may still not.
    """
    params = count_params(cfg)
    optimizer = sum(math.prod(shape) for shape in optimizer_state_shapes(cfg).values())
    tokens = cfg.train_batch_tokens // cfg.grad_accum_steps
    tokens = min(tokens, forward_tokens) if forward_tokens else tokens
    visits = cfg.num_layers + (
        cfg.num_loops * (cfg.loop_end - cfg.loop_start + 1) if cfg.num_loops > 0 else 0
    )
    per_token = visits * (12 * cfg.model_dim + 3 * mlp_hidden(cfg)) * (2 if bf16 else 4)
    per_token += 3 * cfg.vocab_size * 4
    parts = {"params": 8 * params, "optimizer": 4 * optimizer, "activations": tokens * per_token}
    return parts | {"total": sum(parts.values())}


@dataclass(frozen=True)
class DeviceMemory:
    """The memory one training process may fill, as its backend reports it."""

    bytes: int
    what: str  # e.g. "free memory of cuda:0", "physical RAM"
    gpu: bool  # the compute dtype follows (bf16 by default on a GPU)
    forward_tokens: int | None = None  # the largest batch one forward holds, when below a micro-batch


def physical_ram() -> int | None:
    """Bytes of RAM in this machine, if the system says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(cfg: Config, device: DeviceMemory | None) -> None:
    """Refuse a training config whose estimated memory (`memory_estimate`) exceeds the device's."""
    if not cfg.memory_check or device is None:
        return
    need = memory_estimate(cfg, cfg.uses_bf16(device.gpu), device.forward_tokens)
    if need["total"] > device.bytes:

        def gib(n: int) -> str:
            return f"{n / 2**30:,.1f} GiB"

        raise PgolfError(
            f"config: training needs about {gib(need['total'])} per device (parameters and gradients "
            f"{gib(need['params'])}, optimizer state {gib(need['optimizer'])}, activations "
            f"{gib(need['activations'])}) but the {device.what} is {gib(device.bytes)}: lower model_dim, "
            "num_layers or train_batch_tokens, or raise grad_accum_steps (--no-memory-check to try anyway)"
        )


def check_config(name: str, cfg: Config) -> None:
    """The shared checks, those of the backend's own options, then the memory a training run needs
    against the device's (before any data is prepared or anything is allocated)."""
    info = pick(name)
    cfg.validate()
    backend_module(info).check_config(cfg)
    check_memory(cfg, importlib.import_module(f"{info.package}.memory").device_memory(cfg))
