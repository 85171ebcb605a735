"""The coprime-stride multi-shard training loader against the record's own batches, and its properties."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from core.artifact.load import restore_data_position
from core.common.errors import PgolfError
from core.config.fields import Config
from core.data.coprime import CoprimeLoader, shard_names_seed
from core.data.sequential import BatchLoader
from core.datasets.writers import write_shard
from core.train.loop import make_train_loader

GOLDEN = Path(__file__).resolve().parent / "golden" / "record_features.safetensors"
# As tests/golden/make_record_features.py writes them: token i of shard k is OFFSETS[k] + i.
NAMES = [f"fineweb_train_{k:06d}.bin" for k in range(3)]
LENGTHS, OFFSETS = (150, 1000, 2003), (0, 20000, 40000)
SEQ_LEN, GLOBAL_TOKENS = 16, 1024
GOLDEN_SEED = 10059109972261690242  # FNV-1a of the three names, the seed the record's loader used


def golden_shards(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [
        write_shard(folder / name, offset + np.arange(n))
        for name, n, offset in zip(NAMES, LENGTHS, OFFSETS, strict=True)
    ]


def take(loader, n: int, world: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    return [loader.next_batch(GLOBAL_TOKENS, SEQ_LEN, 8 // world) for _ in range(n)]


@pytest.mark.parametrize(("world", "rank"), [(1, 0), (2, 0), (2, 1)])
def test_batches_equal_the_records_loader(tmp_path, world, rank):
    with safe_open(GOLDEN, "np") as f:
        meta = json.loads(f.metadata()["loader"])
        assert (meta["shards"], tuple(meta["shard_lengths"])) == (NAMES, LENGTHS)
        golden = [(f.get_tensor(f"loader/w{world}r{rank}/x{b}"), f.get_tensor(f"loader/w{world}r{rank}/y{b}"))
                  for b in range(6)]  # fmt: skip
    loader = CoprimeLoader(golden_shards(tmp_path), rank, world)
    for b, ((x, y), (gx, gy)) in enumerate(zip(take(loader, 6, world), golden, strict=True)):
        assert x.dtype == y.dtype == np.int32
        np.testing.assert_array_equal(x, gx, err_msg=f"x{b}")
        np.testing.assert_array_equal(y, gy, err_msg=f"y{b}")
    assert loader.active[0] and loader.next[0] <= loader.blocks[0]  # shard 0 was re-phased on the way


def test_the_seed_hashes_the_sorted_names_not_the_folder(tmp_path):
    here, there = golden_shards(tmp_path / "a"), golden_shards(tmp_path / "b" / "c")
    assert shard_names_seed(here) == shard_names_seed(there[::-1]) == GOLDEN_SEED
    one, two = CoprimeLoader(here), CoprimeLoader(there[::-1])
    for (x1, y1), (x2, y2) in zip(take(one, 4), take(two, 4), strict=True):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    (tmp_path / "b" / "c" / NAMES[0]).rename(tmp_path / "b" / "c" / "fineweb_train_000009.bin")
    assert shard_names_seed(sorted((tmp_path / "b" / "c").iterdir())) != GOLDEN_SEED


@pytest.mark.parametrize(("world", "rank"), [(1, 0), (2, 1)])
def test_resume_from_state_is_exact(tmp_path, world, rank):
    files = golden_shards(tmp_path)
    loader = CoprimeLoader(files, rank, world)
    take(loader, 5, world)
    state = json.loads(json.dumps(loader.state()))  # as a checkpoint stores it
    expected = take(loader, 5, world)
    resumed = CoprimeLoader(files, rank, world)
    restore_data_position(resumed, state)
    for (x, y), (ex, ey) in zip(take(resumed, 5, world), expected, strict=True):
        np.testing.assert_array_equal(x, ex)
        np.testing.assert_array_equal(y, ey)
    # The same loader rewinds too (the compile warmup restores the state it started from).
    restore_data_position(loader, state)
    np.testing.assert_array_equal(take(loader, 1, world)[0][0], expected[0][0])


def test_every_window_is_consecutive_tokens_of_one_shard(tmp_path):
    sizes, offsets = (40, 517, 1203, 3001, 16), (0, 5000, 10000, 20000, 30000)
    files = [write_shard(tmp_path / f"fineweb_train_{k:06d}.bin", off + np.arange(n))
             for k, (n, off) in enumerate(zip(sizes, offsets, strict=True))]  # fmt: skip
    for rank in (0, 1):
        loader = CoprimeLoader(files, rank, 2)
        for _ in range(60):
            x, y = loader.next_batch(GLOBAL_TOKENS, SEQ_LEN, 2)
            assert x.shape == y.shape == (16, SEQ_LEN)
            np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
            window = np.concatenate([x, y[:, -1:]], axis=1)
            np.testing.assert_array_equal(np.diff(window, axis=1), 1)
            shard = np.searchsorted(offsets, window[:, 0], side="right") - 1
            assert np.all(window[:, -1] < np.array(offsets)[shard] + np.array(sizes)[shard])
            assert not np.any(shard == 4)  # 16 tokens: too short for a window of 17, never sampled


@pytest.mark.parametrize("n", [16 * 50 + 5, 16 * 37 + 1, 17, 18, 40])
def test_a_pass_visits_every_block_of_a_shard_once(tmp_path, n):
    (path,) = [write_shard(tmp_path / "fineweb_train_000000.bin", np.arange(n))]
    loader = CoprimeLoader([path])
    for _ in range(3):  # three passes, each with its own phase, start and stride
        first = int(loader.next_batch(SEQ_LEN, SEQ_LEN, 1)[0][0, 0])  # one window per call
        cursor = loader.state()["cursors"]
        phase, blocks = cursor["phase"][0], cursor["blocks"][0]
        assert 0 <= phase < SEQ_LEN and blocks == (n - 1 - phase) // SEQ_LEN
        starts = [first] + [int(loader.next_batch(SEQ_LEN, SEQ_LEN, 1)[0][0, 0]) for _ in range(blocks - 1)]
        assert sorted((s - phase) // SEQ_LEN for s in starts) == list(range(blocks))
        assert all((s - phase) % SEQ_LEN == 0 for s in starts)
        assert loader.state()["cursors"]["next"][0] == blocks  # exhausted: the next call re-phases


def test_a_malformed_or_empty_shard_is_refused_by_name(tmp_path):
    files = golden_shards(tmp_path)
    empty = write_shard(tmp_path / "fineweb_train_000003.bin", np.zeros(0, dtype=np.int64))
    with pytest.raises(PgolfError, match=r"fineweb_train_000003\.bin: holds no tokens"):
        CoprimeLoader([*files, empty])
    data = bytearray(files[1].read_bytes())
    data[0:4] = np.array([7], dtype="<i4").tobytes()
    files[1].write_bytes(bytes(data))
    with pytest.raises(PgolfError, match=r"fineweb_train_000001\.bin: bad magic 7"):
        CoprimeLoader(files)


def test_shards_too_short_or_out_of_vocabulary_are_refused(tmp_path):
    short = [write_shard(tmp_path / f"fineweb_train_{k:06d}.bin", np.arange(SEQ_LEN)) for k in range(2)]
    with pytest.raises(PgolfError, match="no training shard .* holds 17 tokens"):
        CoprimeLoader(short).next_batch(GLOBAL_TOKENS, SEQ_LEN, 8)
    files = golden_shards(tmp_path / "golden")
    with pytest.raises(PgolfError, match=r"fineweb_train_00000[12]\.bin: token id \d+ >= vocab_size 1024"):
        CoprimeLoader(files, vocab_size=1024).next_batch(GLOBAL_TOKENS, SEQ_LEN, 8)
    loader = CoprimeLoader(files)
    loader.next_batch(GLOBAL_TOKENS, SEQ_LEN, 8)
    with pytest.raises(PgolfError, match="blocks of 16 tokens"):
        loader.next_batch(GLOBAL_TOKENS, 32, 8)


def test_a_state_from_other_shards_or_the_sequential_loader_is_refused(tmp_path):
    files = golden_shards(tmp_path)
    loader = CoprimeLoader(files)
    take(loader, 2)
    with pytest.raises(PgolfError, match="not written by the coprime loader"):
        restore_data_position(loader, BatchLoader(files).state())
    with pytest.raises(PgolfError, match="saved over 3 shards .* but these are 2 shards"):
        restore_data_position(CoprimeLoader(files[:2]), loader.state())
    state = loader.state()
    state["cursors"]["blocks"][2] += 1
    with pytest.raises(PgolfError, match="a shard changed size"):
        restore_data_position(CoprimeLoader(files), state)


def test_the_config_picks_the_loader(tmp_path):
    files = golden_shards(tmp_path)
    assert isinstance(make_train_loader(Config(), files), BatchLoader)
    assert isinstance(make_train_loader(Config(train_loader="coprime"), files, 1, 2), CoprimeLoader)
    assert Config().train_loader == "sequential"
    with pytest.raises(PgolfError, match="train_loader must be sequential or coprime"):
        Config(train_loader="shuffled").validate(1)
