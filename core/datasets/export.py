"""Documents into the challenge's shards: encoded over every core, written as they come.

`export_documents` gives the tokens the challenge's exporter gives (`sp.encode` of each document, BOS
first), with less work: a document's tokens are those of its words, so each word is encoded once and
looked up after that (`BatchEncoder`). SentencePiece normalizes a text (NFKC, whitespace folded, each
space "▁") and then merges pieces; no piece holds a "▁" past its first character, so no merge crosses
the start of a word, and the tokens of a text are the tokens of each of its words ("▁" and what
follows, up to the next "▁") in turn. A tokenizer for which that cannot be checked from its pieces is
used as it is. One document a batch is also encoded whole and compared, as a guard.

Worker processes (one a core) encode batches of documents while this one reads the next and writes
the shards (core/datasets/writers.py's ShardWriter): memory holds a few batches, never a shard.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from core.common.errors import PgolfError
from core.data.shards import MAX_VOCAB
from core.data.tables import byte_tables, stream_bytes
from core.datasets import caseops
from core.datasets.byte_counts import SPACE, TokenBytes
from core.datasets.writers import ShardWriter

ENCODE_BATCH = 1024  # documents a worker encodes at once
WORD_CHUNK = 128  # documents split into words at once
CACHE_WORDS = 1 << 17  # words a process keeps the tokens of; the cache starts over when full
HEAD = "\uffff"  # marks a document's start among a batch's words (a noncharacter: no text holds it)
POOL_MIN_DOCS = 8 * ENCODE_BATCH  # fewer documents are encoded in this process (no workers to start)

Progress = Callable[[str], None]
_ROOT = Path(__file__).resolve().parents[2]  # where `core` is imported from, for the workers


class BatchEncoder:
    """A batch of documents into one token stream, `[bos] + sp.encode(text)` each, and each document's
    length, through a cache of each word's tokens (this module's docstring)."""

    def __init__(
        self, model: bytes, bos: int, case_ops: bool, cache_words: int = CACHE_WORDS, by_words: bool = True
    ):
        self.sp, self.case_ops, self.cache_words = (
            spm.SentencePieceProcessor(model_proto=model),
            case_ops,
            cache_words,
        )
        self.bos, self.bos_bytes = bos, _uint16([bos])
        # a piece written before "▁" + word to encode a word alone; None: documents are encoded whole
        self.anchor = _anchor(self.sp) if by_words and self.sp.is_control(bos) else None
        # HEAD + what comes before a document's first "▁" -> BOS and its tokens; a word (what follows
        # a "▁") -> the tokens of "▁" + word
        self.known: dict[str, bytes] = {}
        self.batches = 0
        self.chunks_whole = 0  # chunks of documents encoded whole, though the tokenizer allows words

    def __call__(self, texts: list[str]) -> tuple[bytes, np.ndarray]:
        if self.case_ops:
            texts = [caseops.encode(text) for text in texts]
        streams, lengths = [], []
        for chunk in batched(texts, WORD_CHUNK):  # a few MB of words at a time
            done = self._by_words(chunk) if self.anchor is not None else None
            self.chunks_whole += done is None and self.anchor is not None
            stream, counts = done or self._whole(chunk)
            streams.append(stream)
            lengths.append(counts)
        stream, lengths = b"".join(streams), np.concatenate(lengths)
        self.batches += 1
        j = self.batches % len(texts)  # one document a batch is encoded whole too, as a guard
        start = int(lengths[:j].sum())
        if stream[2 * start + 2 : 2 * (start + lengths[j])] != _uint16(self.sp.encode(texts[j])):
            raise PgolfError(
                "encoding: a document's tokens word by word differ from SentencePiece's own "
                f"({texts[j][:40]!r}...): please report it"
            )
        return stream, lengths

    def _whole(self, texts: list[str]) -> tuple[bytes, np.ndarray]:
        docs = [_uint16(ids) for ids in self.sp.encode(texts)]
        lengths = np.array([len(ids) // 2 + 1 for ids in docs], dtype=np.int64)
        return self.bos_bytes + self.bos_bytes.join(docs), lengths

    def _by_words(self, texts: list[str]) -> tuple[bytes, np.ndarray] | None:
        """The batch from its words' cached tokens, or None where that is not sure to be the encoding."""
        normalized = [self.sp.normalize(text) for text in texts]
        joined = HEAD + (SPACE + HEAD).join(normalized)
        if joined.count(HEAD) != len(texts):  # a document holds HEAD itself
            return None
        parts = joined.split(SPACE)
        try:
            stream = b"".join(map(self.known.__getitem__, parts))
        except KeyError:
            if not self._learn(parts):
                return None
            stream = b"".join(map(self.known.__getitem__, parts))
        tokens = np.frombuffer(stream, dtype="<u2")
        return stream, np.diff(np.append(np.flatnonzero(tokens == self.bos), len(tokens)))

    def _learn(self, parts: list[str]) -> bool:
        """Encode alone the words and heads of `parts` not known yet; False where one does not encode alone
        as it does in a text."""
        needed = set(parts)
        new = needed.difference(self.known)
        if len(self.known) + len(new) > self.cache_words:  # full: keep only what these parts need
            self.known = {part: self.known[part] for part in needed if part in self.known}
        new_words = [part for part in new if not part.startswith(HEAD)]
        heads = [part[1:] for part in new if part.startswith(HEAD)]
        alone = [self.anchor + SPACE + word for word in new_words]
        anchor = self.sp.piece_to_id(self.anchor)
        for word, written, ids in zip(new_words, alone, self.sp.encode(alone), strict=True):
            if ids[:1] != [anchor] or self.sp.normalize(written) != written:
                return False
            self.known[word] = _uint16(ids[1:])
        for head, ids in zip(heads, self.sp.encode(heads), strict=True):
            if self.sp.normalize(head) != head:
                return False
            self.known[HEAD + head] = self.bos_bytes + _uint16(ids)
        return True


