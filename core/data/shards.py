"""The challenge's token shard format, the training loaders and the validation split.

Two training loaders with one interface (`next_batch`, and `state`, which a checkpoint keeps and
core/artifact/load.py restores), picked by `Config.train_loader`: `BatchLoader` (core/data/sequential.py),
upstream's sequential stream, and `CoprimeLoader` (core/data/coprime.py), the records' coprime-stride
sampler over many shards at once.

A shard is a header of 256 little-endian int32 (magic 20240520, version 1, token
count, zeros) followed by that many little-endian uint16 token ids (written by
core/datasets/writers.py).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

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
    count = int(header[2])  # a negative one promises fewer bytes than the header: refused below
    expected = HEADER_BYTES + 2 * count
    if size != expected:
        raise PgolfError(
            f"shard {path}: {size} bytes, but its header promises {count} tokens ({expected} bytes)"
        )
    return count


def read_shard(path: str | Path, vocab_size: int | None = None) -> np.ndarray:
    """The token ids of a shard (uint16), checked against the vocabulary when given."""
    count = read_shard_header(path)
    with open_regular(path, "shard") as f:
        f.seek(HEADER_BYTES)
        tokens = np.fromfile(f, dtype="<u2", count=count)
    if len(tokens) != count:  # cut since its header was read
        raise PgolfError(f"shard {path}: holds {len(tokens)} tokens, its header promises {count}")
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


def making_command(path: str | Path) -> str:
    """The command that makes the dataset folder or tokenizer `path`, by its name: the embedded corpus's
    (`sotu_sp<V>`, `sotu_<V>_bpe`) by `data prepare`, with `--caseops` and `--vocab-size` as it needs; the
    challenge's (`fineweb10B_<variant>`, `fineweb_<V>_bpe`) by `data download`; any other from documents."""
    name = re.sub(
        r"^\.(.+)-\d+$", r"\1", Path(path).name.removesuffix(".model")
    )  # a versioned dataset folder
    if found := re.fullmatch(
        r"sotu_(?:sp)?(\d+)(?:_bpe)?(_caseops)?", name.replace("_bpe_caseops", "_caseops")
    ):
        vocab, caseops = found.groups()
        return (
            "python cli.py data prepare"
            + " --caseops" * bool(caseops)
            + f" --vocab-size {vocab}" * (vocab != "1024")
        )
    if found := re.fullmatch(r"fineweb10B_(\w+)|fineweb_(\d+)_bpe", name):
        return "python cli.py data download --variant " + (found[1] or f"sp{found[2]}")
    return f"python cli.py data prepare --docs FILE --name {name}, FILE your documents"


def find_shards(data_path: str | Path, split: str) -> list[Path]:
    """The shards `fineweb_<split>_<number>.bin` of a dataset folder, in order. split "val_bytes"
    names the validation byte sidecar, which "val" does not include."""
    folder = Path(data_path)
    if not folder.is_dir():
        raise PgolfError(
            f"dataset folder {folder} does not exist ({hint(f'run: {making_command(folder)}', 'set DATA_PATH')})"
        )
    try:
        os.listdir(folder)  # glob finds nothing in a folder it may not list: say so instead
    except OSError as exc:
        raise PgolfError(f"dataset folder {folder}: cannot read ({exc.strerror or exc})") from None
    files = sorted(folder.glob(f"fineweb_{split}_[0-9]*.bin"))
    if not files:
        raise PgolfError(f"no fineweb_{split}_*.bin shards in {folder}")
    return files


TRAIN_LOADERS = ("sequential", "coprime")  # Config.train_loader's choices


def load_val_tokens(
    files: list[Path], seq_len: int, max_tokens: int = 0, vocab_size: int | None = None
) -> np.ndarray:
    """All validation tokens, cut to whole sequences plus the one target token after them.

    `max_tokens` > 0 caps the sequences scored (rounded down, but at least one): a quick eval.
    """
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
    `n_tokens`: uint16, the bytes of the text each token stands for.

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
    return [(s * seq_len, min(s + batch_seqs, last) * seq_len + 1) for s in range(first, last, batch_seqs)]
