"""The shard format, the training stream, rank slicing and the validation split."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.artifact.load import restore_data_position
from core.common.errors import PgolfError
from core.config.fields import Config
from core.data.sequential import BatchLoader, TokenStream
from core.data.shards import (
    HEADER_BYTES,
    find_shards,
    load_val_tokens,
    read_shard,
    read_shard_header,
    val_spans,
)
from core.datasets.writers import write_shard


def shards(tmp_path, sizes, split="train", seed=0, vocab=1024):
    rng = np.random.default_rng(seed)
    files = []
    for i, n in enumerate(sizes):
        files.append(write_shard(tmp_path / f"fineweb_{split}_{i:06d}.bin", rng.integers(0, vocab, n)))
    return files


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 65_535), max_size=300))
def test_round_trip(tmp_path_factory, tokens):
    path = write_shard(
        tmp_path_factory.mktemp("s") / "fineweb_train_000000.bin", np.array(tokens, dtype=np.int64)
    )
    assert read_shard_header(path) == len(tokens)
    assert read_shard(path).tolist() == tokens
    assert path.stat().st_size == HEADER_BYTES + 2 * len(tokens)


def corrupt(path, offset, value):
    data = bytearray(path.read_bytes())
    data[offset : offset + 4] = np.array([value], dtype="<i4").tobytes()
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: corrupt(p, 0, 123), "bad magic 123"),
        (lambda p: corrupt(p, 4, 2), "unsupported version 2"),
        (lambda p: p.write_bytes(p.read_bytes()[:-2]), "header promises 100 tokens"),
        (lambda p: p.write_bytes(p.read_bytes() + b"\0\0"), "header promises 100 tokens"),
        (lambda p: p.write_bytes(p.read_bytes()[:100]), "shorter than the 1024-byte header"),
        (lambda p: corrupt(p, 8, -5), "header promises -5 tokens"),
    ],
)
def test_malformed_shards_name_the_file(tmp_path, damage, message):
    (path,) = shards(tmp_path, [100])
    damage(path)
    with pytest.raises(PgolfError, match=message) as info:
        read_shard(path)
    assert str(path) in str(info.value)


def test_missing_files_and_folders(tmp_path):
    with pytest.raises(PgolfError, match="does not exist"):
        find_shards(tmp_path / "nope", "train")
    with pytest.raises(PgolfError, match="no fineweb_val_"):
        find_shards(tmp_path, "val")
    with pytest.raises(PgolfError, match="cannot read"):
        read_shard(tmp_path / "fineweb_train_000000.bin")


def test_out_of_range_ids_are_refused_on_write(tmp_path):
    with pytest.raises(PgolfError, match=r"\[0, 65535\]"):
        write_shard(tmp_path / "x.bin", np.array([70_000]))


def test_vocab_mismatch_names_the_shard(tmp_path):
    files = shards(tmp_path, [50], vocab=4096)
    with pytest.raises(PgolfError, match="do not match the tokenizer vocabulary") as info:
        TokenStream(files, vocab_size=1024)
    assert files[0].name in str(info.value)


def test_stream_reads_in_order_and_wraps_with_a_warning(tmp_path, caplog):
    files = shards(tmp_path, [10, 7])
    expected = np.concatenate([read_shard(f) for f in files])
    stream = TokenStream(files)
    with caplog.at_level(logging.WARNING, logger="pgolf"):
        got = np.concatenate([stream.take(5) for _ in range(5)])  # 25 tokens: wraps after 17
    assert np.array_equal(got, np.concatenate([expected, expected[:8]]))
    assert stream.epoch == 2 and "starting epoch 2" in caplog.text


def test_rank_slices_equal_the_single_process_micro_batches(tmp_path):
    files = shards(tmp_path, [5000, 3000])
    one = BatchLoader(files, rank=0, world_size=1)
    two = [BatchLoader(files, rank=r, world_size=2) for r in range(2)]
    for _ in range(6):
        single = [one.next_batch(512, 64, accum_steps=2) for _ in range(2)]
        ranks = [loader.next_batch(512, 64, accum_steps=1) for loader in two]
        for (x1, y1), (x2, y2) in zip(single, ranks, strict=True):
            assert x1.dtype == np.int32 and x1.shape == (4, 64)
            assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
            assert np.array_equal(x1[:, 1:], y1[:, :-1])  # y is x shifted by one


def test_state_resumes_the_stream(tmp_path):
    files = shards(tmp_path, [300, 200])
    loader = BatchLoader(files)
    for _ in range(3):
        loader.next_batch(128, 32, 1)
    saved = loader.state()
    expected = [loader.next_batch(128, 32, 1) for _ in range(4)]
    fresh = BatchLoader(files)
    restore_data_position(fresh, saved)
    for (x1, y1), (x2, y2) in zip(expected, [fresh.next_batch(128, 32, 1) for _ in range(4)], strict=True):
        assert np.array_equal(x1, x2) and np.array_equal(y1, y2)


def test_val_tokens_are_whole_sequences_plus_one(tmp_path):
    files = shards(tmp_path, [100, 60], split="val")
    tokens = load_val_tokens(files, seq_len=32)
    assert len(tokens) == (159 // 32) * 32 + 1
    assert len(load_val_tokens(files, seq_len=32, max_tokens=70)) == 64 + 1
    assert len(load_val_tokens(files, seq_len=32, max_tokens=5)) == 32 + 1  # at least one sequence
    with pytest.raises(PgolfError, match="too few for one sequence"):
        load_val_tokens(files, seq_len=512)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 5000), st.integers(1, 64), st.integers(1, 9), st.integers(1, 4))
def test_val_spans_cover_every_sequence_once(n_tokens, seq_len, batch_seqs, world):
    total = (n_tokens - 1) // seq_len
    seen = []
    for rank in range(world):
        for start, end in val_spans(n_tokens, seq_len, batch_seqs, rank, world):
            assert (end - 1 - start) % seq_len == 0 and (end - 1 - start) // seq_len <= batch_seqs
            seen.extend(range(start // seq_len, (end - 1) // seq_len))
    assert seen == list(range(total))


def test_stream_checks_every_shard_up_front(tmp_path):
    files = shards(tmp_path, [10, 10])
    corrupt(files[1], 0, 7)
    with pytest.raises(PgolfError, match="bad magic 7") as info:
        TokenStream(files)
    assert files[1].name in str(info.value)
    empty = [write_shard(tmp_path / "fineweb_train_000009.bin", np.zeros(0, dtype=np.uint16))]
    with pytest.raises(PgolfError, match="hold no tokens"):
        TokenStream(empty)


def test_batch_must_be_whole_sequences():
    """The loaders take the batch sizes of a validated Config, which refuses one that is not whole
    sequences on every rank (200 tokens over 2 ranks x 1 micro-step: 100, not sequences of 64)."""
    with pytest.raises(PgolfError, match=r"must be a multiple of grad_accum_steps\*train_seq_len=128"):
        Config(train_batch_tokens=200, train_seq_len=64, grad_accum_steps=2).validate(2)
    with pytest.raises(PgolfError, match="world size 2 must divide grad_accum_steps=1"):
        Config(train_batch_tokens=256, train_seq_len=64, grad_accum_steps=1).validate(2)


def test_edge_cases_fail_clearly(tmp_path):
    files = shards(tmp_path, [40])
    stream = TokenStream(files)
    assert stream.take(0).size == 0 and stream.state()["position"] == 0
    with pytest.raises(PgolfError, match="got float64"):
        write_shard(tmp_path / "x.bin", np.zeros(3))
    with pytest.raises(PgolfError, match="does not fit shard"):
        restore_data_position(stream, {"file_index": 0, "position": 41, "epoch": 1})
    with pytest.raises(PgolfError, match="needs integer file_index"):
        restore_data_position(stream, {"file_index": 0})
    with pytest.raises(PgolfError, match="rank 2 is outside a world of 2"):
        BatchLoader(files, rank=2, world_size=2)


def test_val_tokens_check_the_vocabulary(tmp_path):
    files = shards(tmp_path, [100], split="val", vocab=4096)
    with pytest.raises(PgolfError, match="do not match the tokenizer vocabulary") as info:
        load_val_tokens(files, seq_len=32, vocab_size=1024)
    assert str(files[0]) in str(info.value)
