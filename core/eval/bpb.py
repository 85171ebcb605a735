"""What every scorer shares: the validation data it scores (`EvalData`: the tokens and their bytes), the
progress it reports, and bits per byte: cross-entropy in bits divided by the UTF-8 bytes the tokens stand for.
core/eval/score.py loads the data and picks the scorer; each scorer imports these from here."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from core.data.tables import stream_bytes

if TYPE_CHECKING:  # only annotations name it
    from core.data.tables import ByteTables

Progress = Callable[[int, int], None]  # (done, total) of something long


@dataclass
class EvalData:
    """What scoring needs: the validation tokens, and what counts their bytes: the tokenizer's byte
    tables, or the byte sidecar where the data has one (each token's bytes of text: CaseOps data,
    core/datasets/caseops.py, and data whose tables would miscount, core/datasets/byte_counts.py)."""

    tokens: np.ndarray
    tables: ByteTables | None  # None with a sidecar
    sidecar: np.ndarray | None = None  # exactly one entry per token, or None: the tables count the bytes

    @cached_property
    def target_bytes(self) -> np.ndarray:
        """int64 bytes of text each token stands for as a target, by stream position: index i counts
        tokens[i] after tokens[i - 1]; index 0 (never a target) counts 0. From the sidecar when the
        data has one, else from the tables. Every evaluation adds these up for the tokens it scores,
        in whatever order it scores them."""
        if self.sidecar is None:
            return stream_bytes(self.tokens, self.tables)
        out = np.asarray(self.sidecar, dtype=np.int64).copy()
        out[:1] = 0
        return out


class BPBMeter:
    """float64 sums of nats, tokens and bytes; mergeable across ranks as a 3-vector. The bytes are given
    per target (`count_bytes`: from EvalData.target_bytes)."""

    def __init__(self) -> None:
        self.nats = self.tokens = self.nbytes = 0.0

    def count_bytes(self, target_bytes: np.ndarray) -> None:
        """Targets whose bytes are given, one entry each."""
        self.tokens += float(np.size(target_bytes))
        self.nbytes += float(np.sum(target_bytes, dtype=np.int64))

    def add(
        self,
        losses: np.ndarray,
        positions: np.ndarray | slice,
        target_bytes: np.ndarray,
        sink: np.ndarray | None,
    ) -> None:
        """Scored targets: their losses in nats, and their stream positions (an index array or a slice)
        into `target_bytes` (EvalData.target_bytes) and `sink` (one float per token, None: no sink),
        which receives each loss at its position. The losses are summed in float64."""
        self.nats += float(np.sum(losses, dtype=np.float64))
        self.count_bytes(target_bytes[positions])
        if sink is not None:
            sink[positions] = losses

    def as_array(self) -> np.ndarray:
        return np.array([self.nats, self.tokens, self.nbytes], dtype=np.float64)

    @classmethod
    def from_array(cls, values: np.ndarray) -> BPBMeter:
        meter = cls()
        meter.nats, meter.tokens, meter.nbytes = (float(v) for v in values)
        return meter

    @property
    def val_loss(self) -> float:
        """Mean cross-entropy in nats per token."""
        return self.nats / self.tokens if self.tokens else math.nan

    @property
    def val_bpb(self) -> float:
        return self.nats / math.log(2.0) / self.nbytes if self.nbytes else math.nan
