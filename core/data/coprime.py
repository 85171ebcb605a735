"""The records' coprime-stride training loader (`Config.train_loader = "coprime"`), beside upstream's
sequential one in core/data/sequential.py; imported only by the runs that use it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from core.common.errors import PgolfError
from core.data.shards import HEADER_BYTES, check_ids, check_rank, log, read_shard_header

CURSORS = ("phase", "blocks", "next", "start", "stride", "active")  # the per-shard arrays a checkpoint keeps

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
        local = global_tokens // (self.world_size * accum_steps)  # whole sequences: Config.validate
        self._fix_seq_len(seq_len)
        # Sizes follow each call's arguments (the record fixes them at its first call; the loop's never change).
        windows = self._global_windows(local // seq_len * self.world_size)[self.rank :: self.world_size]
        batch = np.array([self.tokens[si][pos : pos + seq_len + 1] for si, pos in windows], dtype=np.int32)
        row = int(batch.max(axis=1).argmax())  # the row holding the largest id
        check_ids(batch[row], self.vocab_size, self.files[windows[row][0]])
        self.calls += 1
        return batch[:, :-1], batch[:, 1:]

    def state(self) -> dict[str, Any]:
        """Everything a resume needs, JSON-safe; the same on every rank (the windows are global).
        Only a resumable checkpoint takes it; core/artifact/load.py puts it back."""
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
