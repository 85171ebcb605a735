"""Making a dataset: a tokenizer, the challenge's shards, a validation byte sidecar where the byte
tables would miscount, and the manifest entry, from documents.

`prepare_docs` makes one from any documents as the challenge's exporter makes its own (its
`data/download_hf_docs_and_tokenize.py`): a JSON-lines file with a "text" field (its
`docs_selected.jsonl` format), or a folder of .txt files, one document each. The first N documents
are validation, the rest train; the tokenizer is trained on all of them with the challenge's recipe
(core/datasets/writers.py), so the same documents give the exporter's tokenizer and shards byte for
byte (tests/golden/make_challenge_export.py records them). The embedded corpus
(core/datasets/embedded.py) is another caller of `build_dataset`, with its own split and tokenizer.

A dataset is built in a staging folder and moved into place whole: `datasets/<name>` is a symbolic
link to the folder of shards, `datasets/.<name>-<n>`, replaced in one rename, and only then is the
manifest updated. An interruption at any moment (Ctrl-C, kill -9, power loss) leaves `datasets/<name>`
the old dataset or the new one, whole, and the manifest never lists a dataset that is absent.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from core.common.errors import PgolfError
from core.common.files import (
    WriterLock,
    file_sha256,
    make_dir,
    open_regular,
    parse_json,
    read_file,
    read_text,
    sync,
    text_lines,
)
from core.data.manifest import merge_manifest, shard_digests
from core.data.shards import MAX_VOCAB
from core.data.tables import byte_tables, token_bytes
from core.data.tokenizer import MAX_TOKENIZER_BYTES, load_tokenizer
from core.datasets import caseops
from core.datasets.byte_counts import TokenBytes
from core.datasets.writers import train_tokenizer, write_shard, write_tokenizer

SHARD_TOKENS = 10**8  # tokens per shard, as in the challenge export
VAL_DOCS = 50_000  # the challenge's validation split: its first 50,000 documents
ENCODE_BATCH = 1024  # documents encoded at once, over all cores

Progress = Callable[[str], None]


# --------------------------------------------------------------------- documents
def read_documents(path: str | Path) -> Iterator[str]:
    """The documents of a JSON-lines file (each line an object with a "text" string), or of a folder
    of .txt files (sorted by name, each file one document), as they are: the shards encode them so.
    Each is read through the guarded readers (core/common/files.py): a line or file that is not a
    document is a PgolfError naming the file and line."""
    path = Path(path)
    if path.is_dir():
        for file in sorted(path.glob("*.txt")):
            yield read_text(file, "document")
        return
    _check_docs_path(path)
    for number, line in text_lines(path, "documents"):
        where = f"documents {path} line {number}"
        value = parse_json(line, where)
        text = value.get("text") if isinstance(value, dict) else None
        if not isinstance(text, str):
            raise PgolfError(f'{where}: not a JSON object with a "text" string')
        yield text


def count_documents(path: str | Path) -> int:
    """How many documents `read_documents` gives: .txt files, or lines (split at each newline, the last
    one counted without it); read as bytes, the documents themselves are checked as they are read."""
    path = Path(path)
    if path.is_dir():
        return len(list(path.glob("*.txt")))
    _check_docs_path(path)
    lines, last = 0, b"\n"
    with open_regular(path, "documents") as f:
        try:
            while piece := f.read(1 << 24):
                lines += piece.count(b"\n")
                last = piece[-1:]
        except OSError as exc:
            raise PgolfError(f"documents {path}: cannot read ({exc.strerror or exc})") from None
    return lines + (last != b"\n")


def _check_docs_path(path: Path) -> None:
    if not path.exists() and not path.is_symlink():
        raise PgolfError(
            f'documents {path}: no such file or folder (JSON lines with a "text" field, or .txt files)'
        )


def training_texts(docs: Iterable[str]) -> Iterator[str]:
    """What the challenge's exporter trains its tokenizer on: each document, NULs as spaces, stripped;
    empty ones left out."""
    for text in docs:
        text = text.replace("\x00", " ").strip()
        if text:
            yield text


# --------------------------------------------------------------------- shards
def export_documents(
    docs: Iterable[str],
    sp: spm.SentencePieceProcessor,
    out_dir: Path,
    num_val_docs: int,
    shard_tokens: int = SHARD_TOKENS,
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
    text. Returns the counts of documents, tokens and files per split, and "tables_exact": whether the
    tokenizer's byte tables count every validation token as its sidecar does (then `exact` needs none).
    """
    if sp.vocab_size() > MAX_VOCAB:
        raise PgolfError(f"shards in {out_dir}: {sp.vocab_size()} pieces do not fit uint16 token ids")
    bos = sp.bos_id() if bos_id is None else bos_id
    if not 0 <= bos < sp.vocab_size() or shard_tokens < 1:
        raise PgolfError(f"shards in {out_dir}: need a BOS id in the vocabulary and shard_tokens >= 1")
    counts: dict[str, Any] = {
        f"{what}_{split}": 0 for what in ("docs", "tokens", "files") for split in ("val", "train")
    }
    streams = ("val", "train", "val_bytes") if case_ops or exact else ("val", "train")
    buffers: dict[str, list[np.ndarray]] = {name: [] for name in streams}
    files, filled = dict.fromkeys(streams, 0), dict.fromkeys(streams, 0)
    fragments = caseops.piece_fragments(sp) if case_ops else []
    counter = TokenBytes(sp) if exact and not case_ops else None
    tables = byte_tables(sp, sp.vocab_size()) if counter is not None else None
    tables_exact = counter is not None
    say = progress or (lambda message: None)
    started = last_said = time.monotonic()

    def flush(name: str, final: bool) -> None:
        # A sidecar's buffer always holds as many entries as the validation tokens' buffer, so
        # flushing both at the same moments gives both the same shard layout.
        data = np.concatenate(buffers[name]) if buffers[name] else np.zeros(0, dtype=np.uint16)
        while len(data) >= shard_tokens or (final and len(data)):
            write_shard(out_dir / f"fineweb_{name}_{files[name]:06d}.bin", data[:shard_tokens])
            files[name] += 1
            data = data[shard_tokens:]
        buffers[name], filled[name] = ([data] if len(data) else []), len(data)

    i = 0
    for batch in batched(docs, ENCODE_BATCH):
        inputs = [caseops.encode(text) for text in batch] if case_ops else batch
        for text, encoded in zip(batch, sp.encode(inputs, num_threads=threads), strict=True):
            split = "val" if i < num_val_docs else "train"
            ids = np.array([bos, *encoded], dtype=np.uint16)
            buffers[split].append(ids)
            filled[split] += len(ids)
            if split == "val" and case_ops:
                sidecar = caseops.token_bytes(fragments, encoded, text)
                buffers["val_bytes"].append(np.concatenate([np.zeros(1, np.uint16), sidecar]))
            elif split == "val" and counter is not None:
                try:
                    spelled = counter.document_bytes(text, encoded)
                except PgolfError as exc:
                    raise PgolfError(f"validation document {i}: {exc}") from None
                if tables_exact and len(encoded):
                    tables_exact = bool(np.array_equal(spelled, token_bytes(ids[:-1], ids[1:], tables)))
                buffers["val_bytes"].append(np.concatenate([[0], spelled]).astype(np.uint16))
            counts[f"docs_{split}"] += 1
            counts[f"tokens_{split}"] += len(ids)
            if filled[split] >= shard_tokens:
                for name in streams:
                    if name.startswith(split):
                        flush(name, final=False)
            i += 1
        now = time.monotonic()
        if now - last_said >= 1:
            last_said = now
            say(_progress_line(i, total_docs, counts["tokens_val"] + counts["tokens_train"], now - started))
    for name in streams:
        flush(name, final=True)
    counts["files_val"], counts["files_train"] = files["val"], files["train"]
    counts["tables_exact"] = tables_exact
    return counts


