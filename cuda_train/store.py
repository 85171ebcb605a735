"""Rank 0's word to the other ranks through the process group's store, not a collective (a module of
its own: only the artifact fit asks for it, `TorchBackend.from_rank_0`, so a packaged run leaves it out)."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from core.common.errors import PgolfError, first_line


def from_rank_0(rank: int, key: str, text: str | None, wait_seconds: float) -> str:
    """core.model.backend's `Backend.from_rank_0` with several ranks: NCCL's and gloo's timeouts do not
    apply, the others wait up to `wait_seconds`."""
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set(key, text or "")
        return text or ""
    try:
        store.wait([key], timedelta(seconds=wait_seconds))
    except RuntimeError as exc:  # its timeout (DistStoreError), or the store gone
        raise PgolfError(f"no {key} from rank 0 within {wait_seconds:g} s: {first_line(exc)}") from None
    return store.get(key).decode()
