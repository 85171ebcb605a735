"""The plain figure (no sliding windows, no test-time training), by either protocol of `eval_protocol`:
`evaluate` over rows (pgolf's own: non-overlapping sequences of `eval_window` tokens, each scored as its
own sequence), `evaluate_flat` in flat batches (record 2026-04-27's `eval_val`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.common.errors import PgolfError, memory_hint
from core.data.shards import val_spans
from core.eval.bpb import BPBMeter
from core.eval.sliding import SlidingEval, evaluate_windows

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


def evaluate_flat(
    backend: Backend, data: EvalData, progress: Progress | None = None, sink: np.ndarray | None = None
) -> BPBMeter:
    """val_loss and val_bpb as record 2026-04-27's `eval_val` computes them: each rank takes its share
    of the sequences of `eval_window` tokens, as `evaluate` does, keeps only whole
    batches of val_batch_size / grad_accum_steps tokens (the record's VAL_BATCH_TOKENS / (WORLD_SIZE x
    GRAD_ACCUM_STEPS): pgolf's grad_accum_steps counts the micro-batches of all ranks), and scores each
    batch as ONE sequence: RoPE positions run over the whole batch, and attention is cut at each BOS and
    every `eval_window` tokens from a document's start (or the batch's). Losses are summed in float64.
    `sink` (one float per token) receives each target's loss at its stream position."""
    cfg = backend.cfg
    seq = cfg.eval_window
    batch_seqs = cfg.val_batch_size // cfg.grad_accum_steps // seq  # Config.validate: at least one
    spans = val_spans(len(data.tokens), seq, batch_seqs, backend.rank, backend.world_size, whole=True)
    meter = BPBMeter()
    with backend.segments_every(seq):
        for i, (start, end) in enumerate(spans):
            chunk = data.tokens[start:end].astype(np.int32)
            losses = backend.token_losses(chunk[None, :-1], chunk[None, 1:])[0]
            meter.add(losses, slice(start + 1, end), data.target_bytes, sink)
            if progress is not None:
                progress(i + 1, len(spans))
    total = BPBMeter.from_array(backend.all_reduce_sum(meter.as_array()))
    if total.tokens == 0:
        raise PgolfError(
            f"eval_protocol=flat: {len(data.tokens):,} validation tokens hold no whole batch of "
            f"{batch_seqs * seq:,} tokens (val_batch_size / grad_accum_steps) on any of {backend.world_size} "
            "rank(s): lower val_batch_size (VAL_BATCH_TOKENS)"
        )
    return total
