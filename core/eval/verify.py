"""Score one set of weights with every available backend and check that they agree.

Both backends evaluate the same validation tokens in fp32 with every evaluator the config asks for
(non-overlapping sequences; sliding windows with `eval_stride`; test-time training with
`ttt_enabled`) and compute logits on the same fixed batch. They agree when each val_bpb differs by
at most its tolerance and the logits by at most `LOGIT_TOLERANCE` (absolute). The plain and sliding
bounds are a few hundred times fp32 round-off for the models pgolf trains; test-time training
takes thousands of optimizer steps whose round-off compounds (Adam's first steps move each weight
by about its learning rate whatever the gradient's size), so its bound is ten times wider.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from core.common.errors import PgolfError
from core.config.fields import Config
from core.eval.bpb import BPBMeter, EvalData
from core.eval.score import evaluators
from core.model.backend import Backend

BPB_TOLERANCE = 1e-5
TTT_BPB_TOLERANCE = 1e-4
LOGIT_TOLERANCE = 1e-3


def require_finite(meter: BPBMeter, what: str) -> BPBMeter:
    """`meter`, or a PgolfError naming `what` when its score is not a finite number."""
    if not (math.isfinite(meter.val_loss) and math.isfinite(meter.val_bpb)):
        raise PgolfError(
            f"{what}: the score is not finite (val_loss {meter.val_loss}, val_bpb {meter.val_bpb}): "
            "the weights give NaN or infinite losses"
        )
    return meter


def bpb_tolerance(kind: str) -> float:
    """How far two backends' val_bpb of evaluator `kind` may differ."""
    return TTT_BPB_TOLERANCE if kind == "ttt" else BPB_TOLERANCE


@dataclass
class BackendScore:
    backend: str
    device: str
    tokens: int
    figures: dict[
        str, tuple[float, float]
    ]  # evaluator ("plain", "sliding_window", "ttt") -> val_loss, val_bpb
    logits: np.ndarray  # (B, T, V) on the fixed batch


@dataclass
class Verdict:
    scores: list[BackendScore]
    bpb_diffs: dict[str, float]  # evaluator -> the largest val_bpb difference between backends
    max_logit_diff: float

    @property
    def agree(self) -> bool:
        within = all(diff <= bpb_tolerance(kind) for kind, diff in self.bpb_diffs.items())
        return within and self.max_logit_diff <= LOGIT_TOLERANCE


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
                kind: require_finite(evaluator(backend, data, None), f"the {name} backend's {kind} score")
                for kind, evaluator in evaluators(cfg).items()
            }
            figures = {kind: (m.val_loss, m.val_bpb) for kind, m in meters.items()}
            backend.load_params(params)  # test-time training's phases train the weights
            tokens = int(meters["plain"].tokens)
            scores.append(BackendScore(name, backend.device, tokens, figures, backend.logits(x)))
        finally:
            backend.close()
    diffs = {
        kind: max(s.figures[kind][1] for s in scores) - min(s.figures[kind][1] for s in scores)
        for kind in (scores[0].figures if scores else {})
    }
    logit_diff = max(
        (float(np.max(np.abs(a.logits - b.logits))) for a in scores for b in scores if a is not b),
        default=0.0,
    )
    return Verdict(scores=scores, bpb_diffs=diffs, max_logit_diff=logit_diff)
