"""Upstream's sequential training loader (`Config.train_loader = "sequential"`): the shards read in
order, one at a time. Imported only by the runs that use it (core/data/shards.py's
`make_train_loader`); the records' coprime-stride sampler is core/data/coprime.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from core.common.errors import PgolfError
from core.data.shards import check_rank, log, read_shard, read_shard_header


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
        local = global_tokens // (self.world_size * accum_steps)  # whole sequences: Config.validate
        chunk = self.stream.take((local + 1) * self.world_size)
        span = chunk[self.rank * (local + 1) : (self.rank + 1) * (local + 1)].astype(np.int32)
        return span[:-1].reshape(-1, seq_len), span[1:].reshape(-1, seq_len)

    def state(self) -> dict[str, Any]:
        return self.stream.state()
