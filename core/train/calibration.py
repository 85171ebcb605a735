"""GPTQ's calibration in a training run: the Hessians, read from the start of the training stream, and
the record of what they read (a module of its own: only runs with GPTQ, or an artifact fit, use it; see
FEATURES in core/config/features.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.common.files import write_atomic
from core.config.fields import Config
from core.data.shards import find_shards

if TYPE_CHECKING:
    from core.data.coprime import CoprimeLoader
    from core.data.sequential import BatchLoader
    from core.model.backend import Backend


def write_calibration(artifact: Path, cfg: Config, fit_shards: Sequence[Path]) -> Path:
    """Beside the artifact (`.calibration.json`): the files its calibration read, GPTQ's Hessians and the
    artifact fit's scoring (`fit_shards`, when there was a fit), by name, for `audit` to check."""
    record = {
        "data_path": str(cfg.data_path),
        "gptq_shards": [p.name for p in find_shards(cfg.data_path, "train")],
        "gptq_batches": cfg.gptq_calibration_batches,
        "fit_shards": [Path(p).name for p in fit_shards],
    }
    return write_atomic(
        artifact.with_suffix(".calibration.json"), (json.dumps(record, indent=1) + "\n").encode()
    )


def calibrate_gptq(
    backend: Backend, loader: BatchLoader | CoprimeLoader, log: Callable[[str], None]
) -> dict[str, np.ndarray]:
    """GPTQ's Hessians: `gptq_calibration_batches` training micro-batches per rank, read from the start
    of the training stream (`loader`, at its start: core.train.loop's `train_loader`), through the backend's
    `input_hessians`; the mean over every rank's batches,
    and a line to `log` on how long it took."""
    cfg = backend.cfg
    t0 = time.perf_counter()
    accum = cfg.local_accum_steps(backend.world_size)
    batches = (
        loader.next_batch(cfg.train_batch_tokens, cfg.train_seq_len, accum)
        for _ in range(cfg.gptq_calibration_batches)
    )
    count = cfg.gptq_calibration_batches * backend.world_size
    hessians = {
        name: (backend.all_reduce_sum(h.astype(np.float64).ravel()) / count)
        .astype(np.float32)
        .reshape(h.shape)
        for name, h in sorted(backend.input_hessians(batches).items())
    }
    log(f"gptq:collected {len(hessians)} Hessians from {count} batches in {time.perf_counter() - t0:.1f}s")
    return hessians
