"""Score one set of weights with every available backend and check that they agree.

Both backends evaluate the same validation tokens in fp32 (over non-overlapping
sequences and, when `eval_stride` is set, with sliding windows) and compute logits on
the same fixed batch. They agree when each val_bpb differs by at most
`BPB_TOLERANCE` and the logits by at most `LOGIT_TOLERANCE` (absolute); both
bounds are a few hundred times fp32 round-off for the models pgolf trains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from core.config.fields import Config
from core.eval.score import EvalData, evaluators
from core.model.backend import Backend

BPB_TOLERANCE = 1e-5
LOGIT_TOLERANCE = 1e-3


@dataclass
class BackendScore:
    backend: str
    device: str
    tokens: int
    val_loss: float
    val_bpb: float
    logits: np.ndarray  # (B, T, V) on the fixed batch
    sliding_val_loss: float | None = None  # with sliding windows, when eval_stride asks for them
    sliding_val_bpb: float | None = None


@dataclass
class Verdict:
    scores: list[BackendScore]
    max_bpb_diff: float
    max_logit_diff: float

    @property
    def agree(self) -> bool:
        return self.max_bpb_diff <= BPB_TOLERANCE and self.max_logit_diff <= LOGIT_TOLERANCE


def fixed_batch(data: EvalData, cfg: Config, seqs: int = 2) -> np.ndarray:
    """The first `seqs` validation sequences: the batch every backend's logits are compared on."""
    n = min(seqs, (len(data.tokens) - 1) // cfg.train_seq_len)
    return data.tokens[: n * cfg.train_seq_len].astype(np.int32).reshape(n, cfg.train_seq_len)


def verify(
    params: dict[str, np.ndarray],
    cfg: Config,
    data: EvalData,
    factories: dict[str, Callable[[Config], Backend]],
) -> Verdict:
    """Evaluate `params` with each backend factory (fp32, no compile) and compare."""
    cfg = cfg.replace(compute_dtype="float32", compile="off")
    x = fixed_batch(data, cfg)
    scores = []
    for name, make in factories.items():
        backend = make(cfg)
        try:
            backend.load_params(params)
            meters = {
                kind: evaluator(backend, data, None).require_finite(f"the {name} backend's {kind} score")
                for kind, evaluator in evaluators(cfg).items()
            }
            plain, sliding = meters["plain"], meters.get("sliding_window")
            scores.append(
                BackendScore(
                    name, backend.device, int(plain.tokens), plain.val_loss, plain.val_bpb, backend.logits(x),
                    sliding.val_loss if sliding else None, sliding.val_bpb if sliding else None,
                )
            )  # fmt: skip
        finally:
            backend.close()
    diffs = [
        max(values) - min(values)
        for values in ([s.val_bpb for s in scores], [s.sliding_val_bpb for s in scores])
        if values and None not in values
    ]
    logit_diff = max(
        (float(np.max(np.abs(a.logits - b.logits))) for a in scores for b in scores if a is not b),
        default=0.0,
    )
    return Verdict(scores=scores, max_bpb_diff=max(diffs, default=0.0), max_logit_diff=logit_diff)
