"""The coprime loader's position as a checkpoint keeps it (`CoprimeLoader.state`), apart from the
loader: a training run never takes it, only saving a resumable checkpoint does (core/train/interactive.py);
core/artifact/load.py puts it back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only annotations name it
    from core.data.coprime import CoprimeLoader

CURSORS = ("phase", "blocks", "next", "start", "stride", "active")  # CoprimeLoader's per-shard arrays


def coprime_state(loader: CoprimeLoader) -> dict[str, Any]:
    """Everything a resume needs, JSON-safe; the same on every rank (the windows are global)."""
    rng = loader.rng.bit_generator.state
    return {
        "loader": "coprime",
        "seed": str(loader.seed),
        "shards": len(loader.files),
        "seq_len": loader.seq_len,
        "calls": loader.calls,
        # PCG64's 128-bit state and inc as decimal strings: JSON readers other than Python's lose their digits.
        "rng": {key: str(value) for key, value in rng["state"].items()}
        | {"has_uint32": rng["has_uint32"], "uinteger": rng["uinteger"]},
        "cursors": {key: getattr(loader, key).tolist() for key in CURSORS},
    }
