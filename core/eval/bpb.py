"""Bits per byte: cross-entropy in bits divided by the UTF-8 bytes the tokens stand for."""

from __future__ import annotations

import math

import numpy as np


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
