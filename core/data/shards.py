"""The challenge's token shard format, the training loaders and the validation split.

Two training loaders with one interface (`next_batch`, and `state`, which a checkpoint keeps and
core/artifact/load.py restores), picked by `Config.train_loader`: `BatchLoader`, upstream's
sequential stream, and `CoprimeLoader`, the records' coprime-stride sampler over many shards at once.

A shard is a header of 256 little-endian int32 (magic 20240520, version 1, token
count, zeros) followed by that many little-endian uint16 token ids (written by
core/datasets/writers.py).
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from core.common.errors import PgolfError, hint
from core.common.files import open_regular

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
MAX_VOCAB = 2**16  # token ids are stored as uint16

log = logging.getLogger("pgolf")


def read_shard_header(path: str | Path) -> int:
    """Validate a shard's header and size; return its token count."""
    path = Path(path)
    try:
        with open_regular(path, "shard") as f:
            size = os.fstat(f.fileno()).st_size
            raw = f.read(HEADER_BYTES)
    except OSError as exc:
        raise PgolfError(f"shard {path}: cannot read ({exc.strerror})") from None
    if len(raw) < HEADER_BYTES:
        raise PgolfError(f"shard {path}: only {len(raw)} bytes, shorter than the {HEADER_BYTES}-byte header")
    header = np.frombuffer(raw, dtype="<i4")
    if header[0] != SHARD_MAGIC:
        raise PgolfError(f"shard {path}: bad magic {header[0]} (expected {SHARD_MAGIC})")
    if header[1] != SHARD_VERSION:
        raise PgolfError(f"shard {path}: unsupported version {header[1]} (expected {SHARD_VERSION})")
    count = int(header[2])
    if count < 0:
        raise PgolfError(f"shard {path}: negative token count {count}")
    expected = HEADER_BYTES + 2 * count
    if size != expected:
        raise PgolfError(
            f"shard {path}: {size} bytes, but its header promises {count} tokens ({expected} bytes)"
        )
    return count


def read_shard(path: str | Path, vocab_size: int | None = None) -> np.ndarray:
    """The token ids of a shard (uint16), checked against the vocabulary when given."""
    count = read_shard_header(path)
    tokens = np.fromfile(path, dtype="<u2", count=count, offset=HEADER_BYTES)
    check_ids(tokens, vocab_size, path)
    return tokens


def check_ids(tokens: np.ndarray, vocab_size: int | None, path: str | Path) -> None:
    """Refuse token ids of shard `path` past the vocabulary (when one is given)."""
    if vocab_size is not None and tokens.size and int(tokens.max()) >= vocab_size:
        raise PgolfError(
            f"shard {path}: token id {int(tokens.max())} >= vocab_size {vocab_size}; "
            "the shards do not match the tokenizer vocabulary"
        )


def check_rank(rank: int, world_size: int) -> None:
    if not 0 <= rank < world_size:
        raise PgolfError(f"rank {rank} is outside a world of {world_size} processes")


def find_shards(data_path: str | Path, split: str) -> list[Path]:
    """The shards `fineweb_<split>_<number>.bin` of a dataset folder, in order. split "val_bytes"
    names the validation byte sidecar (CaseOps data), which "val" does not include."""
    folder = Path(data_path)
    if not folder.is_dir():
        raise PgolfError(
            f"dataset folder {folder} does not exist ({hint('run: python cli.py data prepare', 'set DATA_PATH')})"
        )
    try:
        os.listdir(folder)  # glob finds nothing in a folder it may not list: say so instead
    except OSError as exc:
        raise PgolfError(f"dataset folder {folder}: cannot read ({exc.strerror or exc})") from None
    files = sorted(folder.glob(f"fineweb_{split}_[0-9]*.bin"))
    if not files:
        raise PgolfError(f"no fineweb_{split}_*.bin shards in {folder}")
    return files