def _anchor(sp: spm.SentencePieceProcessor) -> str | None:
    """A one-character piece that encodes alone and stays as it is, when the tokenizer's encoding is
    its words' (no piece holds "▁" past its first character; "▁" alone is a piece, so no run of
    unknown characters spans two words); else None."""
    space = sp.piece_to_id(SPACE)
    if sp.is_unknown(space) or sp.is_control(space) or sp.is_byte(space) or sp.is_unused(space):
        return None
    if any(SPACE in sp.id_to_piece(i)[1:] for i in range(sp.vocab_size())):
        return None
    for candidate in "a.e0":
        if sp.encode(candidate) == [sp.piece_to_id(candidate)] and sp.normalize(candidate) == candidate:
            return candidate
    return None


def _uint16(ids: list[int]) -> bytes:
    return np.array(ids, dtype="<u2").tobytes()


# --------------------------------------------------------------------- batches, in workers
class Workers:
    """Worker processes that encode batches (`BatchEncoder`), each a fresh Python started with
    `python -c` (nothing of this process copied: it may hold threads and a GPU framework) and a child
    of this one, whose CPU time counts in this one's. Batches go to them in turn over their stdin and
    come back in the same order over their stdout, pickled; each worker reads its stdin on a thread of
    its own, so neither side ever waits on a full pipe."""

    def __init__(self, count: int, settings: tuple):
        path = [str(_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-c", "from core.datasets.export import serve; serve()"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            for _ in range(count)
        ]
        self.sent = self.received = 0
        try:
            for proc in self.procs:
                self._send(proc, settings)  # BatchEncoder's
        except PgolfError:
            self.close()
            raise

    def submit(self, texts: list[str]) -> None:
        self._send(self.procs[self.sent % len(self.procs)], texts)
        self.sent += 1

    def result(self) -> tuple[bytes, np.ndarray]:
        """The result of the oldest batch not yet taken."""
        proc = self.procs[self.received % len(self.procs)]
        self.received += 1
        try:
            answer = pickle.load(proc.stdout)
        except (EOFError, OSError, pickle.UnpicklingError):
            raise PgolfError(f"encoding: a worker process stopped (exit {proc.wait()})") from None
        if isinstance(answer, str):  # a PgolfError's line
            raise PgolfError(answer)
        return answer

    def _send(self, proc: subprocess.Popen, message: Any) -> None:
        try:
            pickle.dump(message, proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            proc.stdin.flush()
        except OSError:
            raise PgolfError(f"encoding: a worker process stopped (exit {proc.wait()})") from None

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # the worker ends at the end of its input
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()


def serve() -> None:
    """A worker's loop (`Workers`): its encoder's settings, then batches, each answered in order."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent, which ends its input
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    requests: queue.Queue = queue.Queue()

    def read() -> None:
        while True:
            try:
                requests.put(pickle.load(source))
            except (EOFError, OSError, pickle.UnpicklingError):
                requests.put(None)
                return

    threading.Thread(target=read, daemon=True).start()
    settings = requests.get()
    if settings is None:
        return
    encode = BatchEncoder(*settings)
    while (texts := requests.get()) is not None:
        try:
            answer: Any = encode(texts)
        except PgolfError as exc:
            answer = str(exc)
        try:
            pickle.dump(answer, sink, protocol=pickle.HIGHEST_PROTOCOL)
            sink.flush()
        except OSError:  # the parent has gone
            return


def encoded_batches(
    docs: Iterable[str],
    sp: spm.SentencePieceProcessor,
    bos: int,
    case_ops: bool,
    workers: int,
    by_words: bool = True,
) -> Iterator[tuple[list[str], bytes, np.ndarray]]:
    """(documents, their token stream, their lengths) batch by batch, in order (`BatchEncoder`; without
    `by_words`, each document encoded whole by SentencePiece); `workers` processes encode while the
    caller works on the batches before, a few batches ahead at most."""
    batches = batched(docs, ENCODE_BATCH)
    settings = (sp.serialized_model_proto(), bos, case_ops, CACHE_WORDS, by_words)
    if workers <= 1:
        encode = BatchEncoder(*settings)
        for texts in batches:
            yield texts, *encode(texts)
        return
    pool = Workers(workers, settings)
    try:
        pending: deque[list[str]] = deque()
        for texts in batches:
            pool.submit(texts)
            pending.append(texts)
            if len(pending) > workers:  # each worker a batch in hand, and the next one waiting
                yield pending.popleft(), *pool.result()
        while pending:
            yield pending.popleft(), *pool.result()
    finally:
        pool.close()


def batched(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


# --------------------------------------------------------------------- shards
def export_documents(
    docs: Iterable[str],
    sp: spm.SentencePieceProcessor,
    out_dir: Path,
    num_val_docs: int,
    shard_tokens: int,
    bos_id: int | None = None,
    case_ops: bool = False,
    exact: bool = False,
    threads: int = 1,
    total_docs: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Tokenize documents into challenge shards: the first num_val_docs are validation.

    Each document is `[bos_id] + ids` (the tokenizer's BOS unless given), no EOS; shards hold
    `shard_tokens` each, documents spanning them. The validation shards `fineweb_val_N.bin` get their
    byte sidecar `fineweb_val_bytes_N.bin` (as many uint16 as tokens, each the bytes of text its token
    stands for, 0 for BOS) with `case_ops`, where tokens are those of the CaseOps-transformed text
    (core/datasets/caseops.py) and count the original bytes; and with `exact`, where they count the
    normalized text's bytes (core/datasets/byte_counts.py), each document's counts checked against its
    text. `threads` worker processes encode (one when there are fewer than POOL_MIN_DOCS documents).
    Returns the counts of documents, tokens and files per split; "tables_exact": whether the tokenizer's
    byte tables count every validation token as its sidecar does (then `exact` needs none); and
    "unknown": the <unk> tokens of all documents, with "unknown_docs" the documents that hold one.
    """
    if sp.vocab_size() > MAX_VOCAB:
        raise PgolfError(f"shards in {out_dir}: {sp.vocab_size()} pieces do not fit uint16 token ids")
    bos = sp.bos_id() if bos_id is None else bos_id
    if not 0 <= bos < sp.vocab_size() or shard_tokens < 1:
        raise PgolfError(f"shards in {out_dir}: need a BOS id in the vocabulary and shard_tokens >= 1")
    counts: dict[str, Any] = {
        f"{what}_{split}": 0 for what in ("docs", "tokens", "files") for split in ("val", "train")
    }
    counts.update(unknown=0, unknown_docs=0)
    streams = ("val", "train", "val_bytes") if case_ops or exact else ("val", "train")
    writers = {name: ShardWriter(out_dir, name, shard_tokens) for name in streams}
    fragments = caseops.piece_fragments(sp) if case_ops else []
    counter = TokenBytes(sp) if exact and not case_ops else None
    tables = byte_tables(sp, sp.vocab_size()) if counter is not None else None
    tables_exact = counter is not None
    unk = sp.unk_id()
    say = progress or (lambda message: None)
    started = last_said = time.monotonic()
    workers = threads if (total_docs or 0) >= POOL_MIN_DOCS else 1
    done = 0
    try:
        for texts, stream, lengths in encoded_batches(docs, sp, bos, case_ops, workers):
            tokens = np.frombuffer(stream, dtype="<u2")
            ends = np.cumsum(lengths)
            n_val = min(max(num_val_docs - done, 0), len(texts))
            cut = int(ends[n_val - 1]) if n_val else 0
            if n_val:
                writers["val"].write(tokens[:cut])
            if n_val and len(streams) == 3:
                sidecar = []
                for j in range(n_val):
                    ids, text = tokens[ends[j] - lengths[j] + 1 : ends[j]], texts[j]
                    if case_ops:
                        spelled = caseops.token_bytes(fragments, ids, text)
                    else:
                        try:
                            spelled = counter.document_bytes(text, ids)
                        except PgolfError as exc:
                            raise PgolfError(f"validation document {done + j}: {exc}") from None
                    sidecar += [np.zeros(1, np.int64), spelled.astype(np.int64)]
                sidecar = np.concatenate(sidecar)
                if tables_exact:
                    tables_exact = bool(np.array_equal(sidecar, stream_bytes(tokens[:cut], tables)))
                writers["val_bytes"].write(sidecar.astype(np.uint16))
            if n_val < len(texts):
                writers["train"].write(tokens[cut:])
            counts["docs_val"] += n_val
            counts["docs_train"] += len(texts) - n_val
            counts["tokens_val"] += cut
            counts["tokens_train"] += len(tokens) - cut
            if unk >= 0:
                where = np.flatnonzero(tokens == unk)
                counts["unknown"] += len(where)
                counts["unknown_docs"] += len(np.unique(np.searchsorted(ends, where, side="right")))
            done += len(texts)
            now = time.monotonic()
            if now - last_said >= 1:
                last_said = now
                say(
                    _progress_line(
                        done, total_docs, counts["tokens_val"] + counts["tokens_train"], now - started
                    )
                )
        for writer in writers.values():
            writer.close()
    finally:
        for writer in writers.values():
            writer.discard()
    counts["files_val"], counts["files_train"] = writers["val"].files, writers["train"].files
    counts["tables_exact"] = tables_exact
    if counts["unknown"]:
        warnings.warn(
            f"the tokenizer has no byte fallback: {counts['unknown']:,} <unk> tokens in "
            f"{counts['unknown_docs']:,} of {done:,} documents stand for characters it has no piece for, "
            "which the challenge's byte tables count as 0 bytes (docs/tokenizers.md)",
            stacklevel=2,
        )
    return counts


def _progress_line(docs: int, total: int | None, tokens: int, seconds: float) -> str:
    line = f"tokenizing: {docs:,}{f'/{total:,}' if total else ''} documents, {tokens:,} tokens"
    if total and docs:
        left = seconds * (total - docs) / docs
        line += f", {int(left) // 60}:{int(left) % 60:02d} left"
    return line