def batched(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _progress_line(docs: int, total: int | None, tokens: int, seconds: float) -> str:
    line = f"tokenizing: {docs:,}{f'/{total:,}' if total else ''} documents, {tokens:,} tokens"
    if total and docs:
        left = seconds * (total - docs) / docs
        line += f", {int(left) // 60}:{int(left) % 60:02d} left"
    return line


# --------------------------------------------------------------------- datasets
def _move_into_place(stage: Path, root: Path, name: str, tok_name: str) -> Path:
    """Swap the staged tokenizer, then the staged shards, in for any older ones; return the tokenizer path.

    The shards' link comes last: once it exists the dataset is whole (torchrun's other ranks wait for it).
    """
    tokenizers = make_dir(root / "tokenizers")
    for suffix in (".model", ".vocab"):
        os.replace(stage / f"{tok_name}{suffix}", tokenizers / f"{tok_name}{suffix}")
    sync(tokenizers)
    datasets = make_dir(root / "datasets")
    out_dir, shards = datasets / name, datasets / f".{name}-{time.time_ns()}"
    (stage / "shards").rename(shards)
    os.symlink(shards.name, stage / "link")  # relative: the data folder may be moved elsewhere
    if out_dir.is_dir() and not out_dir.is_symlink():  # a plain folder, from an older pgolf
        out_dir.rename(stage / "previous")  # the one moment without a dataset, once
    os.replace(stage / "link", out_dir)
    sync(datasets)
    for old in datasets.glob(f".{name}-*"):  # what the link no longer names
        if old != shards:
            shutil.rmtree(old, ignore_errors=True)
    return tokenizers / f"{tok_name}.model"


def build_dataset(
    out_root: str | Path,
    name: str,
    tok_name: str,
    make_tokenizer: Callable[[Path], Path],
    docs: Callable[[], Iterable[str]],
    num_val_docs: int,
    shard_tokens: int = SHARD_TOKENS,
    case_ops: bool = False,
    exact: bool = False,
    source: dict[str, Any] | None = None,
    total_docs: int | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Build dataset `name` under out_root: `make_tokenizer(prefix)` writes `<prefix>.model` and
    `.vocab` and returns the model's path; `docs()` gives the documents, validation first. With `exact`
    the validation byte sidecar is kept only where the byte tables would count differently.
    `source` (the documents: a file, or the embedded corpus) goes into the manifest entry as "docs",
    for `data verify --bytes`. Returns a short summary for the CLI to print."""
    make_dir(Path(out_root), "data folder")
    with WriterLock(out_root, "data folder"):  # one writer of a data folder at a time
        say = progress or (lambda message: None)
        root = Path(out_root)
        out_dir = root / "datasets" / name
        # Everything is built in a staging folder and moved into place only when complete: an
        # interrupted or failed run leaves the previous dataset as it was (and its staging folder,
        # when killed, which the next run clears first).
        stage = root / f".staging-{name}"
        shutil.rmtree(stage, ignore_errors=True)
        make_dir(stage)
        try:
            sp = load_tokenizer(make_tokenizer(stage / tok_name))
            say(f"tokenizing {total_docs or 'the'} documents into {out_dir}")
            counts = export_documents(
                docs(), sp, stage / "shards", num_val_docs, shard_tokens, sp.bos_id(), case_ops, exact,
                os.cpu_count() or 1, total_docs, progress,
            )  # fmt: skip
            sidecar = case_ops or (exact and not counts["tables_exact"])
            if not sidecar:
                for extra in (stage / "shards").glob("fineweb_val_bytes_*.bin"):
                    extra.unlink()
            digests = shard_digests(stage / "shards")
            model_path = _move_into_place(stage, root, name, tok_name)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        vocab_size = sp.vocab_size()
        dataset = {
            "name": name,
            "tokenizer_name": tok_name,
            "tokenizer_kind": "sentencepiece_bpe",
            "path": f"datasets/{name}",
            "train_glob": f"datasets/{name}/fineweb_train_*.bin",
            "val_glob": f"datasets/{name}/fineweb_val_*.bin",
            "vocab_size": vocab_size,
            **({"val_bytes_glob": f"datasets/{name}/fineweb_val_bytes_*.bin"} if sidecar else {}),
            "sha256": digests,
            "bos_id": sp.bos_id(),
            "eos_id": sp.eos_id(),
            **({"docs": source} if source else {}),
            "stats": {
                "docs_total": counts["docs_val"] + counts["docs_train"],
                "docs_val": counts["docs_val"],
                "docs_train": counts["docs_train"],
                "files_total": counts["files_val"] + counts["files_train"],
                "files_val": counts["files_val"],
                "files_train": counts["files_train"],
                "tokens_total": counts["tokens_val"] + counts["tokens_train"],
                "tokens_val": counts["tokens_val"],
                "tokens_train": counts["tokens_train"],
            },
        }
        tokenizer = {
            "name": tok_name,
            "kind": "sentencepiece_bpe",
            "vocab_size": vocab_size,
            "sha256": digests,
            "bos_id": sp.bos_id(),
            "eos_id": sp.eos_id(),
            "model_path": f"tokenizers/{tok_name}.model",
            "vocab_path": f"tokenizers/{tok_name}.vocab",
            **({"text_transform": caseops.TRANSFORM} if case_ops else {}),
        }
        merge_manifest(root, dataset, tokenizer)
        summary = {
            "dataset": str(out_dir),
            "tokenizer": str(model_path),
            "documents": f"{counts['docs_val']} validation + {counts['docs_train']} train",
            "tokens": f"{counts['tokens_val']:,} validation + {counts['tokens_train']:,} train",
        }
        if exact and not case_ops:
            summary["byte counts"] = (
                "the tokenizer's byte tables are exact on the validation text"
                if counts["tables_exact"]
                else "validation byte sidecar written: the tokenizer's byte tables would miscount"
            )
        return summary


def prepare_docs(
    docs_path: str | Path,
    out_root: str | Path = Path("data"),
    name: str | None = None,
    vocab_size: int | None = None,
    val_docs: int = VAL_DOCS,
    shard_tokens: int = SHARD_TOKENS,
    tokenizer: str | Path | None = None,
    case_ops: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """A dataset and tokenizer from the documents at `docs_path`, as the challenge's exporter makes them.

    The first `val_docs` documents are validation. Without `tokenizer` a BPE tokenizer of `vocab_size`
    pieces (default 1024) is trained on every document with the challenge's recipe; with it, that
    SentencePiece model is used as it is. `case_ops` applies the lossless case transform first
    (core/datasets/caseops.py): its tokenizer keeps the text as it is, and the validation shards get
    their byte sidecar. The dataset is `name` (default `<docs file stem>_sp<V>`), its tokenizer
    `tokenizers/<name>.model`.
    """
    docs_path = Path(docs_path)
    if shard_tokens < 1:
        raise PgolfError(f"--shard-tokens must be at least 1, got {shard_tokens}")
    if vocab_size is not None and not 1 < vocab_size <= MAX_VOCAB:
        raise PgolfError(f"--vocab-size must be in 2..{MAX_VOCAB} (uint16 shards), got {vocab_size}")
    say = progress or (lambda message: None)
    say(f"counting the documents of {docs_path}")
    total = count_documents(docs_path)
    if not 1 <= val_docs < total:
        raise PgolfError(
            f"{docs_path} holds {total:,} documents: --val-docs {val_docs:,} must leave at least one "
            "for training and be at least 1"
        )
    given = None
    if tokenizer is not None:
        given = load_tokenizer(tokenizer)
        if vocab_size is not None and given.vocab_size() != vocab_size:
            raise PgolfError(
                f"tokenizer {tokenizer} has {given.vocab_size()} pieces, not --vocab-size {vocab_size}"
            )
        vocab_size = given.vocab_size()
    vocab_size = vocab_size or 1024
    name = name or f"{docs_path.stem}_sp{vocab_size}{'_caseops' if case_ops else ''}"
    if not name or "/" in name or name.startswith("."):
        raise PgolfError(f"--name {name!r}: a dataset name is one plain folder name")

    def make_tokenizer(prefix: Path) -> Path:
        if tokenizer is not None:
            return write_tokenizer(read_file(tokenizer, "tokenizer", MAX_TOKENIZER_BYTES), prefix)
        say(f"training a {vocab_size}-piece BPE tokenizer on {total:,} documents")
        texts = read_documents(docs_path)
        model = train_tokenizer(
            training_texts(caseops.encode(t) for t in texts) if case_ops else training_texts(texts),
            vocab_size, prefix, user_symbols=caseops.OPERATORS if case_ops else (), lossless=case_ops,
            exporter_limits=True,
        )  # fmt: skip
        pieces = load_tokenizer(model).vocab_size()
        if (
            pieces != vocab_size
        ):  # the trainer stops short of vocab_size on little text (hard_vocab_limit=False)
            raise PgolfError(
                f"the tokenizer has only {pieces} pieces: too little text for --vocab-size {vocab_size}"
            )
        return model

    source = {
        "path": str(docs_path.resolve()),
        "sha256": None if docs_path.is_dir() else file_sha256(docs_path, "documents"),
        "documents": total,
        "val_docs": val_docs,
    }
    return build_dataset(
        out_root, name, name, make_tokenizer, lambda: read_documents(docs_path), val_docs, shard_tokens,
        case_ops, exact=True, source=source, total_docs=total, progress=progress,
    )  # fmt: skip