class TokenStream:
    """Shards read in order, one at a time, wrapping around forever."""

    def __init__(self, files: list[Path], vocab_size: int | None = None):
        self.files, self.vocab_size = list(files), vocab_size
        # Check every header now: a bad shard should fail at start-up, not hours into a run.
        if sum(read_shard_header(f) for f in self.files) == 0:
            raise PgolfError(f"the shards {self.files[0]} ... {self.files[-1].name} hold no tokens")
        self.file_index, self.position, self.epoch = 0, 0, 1
        self.tokens = read_shard(self.files[0], vocab_size)

    def _next_file(self) -> None:
        self.file_index = (self.file_index + 1) % len(self.files)
        if self.file_index == 0:
            self.epoch += 1
            log.warning(
                "train data: starting epoch %d (the stream wrapped around to the first shard)", self.epoch
            )
        self.tokens = read_shard(self.files[self.file_index], self.vocab_size)
        self.position = 0

    def take(self, n: int) -> np.ndarray:
        """The next n tokens (uint16)."""
        parts = [self.tokens[:0]]
        while n > 0:
            if self.position == len(self.tokens):
                self._next_file()
                continue
            parts.append(self.tokens[self.position : self.position + n])
            self.position += len(parts[-1])
            n -= len(parts[-1])
        return np.concatenate(parts)

    def state(self) -> dict[str, Any]:
        return {"file_index": self.file_index, "position": self.position, "epoch": self.epoch}


def local_tokens(global_tokens: int, seq_len: int, world_size: int, accum_steps: int) -> int:
    """Tokens of one micro-batch on one rank: a whole number of sequences, or an error."""
    local = global_tokens // (world_size * accum_steps)
    if local <= 0 or local % seq_len:
        raise PgolfError(
            f"{global_tokens} tokens per step over {world_size} ranks x {accum_steps} micro-steps "
            f"is not a whole number of sequences of {seq_len}"
        )
    return local


class BatchLoader:
    """Rank-disjoint training batches: each call takes world_size spans of local+1 tokens.

    Rank r gets span r; the "+1" lets (x, y) be built by shifting. So W ranks with
    A micro-batches see exactly the tokens one process with W*A micro-batches sees.
    Ids are int32, which both frameworks index embeddings with.
    """

    def __init__(self, files: list[Path], rank: int = 0, world_size: int = 1, vocab_size: int | None = None):
        check_rank(rank, world_size)
        self.stream = TokenStream(files, vocab_size)
        self.rank, self.world_size = rank, world_size

    def next_batch(self, global_tokens: int, seq_len: int, accum_steps: int) -> tuple[np.ndarray, np.ndarray]:
        local = local_tokens(global_tokens, seq_len, self.world_size, accum_steps)
        chunk = self.stream.take((local + 1) * self.world_size)
        span = chunk[self.rank * (local + 1) : (self.rank + 1) * (local + 1)].astype(np.int32)
        return span[:-1].reshape(-1, seq_len), span[1:].reshape(-1, seq_len)

    def state(self) -> dict[str, Any]:
        return self.stream.state()


FNV_PRIME = 1_099_511_628_211
MIX_RAMP_CALLS = 1800  # next_batch calls over which the shard mixture goes from few to many shards


def shard_names_seed(files: list[Path]) -> int:
    """The coprime loader's RNG seed: 64-bit FNV-1a (offset basis 0, as the records) over the UTF-8
    bytes of the shard file names, concatenated in sorted order.

    The records hash the path strings exactly as `glob` returned them, so their batches change with
    the folder the data sits in; names alone give the same batches wherever the dataset is moved.
    For a glob run inside the shard folder (the golden batches) the two are the same strings.
    """
    seed = 0
    for name in sorted(Path(f).name for f in files):
        for byte in name.encode():
            seed = ((seed ^ byte) * FNV_PRIME) & 0xFFFF_FFFF_FFFF_FFFF
    return seed


