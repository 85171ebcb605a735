"""The challenge's token shard format, the training stream and the validation split.

A shard is a header of 256 little-endian int32 (magic 20240520, version 1, token
count, zeros) followed by that many little-endian uint16 token ids.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from core.atomic import write_atomic
from core.errors import PgolfError

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
MAX_VOCAB = 2**16  # token ids are stored as uint16

log = logging.getLogger("pgolf")


def write_shard(path: str | Path, tokens: np.ndarray) -> Path:
    """Write a shard atomically; the ids must be integers that fit uint16."""
    tokens = np.asarray(tokens)
    if not np.issubdtype(tokens.dtype, np.integer):
        raise PgolfError(f"shard {path}: token ids must be integers in [0, 65535], got {tokens.dtype}")
    if tokens.size and (tokens.min() < 0 or tokens.max() > 65_535):
        bad = int(tokens.min()) if tokens.min() < 0 else int(tokens.max())
        raise PgolfError(f"shard {path}: token ids must be integers in [0, 65535], got {bad}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (SHARD_MAGIC, SHARD_VERSION, tokens.size)
    return write_atomic(path, header.tobytes() + tokens.astype("<u2").tobytes())


def read_shard_header(path: str | Path) -> int:
    """Validate a shard's header and size; return its token count."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
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
    if vocab_size is not None and tokens.size and int(tokens.max()) >= vocab_size:
        raise PgolfError(
            f"shard {path}: token id {int(tokens.max())} >= vocab_size {vocab_size}; "
            "the shards do not match the tokenizer vocabulary"
        )
    return tokens


def find_shards(data_path: str | Path, split: str) -> list[Path]:
    folder = Path(data_path)
    if not folder.is_dir():
        raise PgolfError(f"dataset folder {folder} does not exist (run: python cli.py data prepare)")
    files = sorted(folder.glob(f"fineweb_{split}_*.bin"))
    if not files:
        raise PgolfError(f"no fineweb_{split}_*.bin shards in {folder}")
    return files


class TokenStream:
    """Shards read in order, one at a time, wrapping around forever."""

    def __init__(self, files: list[Path], vocab_size: int | None = None):
        if not files:
            raise PgolfError("the token stream needs at least one shard")
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
        """The next n tokens (uint16); the result may be a view of the loaded shard."""
        if n <= 0:
            return np.zeros(0, dtype=np.uint16)
        parts, remaining = [], n
        while remaining > 0:
            available = len(self.tokens) - self.position
            if available <= 0:
                self._next_file()
                continue
            k = min(remaining, available)
            parts.append(self.tokens[self.position : self.position + k])
            self.position += k
            remaining -= k
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def state(self) -> dict[str, Any]:
        return {"file_index": self.file_index, "position": self.position, "epoch": self.epoch}

    def load_state(self, state: dict[str, Any]) -> None:
        try:
            index, position, epoch = int(state["file_index"]), int(state["position"]), int(state["epoch"])
        except (KeyError, TypeError, ValueError):
            raise PgolfError(f"data position {state!r} needs integer file_index, position, epoch") from None
        if not 0 <= index < len(self.files):
            raise PgolfError(
                f"data position refers to shard #{index}, but there are {len(self.files)} shards"
            )
        tokens = self.tokens if index == self.file_index else read_shard(self.files[index], self.vocab_size)
        if not 0 <= position <= len(tokens) or epoch < 1:
            raise PgolfError(
                f"data position {position} (epoch {epoch}) does not fit shard {self.files[index]} "
                f"of {len(tokens)} tokens"
            )
        self.tokens, self.file_index, self.position, self.epoch = tokens, index, position, epoch


class BatchLoader:
    """Rank-disjoint training batches: each call takes world_size spans of local+1 tokens.

    Rank r gets span r; the "+1" lets (x, y) be built by shifting. So W ranks with
    A micro-batches see exactly the tokens one process with W*A micro-batches sees.
    Ids are int32, which both frameworks index embeddings with.
    """

    def __init__(self, files: list[Path], rank: int = 0, world_size: int = 1, vocab_size: int | None = None):
        if not 0 <= rank < world_size:
            raise PgolfError(f"rank {rank} is outside a world of {world_size} processes")
        self.stream = TokenStream(files, vocab_size)
        self.rank, self.world_size = rank, world_size

    def next_batch(self, global_tokens: int, seq_len: int, accum_steps: int) -> tuple[np.ndarray, np.ndarray]:
        local = global_tokens // (self.world_size * accum_steps)
        if local <= 0 or local % seq_len:
            raise PgolfError(
                f"{global_tokens} tokens per step over {self.world_size} ranks x {accum_steps} micro-steps "
                f"is not a whole number of sequences of {seq_len}"
            )
        chunk = self.stream.take((local + 1) * self.world_size)
        span = chunk[self.rank * (local + 1) : (self.rank + 1) * (local + 1)].astype(np.int32)
        return span[:-1].reshape(-1, seq_len), span[1:].reshape(-1, seq_len)

    def state(self) -> dict[str, Any]:
        return self.stream.state()

    def load_state(self, state: dict[str, Any]) -> None:
        self.stream.load_state(state)


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


def val_spans(
    n_tokens: int, seq_len: int, batch_seqs: int, rank: int = 0, world_size: int = 1
) -> list[tuple[int, int]]:
    """Token ranges [start, end) this rank scores, in batches of at most batch_seqs sequences.

    Each range holds whole sequences plus the next token (the last target). Ranks get
    contiguous, disjoint runs of sequences, split as upstream does.
    """
    total = (n_tokens - 1) // seq_len
    first, last = total * rank // world_size, total * (rank + 1) // world_size
    return [
        (s * seq_len, min(s + batch_seqs, last) * seq_len + 1) for s in range(first, last, max(batch_seqs, 1))
    ]
