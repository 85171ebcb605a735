"""Full-mode test-time training (`ttt_mode = "full"`, records 2026-04-06 to 04-09), packaged only for
the runs that use it: the validation stream is cut into chunks of `ttt_chunk_tokens`; the sliding
windows whose scored part starts in a chunk are scored, then every weight trains on the chunk by SGD
(`ttt_lr` cosine over the chunks, `ttt_epochs`, `ttt_momentum`). core/eval/ttt.py runs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from core.eval.bpb import BPBMeter
from core.eval.sliding import SlidingEval, plan_windows, rank_windows, score_windows
from core.eval.ttt import cosine, sgd_over

if TYPE_CHECKING:  # only annotations name these
    from core.eval.score import EvalData, Progress
    from core.model.backend import Backend


def score_full(
    backend: Backend, data: EvalData, progress: Progress | None, token_losses: np.ndarray | None
) -> BPBMeter:
    """The full mode: the stream cut into chunks of `ttt_chunk_tokens`; the sliding windows (the evaluation's
    window and stride) whose scored part starts in chunk c are scored, then, unless c is the last chunk,
    every weight (but the first `ttt_freeze_blocks` blocks') trains on chunk c by SGD with momentum, its
    learning rate cosine over the chunks. This rank's sums."""
    cfg = backend.cfg
    tokens = np.asarray(data.tokens)
    total, size, seq = len(tokens) - 1, cfg.ttt_chunk_tokens, cfg.eval_window
    ev = SlidingEval(seq, cfg.eval_stride if cfg.sliding_eval else seq, cfg.ttt_batch_seqs)
    plan = plan_windows(total, seq, ev.stride)
    chunks = -(-total // size)
    chunk_of = np.minimum((plan.starts + plan.score_from) // size, chunks - 1)
    frozen = tuple(f"blocks.{i}." for i in range(min(cfg.ttt_freeze_blocks, cfg.num_layers)))
    ttt = backend.ttt()
    ttt.sgd_reset(cfg.ttt_momentum, frozen)
    meter = BPBMeter()
    for c in range(chunks):
        windows = rank_windows(plan[chunk_of == c], backend.rank, backend.world_size)
        score_windows(meter, tokens, backend.token_losses, data.target_bytes, windows, ev, sink=token_losses)
        if c < chunks - 1:
            lr = cosine(cfg.ttt_lr, c, chunks - 1)
            span = tokens[c * size : (c + 1) * size + 1]
            sgd_over(
                backend, ttt, span, lr, cfg.ttt_epochs, cfg.ttt_batch_seqs, cfg.ttt_grad_clip, doc_mask=True
            )
        if progress is not None:
            progress(c + 1, chunks)
    return meter
