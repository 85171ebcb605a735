"""What the MLX backend's device has, for core/model/memory.py's check before a run."""

from __future__ import annotations

import mlx.core as mx

from core.config.fields import Config
from core.model.memory import DeviceMemory, physical_ram


def device_memory(cfg: Config) -> DeviceMemory | None:
    """The memory MLX reports for its device (unified memory on a Mac), else the machine's RAM.

    One forward holds at most a sub-batch when the graph is evaluated after each one."""
    size = mx.device_info().get("memory_size") or physical_ram()
    tokens = cfg.mlx_max_microbatch_tokens if cfg.mlx_eager_eval else None
    return (
        None
        if size is None
        else DeviceMemory(
            int(size), "device memory", gpu=mx.default_device() == mx.gpu, forward_tokens=tokens
        )
    )
