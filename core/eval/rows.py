"""The plain figure over rows (`eval_protocol` rows, pgolf's own): non-overlapping sequences of
`eval_window` tokens, each scored as its own sequence. Imported only by the runs that use it
(core/eval/score.py's `evaluators`); record 2026-04-27's protocol is core/eval/flat.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.common.errors import memory_hint
from core.data.shards import val_spans
from core.eval.bpb import BPBMeter

if TYPE_CHECKING:  # only annotations name these
    from core.eval.bpb import EvalData, Progress
    from core.model.backend import Backend


def evaluate(
    backend: Backend, data: EvalData, progress: Progress | None = None, sink: np.ndarray | None = None
) -> BPBMeter:
    """val_loss and val_bpb over non-overlapping sequences of `eval_window` tokens, split over ranks.
    `sink` (one float per token) receives each target's loss at its stream position, which costs a
    copy of every loss to the host."""
    cfg = backend.cfg
    seq = cfg.eval_window
    with memory_hint("validation", "--val-batch-size"):
        if sink is not None:  # the same windows, scored token by token
            from core.eval.sliding import SlidingEval, evaluate_windows

            ev = SlidingEval(seq, seq, max(cfg.val_batch_size // seq, 1))
            return evaluate_windows(backend, data, ev, progress, sink)
        batch_seqs = max(cfg.val_batch_size // cfg.grad_accum_steps // seq, 1)
        spans = val_spans(len(data.tokens), seq, batch_seqs, backend.rank, backend.world_size)
        meter = BPBMeter()
        nll = 0.0  # then the framework's 0-d array: the sum stays on the device
        for i, (start, end) in enumerate(spans):
            chunk = data.tokens[start:end].astype(np.int32)
            nll = nll + backend.eval_nll(chunk[:-1].reshape(-1, seq), chunk[1:].reshape(-1, seq))  # queued
            meter.count_bytes(
                data.target_bytes[start + 1 : end]
            )  # the targets' bytes, while the device works
            if progress is not None:
                progress(i + 1, len(spans))  # batches queued: the device may be a little behind
        meter.nats = float(nll)  # the one wait for the device
        return BPBMeter.from_array(backend.all_reduce_sum(meter.as_array()))
