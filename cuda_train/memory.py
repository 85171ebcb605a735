"""What the PyTorch backend's device has free, for core/model/memory.py's check before a run (the CLI's
check: a packaged run imports none of this)."""

from __future__ import annotations

import torch

from core.common.launch import launch
from core.config.fields import Config
from core.model.memory import DeviceMemory, physical_ram


def device_memory(cfg: Config) -> DeviceMemory | None:
    """What this process's device has free: its CUDA device's, else its share of the machine's RAM
    (torchrun's processes on one machine share it)."""
    if torch.cuda.is_available():
        index = launch().local_rank % torch.cuda.device_count()
        free, _total = torch.cuda.mem_get_info(index)
        return DeviceMemory(free, f"free memory of cuda:{index}", gpu=True)
    ram, ranks = physical_ram(), launch().local_world_size
    share = "physical RAM" if ranks == 1 else f"physical RAM's share of each of {ranks} processes"
    return None if ram is None else DeviceMemory(ram // ranks, share, gpu=False)