class CoprimeLoader:
    """The records' coprime-stride multi-shard loader (`DistributedTokenLoader`, 2026-03-29 to 04-04).

    Every call samples one global list of windows of seq_len+1 tokens, the same on every rank (one
    RNG, seeded by `shard_names_seed`); rank r takes windows r, r+W, ... Each shard has a cursor: a
    random phase (offset < seq_len), the blocks of seq_len tokens after it, and a pass over those
    blocks in the order start, start+stride, ... (mod blocks) with gcd(stride, blocks) = 1, so a pass
    visits every block once; an exhausted cursor is drawn again (new phase, start and stride).
    A call picks `mix` shards without replacement, weighted by remaining blocks^alpha, splits the
    windows among them (one each plus a multinomial), takes each shard's windows from its cursor,
    shuffles them and interleaves the shards round-robin in random order. Over the first 1800 calls
    the mixture widens (8 to 32 shards, for W <= 4) and alpha falls from 0.9 to 0.5. The RNG draws,
    their order and the arithmetic are the record's, so the batches are identical to its batches
    for the same shard names (see tests/test_loader.py). Ids are int32, as from `BatchLoader`.
    """

    def __init__(self, files: list[Path], rank: int = 0, world_size: int = 1, vocab_size: int | None = None):
        check_rank(rank, world_size)
        self.files = sorted((Path(f) for f in files), key=lambda p: (p.name, str(p)))
        self.rank, self.world_size, self.vocab_size = rank, world_size, vocab_size
        # Check every header now: a bad shard should fail at start-up, not hours into a run.
        self.num_tokens = np.array([read_shard_header(f) for f in self.files], dtype=np.int64)
        if not self.num_tokens.all():
            raise PgolfError(f"shard {self.files[int(np.argmin(self.num_tokens))]}: holds no tokens")
        self.seed = shard_names_seed(self.files)
        self.rng = np.random.Generator(np.random.PCG64(self.seed))
        self.seq_len = 0  # fixed by the first call: the cursors are in blocks of seq_len
        self.calls = 0
        # Each shard's cursor (see `_new_cursor`); `next`: blocks of the current pass already taken.
        self.phase, self.blocks, self.next, self.start = np.zeros((4, len(self.files)), dtype=np.int64)
        self.stride = np.ones(len(self.files), dtype=np.int64)
        self.active = np.zeros(len(self.files), dtype=np.bool_)  # the shard has a cursor
        self.tokens = [
            np.memmap(f, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(int(count),))
            for f, count in zip(self.files, self.num_tokens, strict=True)
        ]

    # ------------------------------------------------------------------ cursors
    def _new_cursor(self, si: int) -> None:
        """A new pass over shard si (one holding a window): a random phase, start, and stride coprime
        to its number of blocks, drawn as the record draws them."""
        n, seq_len = int(self.num_tokens[si]), self.seq_len
        max_phase = min(seq_len - 1, n - seq_len - 1)
        phase = int(self.rng.integers(max_phase + 1)) if max_phase > 0 else 0
        blocks = (n - 1 - phase) // seq_len
        start = int(self.rng.integers(blocks)) if blocks > 1 else 0
        stride = int(self.rng.integers(1, blocks)) if blocks > 1 else 1
        while math.gcd(stride, blocks) != 1:
            stride = int(self.rng.integers(1, blocks))
        self.phase[si], self.blocks[si], self.next[si] = phase, blocks, 0
        self.start[si], self.stride[si], self.active[si] = start, stride, True

    def _take(self, si: int, count: int) -> list[tuple[int, int]]:
        """The next `count` windows (shard, first token) of shard si, starting new passes as needed."""
        out: list[tuple[int, int]] = []
        while count > 0:
            if not self.active[si] or self.next[si] >= self.blocks[si]:
                self._new_cursor(si)
            blocks, done = self.blocks[si], self.next[si]
            k = min(count, blocks - done)
            steps = (self.start[si] + np.arange(done, done + k) * self.stride[si]) % blocks
            out += [(si, first) for first in (self.phase[si] + steps * self.seq_len).tolist()]
            self.next[si] += k
            count -= k
        return out

    # ------------------------------------------------------------------ sampling
    def _global_windows(self, global_seqs: int) -> list[tuple[int, int]]:
        """One call's windows for all ranks, with the record's RNG draws in the record's order.

        Every shard of `eligible` holds a window (`_fix_seq_len` refuses a dataset without one) and so
        weighs at least 1: the weights are positive and finite, and `mix` is at least 1.
        """
        whole_blocks = (self.num_tokens - 1) // self.seq_len
        eligible = np.nonzero(whole_blocks > 0)[0]  # in file order
        ec = len(eligible)
        progress = min(self.calls / MIX_RAMP_CALLS, 1.0)
        remaining = np.where(self.active, np.maximum(self.blocks - self.next, 1), whole_blocks)
        weights = np.power(remaining[eligible].astype(np.float64), 0.90 - 0.40 * progress)
        probs = weights / weights.sum()
        low = min(max(8, self.world_size), ec, global_seqs)
        high = min(max(32, self.world_size * 8), ec, global_seqs)
        mix = round(low + progress * (high - low))

        picked = self.rng.choice(ec, size=mix, replace=False, p=probs)
        counts = np.ones(mix, dtype=np.int64)
        if global_seqs > mix:
            counts += self.rng.multinomial(global_seqs - mix, probs[picked] / probs[picked].sum())
        order = self.rng.permutation(mix)
        buckets = []
        for si, count in zip(eligible[picked][order].tolist(), counts[order].tolist(), strict=True):
            buckets.append(self._take(si, count))
            self.rng.shuffle(buckets[-1])
        # Round-robin in a fresh random order each round; each bucket gives its last window.
        windows: list[tuple[int, int]] = []
        while buckets:
            self.rng.shuffle(buckets)
            windows += [bucket.pop() for bucket in buckets]
            buckets = [bucket for bucket in buckets if bucket]
        return windows

    def _fix_seq_len(self, seq_len: int) -> None:
        """Fix the cursors' block size at the first call (Config.validate has checked it is positive)."""
        if self.seq_len == 0:
            self.seq_len = seq_len
            short = [
                f.name for f, n in zip(self.files, self.num_tokens.tolist(), strict=True) if n <= seq_len
            ]
            if len(short) == len(self.files):
                raise PgolfError(
                    f"no training shard in {self.files[0].parent} holds {seq_len + 1} tokens "
                    f"(one sequence of {seq_len} plus its target)"
                )
            if short:
                log.warning(
                    "train data: %d shards shorter than %d tokens are skipped: %s",
                    len(short),
                    seq_len + 1,
                    ", ".join(short[:5]) + (" ..." if len(short) > 5 else ""),
                )
        elif seq_len != self.seq_len:
            raise PgolfError(
                f"the coprime loader's cursors are in blocks of {self.seq_len} tokens; "
                f"it cannot serve sequences of {seq_len}"
            )

    # ------------------------------------------------------------------ interface
    def next_batch(self, global_tokens: int, seq_len: int, accum_steps: int) -> tuple[np.ndarray, np.ndarray]:
        local = local_tokens(global_tokens, seq_len, self.world_size, accum_steps)
        self._fix_seq_len(seq_len)
        # Sizes follow each call's arguments (the record fixes them at its first call; the loop's never change).
        windows = self._global_windows(local // seq_len * self.world_size)[self.rank :: self.world_size]
        batch = np.array([self.tokens[si][pos : pos + seq_len + 1] for si, pos in windows], dtype=np.int32)
        row = int(batch.max(axis=1).argmax())  # the row holding the largest id
        check_ids(batch[row], self.vocab_size, self.files[windows[row][0]])
        self.calls += 1
        return batch[:, :-1], batch[:, 1:]

    def state(self) -> dict[str, Any]:
        """Everything a resume needs, JSON-safe; the same on every rank (the windows are global)."""
        rng = self.rng.bit_generator.state
        return {
            "loader": "coprime",
            "seed": str(self.seed),
            "shards": len(self.files),
            "seq_len": self.seq_len,
            "calls": self.calls,
            # PCG64's 128-bit state and inc as decimal strings: JSON readers other than Python's lose their digits.
            "rng": {key: str(value) for key, value in rng["state"].items()}
            | {"has_uint32": rng["has_uint32"], "uinteger": rng["uinteger"]},
            "cursors": {key: getattr(self, key).tolist() for key in CURSORS},
        }


CURSORS = ("phase", "blocks", "next", "start", "stride", "active")  # CoprimeLoader's per-shard arrays


TRAIN_LOADERS = {"sequential": BatchLoader, "coprime": CoprimeLoader}  # Config.train_loader's choices


def make_train_loader(
    kind: str, files: list[Path], rank: int = 0, world_size: int = 1, vocab_size: int | None = None
) -> BatchLoader | CoprimeLoader:
    """The training loader Config.train_loader names."""
    if kind not in TRAIN_LOADERS:
        raise PgolfError(f"train_loader must be {' or '.join(TRAIN_LOADERS)}, got {kind!r}")
    return TRAIN_LOADERS[kind](files, rank, world_size, vocab_size)


def load_val_tokens(
    files: list[Path], seq_len: int, max_tokens: int = 0, vocab_size: int | None = None
) -> np.ndarray:
    """All validation tokens, cut to whole sequences plus the one target token after them.

    `max_tokens` > 0 caps the sequences scored (rounded down, but at least one): a quick eval.
    """
    if not files:
        raise PgolfError("no validation shards were given")
    tokens = np.concatenate([read_shard(f, vocab_size) for f in files])
    usable = ((len(tokens) - 1) // seq_len) * seq_len
    if max_tokens > 0:
        usable = min(usable, max(max_tokens // seq_len, 1) * seq_len)
    if usable <= 0:
        raise PgolfError(
            f"validation shards in {Path(files[0]).parent}: {len(tokens)} tokens, "
            f"too few for one sequence of {seq_len} plus its target"
        )
    return tokens[: usable + 1]


def load_val_bytes(files: list[Path], n_tokens: int) -> np.ndarray:
    """The byte sidecar of the validation shards `files`, cut as load_val_tokens cut their tokens to
    `n_tokens`: uint16, the original bytes of the text each token stands for (CaseOps data).

    Each shard `fineweb_val_N.bin` must have its sidecar `fineweb_val_bytes_N.bin` with as many entries.
    """
    parts = []
    for shard in files:
        sidecar = shard.with_name(shard.name.replace("_val_", "_val_bytes_"))
        if not sidecar.exists() or read_shard_header(sidecar) != read_shard_header(shard):
            raise PgolfError(f"{sidecar} must hold one entry per token of {shard.name}")
        parts.append(read_shard(sidecar))
        if sum(map(len, parts)) >= n_tokens:
            break
    return np.concatenate(parts)[:n_tokens]


def val_spans(
    n_tokens: int, seq_len: int, batch_seqs: int, rank: int = 0, world_size: int = 1, whole: bool = False
) -> list[tuple[int, int]]:
    """Token ranges [start, end) this rank scores, in batches of at most batch_seqs sequences.

    Each range holds whole sequences plus the next token (the last target). Ranks get
    contiguous, disjoint runs of sequences, split as upstream does. `whole`: only whole batches,
    each rank leaving out the sequences after its last one (record 2026-04-27's evaluation does).
    """
    total = (n_tokens - 1) // seq_len
    first, last = total * rank // world_size, total * (rank + 1) // world_size
    if whole:
        last = first + (last - first) // batch_seqs * batch_seqs
    return [
        (s * seq_len, min(s + batch_seqs, last) * seq_len + 1) for s in range(first, last, max(batch_seqs, 1))
    ]
