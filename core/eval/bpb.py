"""Bits per byte: cross-entropy in bits divided by the UTF-8 bytes the tokens stand for."""

from __future__ import annotations

import math

import numpy as np

from core.common.errors import PgolfError
from core.data.tokenizer import ByteTables


def token_bytes(prev_ids: np.ndarray, target_ids: np.ndarray, tables: ByteTables) -> np.ndarray:
    """Bytes of text each target token adds, given the token before it."""
    prev, target = np.asarray(prev_ids).reshape(-1), np.asarray(target_ids).reshape(-1)
    space = tables.has_leading_space[target] & ~tables.is_boundary[prev]
    return tables.base_bytes[target].astype(np.int64) + space


def stream_bytes(tokens: np.ndarray, tables: ByteTables) -> np.ndarray:
    """int64 bytes each position of a token stream adds as a target, by the tokenizer's tables:
    index i counts tokens[i] after tokens[i - 1]; index 0, never a target, counts 0."""
    tokens = np.asarray(tokens).reshape(-1)
    out = np.zeros(tokens.size, dtype=np.int64)
    out[1:] = token_bytes(tokens[:-1], tokens[1:], tables)
    return out


class BPBMeter:
    """float64 sums of nats, tokens and bytes; mergeable across ranks as a 3-vector.

    The bytes come from the tokenizer's tables (`add`, `count`: those need `tables`) or are given
    per target (`count_bytes`: what the evaluators pass, from EvalData.target_bytes).
    """

    def __init__(self, tables: ByteTables | None = None):
        self.tables = tables
        self.nats = self.tokens = self.nbytes = 0.0

    def add(self, nll_sum: float, prev_ids: np.ndarray, target_ids: np.ndarray) -> None:
        self.nats += float(nll_sum)
        self.count(prev_ids, target_ids)

    def count(self, prev_ids: np.ndarray, target_ids: np.ndarray) -> None:
        """The tokens and their bytes alone: host numpy, while the device computes their loss."""
        self.count_bytes(token_bytes(prev_ids, target_ids, self.tables))

    def count_bytes(self, target_bytes: np.ndarray) -> None:
        """Targets whose bytes are given, one entry each."""
        self.tokens += float(np.size(target_bytes))
        self.nbytes += float(np.sum(target_bytes, dtype=np.int64))

    def as_array(self) -> np.ndarray:
        return np.array([self.nats, self.tokens, self.nbytes], dtype=np.float64)

    @classmethod
    def from_array(cls, tables: ByteTables | None, values: np.ndarray) -> BPBMeter:
        meter = cls(tables)
        meter.nats, meter.tokens, meter.nbytes = (float(v) for v in values)
        return meter

    @property
    def val_loss(self) -> float:
        """Mean cross-entropy in nats per token."""
        return self.nats / self.tokens if self.tokens else math.nan

    @property
    def val_bpb(self) -> float:
        return self.nats / math.log(2.0) / self.nbytes if self.nbytes else math.nan

    def require_finite(self, what: str) -> BPBMeter:
        """self, or a PgolfError naming `what` when the score is not a finite number."""
        if not (math.isfinite(self.val_loss) and math.isfinite(self.val_bpb)):
            raise PgolfError(
                f"{what}: the score is not finite (val_loss {self.val_loss}, val_bpb {self.val_bpb}): "
                "the weights give NaN or infinite losses"
            )
        return self
