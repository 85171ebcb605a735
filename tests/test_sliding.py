"""Sliding-window evaluation: the window plan, the scorer, and the 2026-04-01 record's own result."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.common.errors import PgolfError
from core.config.fields import Config
from core.config.presets import preset
from core.data.tables import ByteTables, byte_tables, stream_bytes, token_bytes
from core.data.tokenizer import load_tokenizer
from core.eval.bpb import BPBMeter
from core.eval.sliding import (
    SlidingEval,
    batch_arrays,
    plan_windows,
    rank_windows,
    score_sliding,
    window_batches,
)
from tests.golden_data import goldens


def scored_targets(plan) -> np.ndarray:
    """Every target index (into tokens[1:]) the plan scores, with repeats."""
    return np.concatenate(
        [np.arange(s + f, s + n) for s, n, f in zip(plan.starts, plan.lengths, plan.score_from, strict=True)]
        or [np.zeros(0, np.int64)]
    )


@settings(max_examples=300, deadline=None)
@given(total=st.integers(0, 400), seq_len=st.integers(1, 70), data=st.data())
def test_every_target_is_scored_exactly_once(total, seq_len, data):
    stride = data.draw(st.integers(1, seq_len))
    plan = plan_windows(total, seq_len, stride)
    assert np.array_equal(np.bincount(scored_targets(plan), minlength=total), np.ones(total, np.int64))
    # The record's corrected rule, literally (it has no window at all for total <= seq_len - stride);
    # windows hold at most seq_len tokens and keep their context.
    if total > seq_len - stride:
        assert plan.starts.tolist() == [ws for ws in range(0, total, stride) if ws + seq_len - stride < total]
    else:
        assert plan.starts.tolist() == ([0] if total else [])
    assert (plan.lengths <= seq_len).all() and (plan.lengths > plan.score_from).all()
    assert (plan.score_from[1:] == seq_len - stride).all() and (plan.score_from[:1] == 0).all()
    assert (plan.lengths[:-1] == seq_len).all()  # only the last window may be short


def test_the_old_rule_scored_the_tail_twice():
    """Before 2026-04-01, every start with a token kept its window, and short ones scored their last `stride`."""
    total, seq_len, stride = 170, 64, 16
    old = [ws for ws in range(0, total, stride) if min(ws + seq_len, total) - ws >= 1]
    counts = np.zeros(total, np.int64)
    for ws in old:
        wlen = min(ws + seq_len, total) - ws
        s = 0 if ws == 0 else max(wlen - stride, 0)
        counts[ws + s : ws + wlen] += 1
    assert counts.max() > 1
    assert (np.bincount(scored_targets(plan_windows(total, seq_len, stride)), minlength=total) == 1).all()


def test_ranks_take_contiguous_runs():
    plan = plan_windows(1000, 64, 16)
    for world in (1, 2, 3, 7):
        parts = [rank_windows(plan, r, world) for r in range(world)]
        assert np.array_equal(np.concatenate([p.starts for p in parts]), plan.starts)
        assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1


def test_batches_and_arrays():
    tokens = np.arange(100, 171, dtype=np.int64)  # 71 tokens: 70 targets
    plan = plan_windows(70, 32, 8)  # starts 0..40: 40 + 24 < 70, 48 + 24 is not
    batches = list(window_batches(plan, 4))
    assert [len(b) for b in batches] == [4, 2] and batches[-1].starts.tolist() == [32, 40]
    assert batches[-1].lengths.tolist() == [32, 30] and batches[-1].score_from.tolist() == [24, 24]
    x, y = batch_arrays(tokens, batches[-1], 32)
    assert x.dtype == y.dtype == np.int64 and x.shape == (2, 32)
    assert x[0].tolist() == list(range(132, 164)) and y[0].tolist() == list(range(133, 165))
    assert x[1, :30].tolist() == list(range(140, 170)) and y[1, :30].tolist() == list(range(141, 171))
    assert (x[1, 30:] == 0).all() and (
        y[1, 30:] == 0
    ).all()  # past the end of the tokens: 0, as the record pads


def test_settings():
    """The window settings come from a validated Config (its checks refuse a stride past the window,
    and batches of no window), so SlidingEval takes them as they are."""

    def slides(stride):
        return Config(eval_stride=stride, eval_seq_len=2048).sliding_eval

    assert slides(64) and not slides(0) and not slides(2048)
    for change, match in [
        ({"eval_stride": 65}, r"eval_stride=65 is longer than the evaluation window \(64\)"),
        ({"eval_batch_seqs": 0}, "eval_batch_seqs must be positive"),
        ({"ttt_batch_seqs": 0}, "ttt_batch_seqs must be positive"),
        ({"eval_seq_len": -1}, "eval_seq_len must be >= 0"),
    ]:
        with pytest.raises(PgolfError, match=match):
            preset("smoke").replace(**change).validate()


# ------------------------------------------------------------- a numpy toy model
VOCAB = 50


def toy_tables() -> ByteTables:
    rng = np.random.default_rng(1)
    boundary = np.zeros(VOCAB, bool)
    boundary[:2] = True
    return ByteTables(rng.integers(1, 5, VOCAB).astype(np.int16), rng.random(VOCAB) < 0.5, boundary)


class ToyModel:
    """Logits at position t from an exponentially decaying average of the inputs so far: context matters."""

    def __init__(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.emb = rng.normal(0, 1, (VOCAB, 8))
        self.out = rng.normal(0, 1, (8, VOCAB))
        self.calls: list[tuple[int, int]] = []

    def __call__(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        self.calls.append(x.shape)
        h = np.zeros((x.shape[0], 8))
        nll = np.zeros(x.shape, np.float32)
        for t in range(x.shape[1]):
            h = 0.8 * h + self.emb[x[:, t]]
            logits = h @ self.out
            logits -= logits.max(axis=1, keepdims=True)
            logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
            nll[:, t] = -logp[np.arange(len(x)), y[:, t]]
        return nll


def non_overlapping(tokens: np.ndarray, model: ToyModel, tables: ByteTables, seq_len: int) -> BPBMeter:
    meter = BPBMeter()
    for s in range(0, len(tokens) - 1, seq_len):
        x, y = tokens[s : s + seq_len][None], tokens[s + 1 : s + seq_len + 1][None]
        x = x[:, : y.shape[1]]
        meter.nats += float(model(x, y).astype(np.float64).sum())
        meter.count_bytes(token_bytes(x, y, tables))
    return meter


@pytest.fixture(scope="module")
def toy_tokens() -> np.ndarray:
    return np.random.default_rng(2).integers(0, VOCAB, 3 * 48 + 1).astype(np.int64)


def test_stride_equal_to_seq_len_is_the_plain_evaluation(toy_tokens):
    tables, model = toy_tables(), ToyModel()
    got = score_sliding(
        toy_tokens, model, stream_bytes(toy_tokens, tables), SlidingEval(48, 48, batch_seqs=2)
    )
    expected = non_overlapping(toy_tokens, model, tables, 48)
    assert (got.tokens, got.nbytes) == (expected.tokens, expected.nbytes) == (144, expected.nbytes)
    assert got.nats == pytest.approx(expected.nats, rel=1e-12)
    # A stride below seq_len gives the later tokens more context: a different (here lower) loss.
    sliding = score_sliding(
        toy_tokens, model, stream_bytes(toy_tokens, tables), SlidingEval(48, 8, batch_seqs=5)
    )
    assert (sliding.tokens, sliding.nbytes) == (got.tokens, got.nbytes)
    assert sliding.nats != pytest.approx(got.nats, rel=1e-6)


def test_ranks_and_batches_add_up(toy_tokens):
    tables, model = toy_tables(), ToyModel()
    tokens = toy_tokens[:130]  # 129 targets: a short last window
    ev = SlidingEval(32, 8, batch_seqs=4)
    whole = score_sliding(tokens, model, stream_bytes(tokens, tables), ev)
    assert whole.tokens == 129
    for world in (2, 3):
        parts = [
            score_sliding(tokens, model, stream_bytes(tokens, tables), ev, rank=r, world_size=world)
            for r in range(world)
        ]
        total = sum(p.as_array() for p in parts)
        assert total[1:].tolist() == whole.as_array()[1:].tolist()
        assert total[0] == pytest.approx(whole.nats, rel=1e-12)
    model.calls.clear()
    one_by_one = score_sliding(tokens, model, stream_bytes(tokens, tables), SlidingEval(32, 8, batch_seqs=1))
    assert set(model.calls) == {(1, 32)} and one_by_one.nats == pytest.approx(whole.nats, rel=1e-12)


def test_scored_bytes_follow_the_tables(toy_tokens):
    """Each target's bytes count once: the total is what BPB over all targets counts."""
    tables = toy_tables()
    meter = score_sliding(
        toy_tokens, ToyModel(), stream_bytes(toy_tokens, tables), SlidingEval(40, 12, batch_seqs=3)
    )
    assert (
        meter.nbytes == token_bytes(toy_tokens[:-1], toy_tokens[1:], tables).sum()
        and meter.tokens == len(toy_tokens) - 1
    )


