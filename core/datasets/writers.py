"""What making a dataset writes: token shards in the challenge's format (core/data/shards.py reads
them) and a SentencePiece model trained on the dataset's text (core/data/tokenizer.py loads it).
"""

from __future__ import annotations

import io
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from core.common.errors import PgolfError, first_line
from core.common.files import read_text, remove_stale_temps, sync, write_atomic
from core.data.shards import HEADER_BYTES, HEADER_INTS, SHARD_MAGIC, SHARD_VERSION

# SentencePiece's BPE trainer keeps its training text in memory: its peak resident memory, measured
# with the challenge's settings (docs/tokenizers.md), against the bytes of the training documents.
TRAIN_MEMORY_BASE = 100 * 2**20
TRAIN_MEMORY_PER_BYTE = 1.4


def write_shard(path: str | Path, tokens: np.ndarray) -> Path:
    """Write a shard atomically; the ids must be integers that fit uint16."""
    tokens = np.asarray(tokens)
    if not np.issubdtype(tokens.dtype, np.integer):
        raise PgolfError(f"shard {path}: token ids must be integers in [0, 65535], got {tokens.dtype}")
    if tokens.size and (tokens.min() < 0 or tokens.max() > 65_535):
        bad = int(tokens.min()) if tokens.min() < 0 else int(tokens.max())
        raise PgolfError(f"shard {path}: token ids must be integers in [0, 65535], got {bad}")
    return write_atomic(path, _header(tokens.size) + tokens.astype("<u2").tobytes())


def _header(count: int) -> bytes:
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (SHARD_MAGIC, SHARD_VERSION, count)
    return header.tobytes()


