"""Test-time training for the tests: its legal setting on the smoke model, a stream of documents, byte
tables of one byte a token, and a stand-in that adapts on a chunk before scoring it (the illegal order)."""

from __future__ import annotations

import numpy as np

from core.config.presets import preset
from core.data.tables import ByteTables

LEGAL_CFG = preset("smoke").replace(
    ttt_enabled=True, ttt_lora_rank=4, ttt_lora_alpha=8.0, ttt_lora_lr=0.01, ttt_chunk_size=8,
    ttt_eval_seq_len=24, ttt_batch_size=3, ttt_grad_steps=2, phased_ttt_prefix_docs=4,
    phased_ttt_num_phases=1, global_ttt_lr=0.05, global_ttt_chunk_tokens=32, global_ttt_batch_seqs=2,
    eval_seq_len=16,
)  # fmt: skip


def stream(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lengths = (5, 40, 17, 3, 60, 25, 9, 33)
    return np.concatenate([np.concatenate([[1], rng.integers(2, 1024, size=n)]) for n in lengths]).astype(
        np.int32
    )


def unit_tables(vocab: int) -> ByteTables:
    return ByteTables(np.ones(vocab, np.int16), np.zeros(vocab, bool), np.zeros(vocab, bool))


class AdaptsFirst:
    """A backend's `TTT` whose adapters train on a chunk before it is scored."""

    def __init__(self, ttt):
        self.inner = ttt

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def score_then_adapt(self, adapters, x, y, train_rows, train_from, train_len):
        self.inner.score_then_adapt(adapters, x, y, train_rows | True, train_from, train_len)
        return self.inner.score_then_adapt(adapters, x, y, train_rows, train_from, train_len)
