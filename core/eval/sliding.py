"""Sliding-window evaluation: which windows, how they are scored (framework-neutral), and the
figure over a backend's ranks (`evaluate_sliding`). Imported only by the runs that use it.

The settings (the records' environment variables):
- EVAL_SEQ_LEN (`seq_len`): tokens in each window, context plus scored ones;
- EVAL_STRIDE (`stride`): how far each window moves on, and how many tokens it
  scores. Sliding evaluation is used when 0 < stride < seq_len; stride == seq_len
  gives the plain evaluation over non-overlapping sequences, with the same result;
- EVAL_BATCH_SEQS (`batch_seqs`): windows per forward pass on each rank: speed and
  memory only, the result is the same up to float rounding.

With N = len(tokens) - 1 targets, windows start at 0, stride, 2*stride, ... The
first window scores all its tokens; each later one only its last `stride` (the ones
before are context), so every target is scored exactly once and with at least
seq_len - stride tokens of context. The windows are split over ranks in contiguous
runs and each rank's run is cut into batches; a rank's result is a BPBMeter (sums of
nats, tokens and bytes) to be added up across ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from core.common.errors import memory_hint
from core.eval.bpb import BPBMeter

if TYPE_CHECKING:  # only annotations name these
    from core.eval.bpb import EvalData, Progress
    from core.model.backend import Backend

TokenLosses = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (x, y) int64 (B, T) -> NLL in nats (B, T)


@dataclass(frozen=True)
class SlidingEval:
    seq_len: int  # EVAL_SEQ_LEN: tokens per window (context + scored)
    stride: int  # EVAL_STRIDE: tokens each window advances by and scores
    batch_seqs: int  # EVAL_BATCH_SEQS: windows per forward pass on each rank


def plan_windows(total_tokens: int, seq_len: int, stride: int) -> np.recarray:
    """The windows over `total_tokens` targets (tokens[1:] predicted from tokens[:-1]): a record array
    (sliced and indexed as any array), one int64 record per window: `starts`, the index of its first
    input token; `lengths`, its tokens (seq_len, fewer only at the end); `score_from`, its first scored
    position."""
    context = seq_len - stride
    # The corrected rule (record 2026-04-01): a start ws is used only while
    # ws + seq_len - stride < total_tokens, i.e. while it has a target of its own to score.
    # The earlier records kept every start with at least one token, so the short windows
    # at the end scored their last `stride` targets a second time. The first window scores
    # from 0, so it is kept whenever there is a target (the record drops it, and scores
    # nothing, when total_tokens <= seq_len - stride).
    starts = np.arange(0, max(total_tokens, 0), stride, dtype=np.int64)
    starts = starts[(starts == 0) | (starts + context < total_tokens)]
    lengths = np.minimum(starts + seq_len, total_tokens) - starts
    score_from = np.where(starts == 0, 0, context).astype(np.int64)
    return np.rec.fromarrays([starts, lengths, score_from], names=["starts", "lengths", "score_from"])


def rank_windows(plan: np.recarray, rank: int, world_size: int) -> np.recarray:
    """This rank's contiguous run of windows: [n*rank // world, n*(rank+1) // world)."""
    n = len(plan)
    return plan[n * rank // world_size : n * (rank + 1) // world_size]


def window_batches(plan: np.recarray, batch_seqs: int) -> Iterator[np.recarray]:
    for i in range(0, len(plan), batch_seqs):
        yield plan[i : i + batch_seqs]


def batch_arrays(tokens: np.ndarray, batch: np.recarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets (B, seq_len) int64; positions past a short window's end are 0."""
    pos = np.arange(seq_len, dtype=np.int64)
    inside = pos[None, :] < batch.lengths[:, None]
    index = np.where(inside, batch.starts[:, None] + pos[None, :], 0)
    x = np.where(inside, tokens[index], 0).astype(np.int64)
    y = np.where(inside, tokens[index + 1], 0).astype(np.int64)
    return x, y


def score_sliding(
    tokens: np.ndarray,
    token_losses: TokenLosses,
    target_bytes: np.ndarray,
    ev: SlidingEval,
    rank: int = 0,
    world_size: int = 1,
    progress: Callable[[int, int], None] | None = None,
    sink: np.ndarray | None = None,
) -> BPBMeter:
    """This rank's sums of nats, scored tokens and their bytes (a BPBMeter; add them over ranks).

    `token_losses(x, y)` returns the per-token NLL in nats, shape (B, seq_len), for
    int64 inputs and targets of shape (B, seq_len); `target_bytes[i]` is the bytes tokens[i] adds
    as a target (EvalData.target_bytes); `progress(done, total)` follows the batches;
    `sink` (one float per token) receives each scored target's loss at its stream position.
    The arguments are taken as EvalData and the backends make them (1-D integer tokens, one byte
    count per token, losses shaped as their inputs), the rank as the backend's: nothing here re-checks them.
    """
    tokens = np.asarray(tokens)
    plan = rank_windows(plan_windows(tokens.size - 1, ev.seq_len, ev.stride), rank, world_size)
    meter = BPBMeter()
    score_windows(meter, tokens, token_losses, target_bytes, plan, ev, progress, sink)
    return meter


def score_windows(
    meter: BPBMeter,
    tokens: np.ndarray,
    token_losses: TokenLosses,
    target_bytes: np.ndarray,
    windows: np.recarray,
    ev: SlidingEval,
    progress: Callable[[int, int], None] | None = None,
    sink: np.ndarray | None = None,
) -> None:
    """Add to `meter` the scored targets of `windows`, `ev.batch_seqs` at a time (score_sliding's arguments)."""
    pos = np.arange(ev.seq_len)
    total = -(-len(windows) // ev.batch_seqs)
    for i, batch in enumerate(window_batches(windows, ev.batch_seqs)):
        x, y = batch_arrays(tokens, batch, ev.seq_len)
        nll = np.asarray(token_losses(x, y))
        scored = (pos[None, :] >= batch.score_from[:, None]) & (pos[None, :] < batch.lengths[:, None])
        positions = (batch.starts[:, None] + pos[None, :] + 1)[scored]
        meter.add(nll[scored], positions, target_bytes, sink)
        if progress is not None:
            progress(i + 1, total)


def evaluate_sliding(
    backend: Backend, data: EvalData, progress: Progress | None = None, sink: np.ndarray | None = None
) -> BPBMeter:
    """val_loss and val_bpb with sliding windows (`eval_stride`), split over ranks."""
    cfg = backend.cfg
    ev = SlidingEval(cfg.eval_window, cfg.eval_stride, cfg.eval_batch_seqs)
    with memory_hint("the sliding-window score", "--eval-batch-seqs"):
        return evaluate_windows(backend, data, ev, progress, sink)


def evaluate_windows(
    backend: Backend, data: EvalData, ev: SlidingEval, progress: Progress | None, sink: np.ndarray | None
) -> BPBMeter:
    """The windows of `ev` over the validation tokens, this rank's share, summed over the ranks."""
    meter = score_sliding(
        data.tokens,
        backend.token_losses,
        data.target_bytes,
        ev,
        backend.rank,
        backend.world_size,
        progress,
        sink,
    )
    return BPBMeter.from_array(backend.all_reduce_sum(meter.as_array()))
