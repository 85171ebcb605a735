"""Every validation token's loss written to a file (`eval --save-token-losses`; not a training run's)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.common.files import write_atomic
from core.eval.bpb import BPBMeter, EvalData, Progress
from core.eval.score import Evaluator

if TYPE_CHECKING:
    from core.model.backend import Backend


def save_token_losses(
    backend: Backend, data: EvalData, evaluator: Evaluator, path: Path, progress: Progress | None = None
) -> BPBMeter:
    """Score with `evaluator` and write each target's loss in nats (`losses`, float32) and its bytes
    (`bytes`, int64) in stream order to the .npz file `path` (rank 0); entry 0 is the first token,
    never a target (NaN, 0 bytes). Their sums are the score's nats and bytes."""
    sink = np.full(len(data.tokens), np.nan, dtype=np.float32)
    meter = evaluator(backend, data, progress, sink)
    scored = ~np.isnan(sink)  # this rank's targets; the ranks' sets do not overlap
    losses = backend.all_reduce_sum(np.where(scored, sink, 0.0))
    count = backend.all_reduce_sum(scored.astype(np.float64))
    if backend.rank == 0:
        table = np.where(count > 0, losses, np.nan).astype(np.float32)
        nbytes = np.where(count > 0, data.target_bytes, 0)
        buffer = io.BytesIO()
        np.savez(buffer, losses=table, bytes=nbytes)
        write_atomic(path, buffer.getvalue())
    return meter