class ShardWriter:
    """The shards of one stream (`fineweb_<stream>_NNNNNN.bin`) written as its tokens come, `shard_tokens`
    to a shard, the last one shorter. A shard fills a temp file beside its name (named as write_atomic
    names its own), gets its header, which holds the count, once whole, and is then renamed into place:
    memory holds no shard, and no reader ever sees half of one."""

    def __init__(self, folder: str | Path, stream: str, shard_tokens: int):
        self.folder, self.stream, self.shard_tokens = Path(folder), stream, shard_tokens
        self.files = 0  # shards completed
        self._file: io.BufferedWriter | None = None
        self._temp: Path | None = None
        self._filled = 0

    @property
    def path(self) -> Path:
        """The shard being filled (or the next one)."""
        return self.folder / f"fineweb_{self.stream}_{self.files:06d}.bin"

    def write(self, tokens: np.ndarray) -> None:
        """Append uint16 token ids, spilling into new shards as each fills."""
        tokens = np.ascontiguousarray(tokens, dtype="<u2")
        done = 0
        try:
            while done < tokens.size:
                if self._file is None:
                    self._open()
                take = min(self.shard_tokens - self._filled, tokens.size - done)
                self._file.write(memoryview(tokens[done : done + take]))
                self._filled += take
                done += take
                if self._filled == self.shard_tokens:
                    self._finish()
        except OSError as exc:
            raise PgolfError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def close(self) -> None:
        """Finish the last, partial shard (none when the stream ended on a shard's edge)."""
        try:
            if self._file is not None:
                self._finish()
        except OSError as exc:
            raise PgolfError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def discard(self) -> None:
        """Drop the shard being filled (after an error): the completed ones stay."""
        if self._file is not None:
            self._file.close()
            self._temp.unlink(missing_ok=True)
            self._file = None

    def _open(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(self.folder)
        fd, temp = tempfile.mkstemp(
            dir=self.folder, prefix=f".{self.path.name}.pgolf-{os.getpid()}-", suffix=".tmp"
        )
        self._file, self._temp, self._filled = os.fdopen(fd, "wb"), Path(temp), 0
        self._file.write(bytes(HEADER_BYTES))  # the count is known once the shard is whole

    def _finish(self) -> None:
        self._file.seek(0)
        self._file.write(_header(self._filled))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.chmod(self._temp, 0o644)  # mkstemp makes files private; shards are ordinary files
        os.replace(self._temp, self.path)
        sync(self.folder)
        self._file = None
        self.files += 1


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    model_prefix: str | Path,
    byte_fallback: bool = True,
    user_symbols: Sequence[str] = (),
    lossless: bool = False,
    exporter_limits: bool = False,
) -> Path:
    """Train a BPE model with the challenge's trainer options; deterministic for the same texts.

    `user_symbols` become pieces of their own, right after the four special ones (ids 4, 5, ...).
    `lossless` keeps the text as it is (no NFKC, no whitespace folding): decoding then gives back the
    exact text encoded (with byte_fallback), which CaseOps' byte sidecar relies on.
    `exporter_limits` keeps SentencePiece's own defaults for what the challenge's exporter leaves
    unset (a sentence over 4,192 bytes is skipped; threads): the exporter's tokenizer, piece for piece.
    Otherwise every sentence counts, on one thread, as the embedded corpus has always been trained.
    Writes `<prefix>.model` and `<prefix>.vocab` and returns the .model path.
    """
    prefix = Path(model_prefix)
    model = io.BytesIO()
    options = dict(
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=0.999,
        byte_fallback=byte_fallback,
        split_digits=True,
        normalization_rule_name="nmt_nfkc",
        add_dummy_prefix=False,
        pad_id=0,
        bos_id=1,
        eos_id=2,
        unk_id=3,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    if not exporter_limits:
        options.update(
            num_threads=1,  # multi-threaded training may order merges differently run to run
            shuffle_input_sentence=False,
            max_sentence_length=1 << 20,
        )
    if user_symbols:
        options["user_defined_symbols"] = list(user_symbols)
    if lossless:
        options.update(normalization_rule_name="identity", remove_extra_whitespaces=False)
    raised: list[BaseException] = []

    def sentences() -> Iterator[str]:
        # The trainer turns whatever its iterator raises (a bad document, Ctrl-C) into an error of its
        # own; kept here, it is raised again as it was once the trainer has stopped.
        try:
            yield from texts
        except BaseException as exc:
            raised.append(exc)
            raise

    try:
        spm.SentencePieceTrainer.Train(sentence_iterator=sentences(), model_writer=model, **options)
    except RuntimeError as exc:
        if raised:
            raise raised[0] from None
        # "INTERNAL: src/trainer_interface.cc(638) [condition] what": the staging file and the check are no news
        reason = re.sub(r"^\w+: \S+\(\d+\) \[.*?\] ", "", first_line(exc))
        raise PgolfError(
            f"cannot train a {vocab_size}-piece tokenizer on these documents: {reason}"
        ) from None
    if raised:
        raise raised[0]
    return write_tokenizer(model.getvalue(), prefix)


def training_memory(doc_bytes: int) -> int:
    """Bytes of memory training a tokenizer on documents of `doc_bytes` bytes needs (an estimate)."""
    return int(TRAIN_MEMORY_BASE + TRAIN_MEMORY_PER_BYTE * doc_bytes)


def available_memory() -> int | None:
    """Bytes of memory this machine can give a process now without swapping (Linux's MemAvailable, else
    the free pages the system reports), or None where it does not say."""
    try:
        for line in read_text("/proc/meminfo", "memory information", 1 << 20).splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (PgolfError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_training_memory(docs: int, doc_bytes: int, available: int | None) -> None:
    """Refuse, before any document is read, to train a tokenizer on `docs` documents of `doc_bytes` bytes
    when it needs more than `available` bytes of memory (None: no limit known)."""
    need = training_memory(doc_bytes)
    if available is None or need <= available:
        return
    fits = int(docs * max(available - TRAIN_MEMORY_BASE, 0) / max(need - TRAIN_MEMORY_BASE, 1))

    def gb(n: int) -> str:
        return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.0f} MB"

    raise PgolfError(
        f"training the tokenizer on {docs:,} documents ({gb(doc_bytes)}) needs about {gb(need)} of memory "
        f"(SentencePiece keeps about {TRAIN_MEMORY_PER_BYTE} bytes per byte of them, docs/tokenizers.md) "
        f"and {gb(available)} is available: train it on fewer with --tokenizer-train-docs N (about {fits:,} fit)"
    )


def write_tokenizer(proto: bytes, model_prefix: str | Path) -> Path:
    """Write a serialized SentencePiece model as `<prefix>.model`, its pieces and scores as `<prefix>.vocab`."""
    prefix = Path(model_prefix)
    # Appended, not with_suffix: a prefix such as "tok.v2" keeps its dot.
    path = write_atomic(prefix.parent / f"{prefix.name}.model", proto)
    sp = spm.SentencePieceProcessor(model_proto=proto)
    vocab = "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.vocab_size()))
    write_atomic(prefix.parent / f"{prefix.name}.vocab", vocab.encode("utf-8"))
    return path