def test_scored_bytes_are_the_given_bytes_of_each_target(toy_tokens):
    """Bytes given per stream position (a CaseOps sidecar) are counted at the scored targets' positions:
    position 0, never a target, is never read; every other position once, over ranks."""
    given = np.random.default_rng(3).integers(0, 1000, toy_tokens.size)
    given[0] = 10**9
    ev = SlidingEval(40, 12, batch_seqs=3)
    parts = [score_sliding(toy_tokens, ToyModel(), given, ev, rank=r, world_size=2) for r in range(2)]
    assert (
        sum(p.nbytes for p in parts) == given[1:].sum()
        and sum(p.tokens for p in parts) == toy_tokens.size - 1
    )


# ---------------------------------------------------- the record's own evaluation
def test_the_records_sliding_evaluation(challenge_dir):
    """The record's eval_val_sliding on its tiny model (goldens): our plan, scorer and byte count give its numbers.

    The per-window losses are the record model's (stored by the goldens' script); the
    windows, padding, scored positions, sums, bytes and ratios are ours. Tolerance: the
    float64 sums run in another order (about 1e-15 relative).
    """
    g, meta = goldens()
    ev_meta = meta["eval"]
    tables = byte_tables(load_tokenizer(challenge_dir / "fineweb_1024_bpe.model"), 1024)
    rows = {x.tobytes(): nll for x, nll in zip(g["eval/window_x"], g["eval/window_nll"], strict=True)}
    seen = []

    def record_losses(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        seen.append(len(x))
        return np.stack([rows[row.tobytes()] for row in x])  # a KeyError if our windows were not the record's

    ev = SlidingEval(ev_meta["seq_len"], ev_meta["stride"], ev_meta["batch_seqs"])
    meter = score_sliding(g["eval/tokens"], record_losses, stream_bytes(g["eval/tokens"], tables), ev)
    assert seen == [3, 3, 2] and meter.tokens == len(g["eval/tokens"]) - 1 == 170
    assert meter.val_loss == pytest.approx(ev_meta["val_loss"], rel=1e-12, abs=0)
    assert meter.val_bpb == pytest.approx(ev_meta["val_bpb"], rel=1e-12, abs=0)
    # The bytes the record counted, recovered from its two numbers, are ours exactly.
    record_bytes = ev_meta["val_loss"] / math.log(2) * meter.tokens / ev_meta["val_bpb"]
    assert record_bytes == pytest.approx(meter.nbytes, abs=1e-6)
