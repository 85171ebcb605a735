"""Making a dataset: a tokenizer, the challenge's shards, a validation byte sidecar where the byte
tables would miscount, and the manifest entry, from documents.

`prepare_docs` makes one from any documents as the challenge's exporter makes its own (its
`data/download_hf_docs_and_tokenize.py`): a JSON-lines file with a "text" field (its
`docs_selected.jsonl` format), or a folder of .txt files, one document each. The first N documents
are validation, the rest train; the tokenizer is trained on all of them with the challenge's recipe
(core/datasets/writers.py), so the same documents give the exporter's tokenizer and shards byte for
byte (tests/golden/make_challenge_export.py records them). The embedded corpus
(core/datasets/embedded.py) is another caller of `build_dataset`, with its own split and tokenizer.

A dataset is replaced as one unit. Its shards, sidecars and tokenizer are built in a staging folder
and moved whole to a versioned folder, `datasets/.<name>-<n>`; then the manifest entry, which names
that folder, is written (one rename), then the link `datasets/<name>` is switched to it (one rename);
`tokenizers/<tok>.model` and `.vocab` are links through `datasets/<name>`, so they switch with it.
Only then are the old folders removed. The manifest and every path it will replace are checked
before any work. A stop at any moment (an error, kill -9, power loss) leaves the manifest, and the
link, each naming a whole dataset with its own tokenizer, the old one or the new one (between the two
renames: the manifest the new one, the link the old one); Ctrl-C and SIGTERM wait for the renames.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

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
    remove_stale_temps,
    sync,
    text_lines,
    write_atomic,
)
from core.data.manifest import merge_manifest, read_manifest, shard_digests
from core.data.shards import MAX_VOCAB
from core.data.tokenizer import MAX_TOKENIZER_BYTES, load_tokenizer
from core.datasets import caseops
from core.datasets.export import Progress, export_documents
from core.datasets.writers import available_memory, check_training_memory, train_tokenizer, write_tokenizer

SHARD_TOKENS = 10**8  # tokens per shard, as in the challenge export
VAL_DOCS = 50_000  # the challenge's validation split: its first 50,000 documents


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


def _leading_bytes(path: Path, docs: int) -> int:
    """The bytes of the first `docs` documents of `path` as stored (.txt files, or JSON lines)."""
    if path.is_dir():
        return sum(_size(file) for file in sorted(path.glob("*.txt"))[:docs])
    size = 0
    with open_regular(path, "documents") as f:
        try:
            while docs > 0 and (piece := f.read(1 << 24)):
                lines = piece.count(b"\n")
                if lines < docs:
                    size, docs = size + len(piece), docs - lines
                    continue
                end = -1
                for _ in range(docs):  # the last piece: up to its docs-th newline
                    end = piece.index(b"\n", end + 1)
                return size + end + 1
        except OSError as exc:
            raise PgolfError(f"documents {path}: cannot read ({exc.strerror or exc})") from None
    return size


def _size(file: Path) -> int:
    """Its bytes; 0 where it cannot be read (reading it says why)."""
    try:
        return file.stat().st_size
    except OSError:
        return 0


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


# --------------------------------------------------------------------- datasets
# The steps of making a dataset, in order: `at_step` is called after each.
SWITCH_STEPS = (
    "checked",
    "staged",
    "tokenizer linked",
    "moved",
    "manifest written",
    "dataset linked",
    "old removed",
)


def at_step(step: str) -> None:
    """Called once a prepare has passed `step` (one of SWITCH_STEPS); does nothing. A test replaces it to
    stop the process there (tests/test_files.py)."""


def check_targets(root: Path, name: str, tok_name: str) -> None:
    """What making dataset `name` will change, checked before any work: the manifest readable, the
    tokenizer's name and files no other dataset's, and each path it replaces one it can replace."""
    manifest = read_manifest(root)
    files = {PurePosixPath(f"tokenizers/{tok_name}{suffix}") for suffix in (".model", ".vocab")}
    for entry in manifest["datasets"]:
        if entry.get("tokenizer_name") == tok_name and entry.get("name") != name:
            raise PgolfError(
                f"tokenizer {tok_name}: {root / 'manifest.json'} lists it as dataset {entry.get('name')}'s "
                "(a dataset's tokenizer is its own): choose another --name"
            )
    for entry in manifest["tokenizers"]:
        taken = [str(entry.get(key)) for key in ("model_path", "vocab_path") if entry.get("name") != tok_name]
        if files & {PurePosixPath(path) for path in taken}:
            raise PgolfError(
                f"tokenizer {tok_name}: {root / 'manifest.json'} lists tokenizers/{tok_name}.model or .vocab "
                f"as tokenizer {entry.get('name')}'s file: choose another --name"
            )
    datasets, tokenizers = root / "datasets", root / "tokenizers"
    for folder in (root, datasets, tokenizers):
        if folder.exists() and not (folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)):
            raise PgolfError(f"cannot write dataset {name}: {folder} is not a folder this process may write")
    targets = [(datasets / name, Path.is_dir, "dataset")]
    targets += [
        (tokenizers / f"{tok_name}{suffix}", Path.is_file, "tokenizer") for suffix in (".model", ".vocab")
    ]
    for path, kind_ok, what in targets:  # absent, or a link (replaced), or what an older pgolf wrote there
        if path.exists() and not path.is_symlink() and not kind_ok(path):
            raise PgolfError(
                f"cannot write {what} {path}: something else is in its place (a file, folder or FIFO)"
            )


def _place_link(path: Path, target: str) -> None:
    """Make `path` a symbolic link to `target` in one rename; the temp link is named as write_atomic names
    its temp files, so that one a killed process left is removed by the next write into the folder."""
    remove_stale_temps(path.parent)
    temp = path.parent / f".{path.name}.pgolf-{os.getpid()}-link.tmp"
    temp.unlink(missing_ok=True)
    os.symlink(target, temp)
    os.replace(temp, path)


def _link_tokenizer(root: Path, name: str, tok_name: str) -> None:
    """`tokenizers/<tok>.model` and `.vocab` as links through `datasets/<name>` to the files its folder
    holds, made once. Data an older pgolf made is brought into this layout first without changing what
    any reader sees: a plain dataset folder becomes a versioned one behind a link (the one moment
    without it), and the tokenizer files that were in tokenizers/ are copied into it before their
    links replace them."""
    datasets, tokenizers = make_dir(root / "datasets"), make_dir(root / "tokenizers")
    dataset = datasets / name
    if dataset.is_dir() and not dataset.is_symlink():
        adopted = f".{name}-{time.time_ns()}"
        dataset.rename(datasets / adopted)
        _place_link(dataset, adopted)
    for suffix in (".model", ".vocab"):
        path, target = tokenizers / f"{tok_name}{suffix}", f"../datasets/{name}/{tok_name}{suffix}"
        if path.is_symlink() and os.readlink(path) == target:
            continue
        beside = dataset / f"{tok_name}{suffix}"
        if path.is_file() and dataset.is_dir() and not beside.exists():
            write_atomic(beside, read_file(path, "tokenizer", MAX_TOKENIZER_BYTES))
        _place_link(path, target)
    sync(tokenizers)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait while the dataset is switched (a few renames): they are kept, and sent
    again once it is whole (a blocked signal mask would not do: another thread would take them)."""
    kept: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM) if threading.current_thread() is threading.main_thread() else ()
    previous = {signum: signal.signal(signum, lambda signum, frame: kept.append(signum)) for signum in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if kept:
            signal.raise_signal(kept[0])


def _switch(
    root: Path, staged: Path, version: str, dataset: dict[str, Any], tokenizer: dict[str, Any]
) -> None:
    """Put the staged folder (shards, sidecars, tokenizer) in place as `datasets/<version>` and switch to
    it: first the manifest, whose entry names that folder, then the link `datasets/<name>`, which the
    tokenizer's links in tokenizers/ go through. Each is one rename, and at every moment between them
    the manifest and the link each name a whole dataset with its own tokenizer."""
    name, tok_name = dataset["name"], tokenizer["name"]
    _link_tokenizer(root, name, tok_name)
    at_step("tokenizer linked")
    datasets = root / "datasets"
    staged.rename(datasets / version)
    sync(datasets)
    try:
        at_step("moved")
        merge_manifest(root, dataset, tokenizer)
    except BaseException:
        shutil.rmtree(datasets / version, ignore_errors=True)  # named by nothing yet
        raise
    at_step("manifest written")
    _place_link(datasets / name, version)  # relative: the data folder may be moved elsewhere
    sync(datasets)
    at_step("dataset linked")


def _remove_old(root: Path, name: str, version: str) -> None:
    """The versioned folders of dataset `name` other than `version`: neither the manifest nor the link
    names them any more."""
    versions = re.compile(rf"\.{re.escape(name)}-\d+")
    for old in (root / "datasets").iterdir():
        if versions.fullmatch(old.name) and old.name != version:
            shutil.rmtree(old, ignore_errors=True)


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
        check_targets(root, name, tok_name)
        at_step("checked")
        out_dir = root / "datasets" / name
        # Everything is built in a staging folder and moved into place only when complete: an
        # interrupted or failed run leaves the previous dataset as it was (and its staging folder,
        # when killed, which the next run clears first).
        stage = root / f".staging-{name}"
        shutil.rmtree(stage, ignore_errors=True)
        staged = make_dir(stage) / "dataset"
        version = f".{name}-{time.time_ns()}"
        try:
            sp = load_tokenizer(make_tokenizer(staged / tok_name))
            say(f"tokenizing {total_docs or 'the'} documents into {out_dir}")
            counts = export_documents(
                docs(), sp, staged, num_val_docs, shard_tokens, sp.bos_id(), case_ops, exact,
                os.cpu_count() or 1, total_docs, progress,
            )  # fmt: skip
            sidecar = case_ops or (exact and not counts["tables_exact"])
            if not sidecar:
                for extra in staged.glob("fineweb_val_bytes_*.bin"):
                    extra.unlink()
            digests = shard_digests(staged)
            at_step("staged")
            dataset, tokenizer = _entries(
                name, tok_name, version, sp, digests, counts, sidecar, case_ops, source
            )
            with _signals_held():
                _switch(root, staged, version, dataset, tokenizer)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        _remove_old(root, name, version)
        at_step("old removed")
        summary = {
            "dataset": str(out_dir),
            "tokenizer": str(root / "tokenizers" / f"{tok_name}.model"),
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


def _entries(
    name: str,
    tok_name: str,
    version: str,
    sp: spm.SentencePieceProcessor,
    digests: dict[str, str],
    counts: dict[str, Any],
    sidecar: bool,
    case_ops: bool,
    source: dict[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest entries of a dataset and its tokenizer, naming the versioned folder that holds both."""
    folder = f"datasets/{version}"
    dataset = {
        "name": name,
        "tokenizer_name": tok_name,
        "tokenizer_kind": "sentencepiece_bpe",
        "path": folder,
        "train_glob": f"{folder}/fineweb_train_*.bin",
        "val_glob": f"{folder}/fineweb_val_*.bin",
        "vocab_size": sp.vocab_size(),
        **({"val_bytes_glob": f"{folder}/fineweb_val_bytes_*.bin"} if sidecar else {}),
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
        "vocab_size": sp.vocab_size(),
        "sha256": digests,
        "bos_id": sp.bos_id(),
        "eos_id": sp.eos_id(),
        "model_path": f"{folder}/{tok_name}.model",
        "vocab_path": f"{folder}/{tok_name}.vocab",
        **({"text_transform": caseops.TRANSFORM} if case_ops else {}),
    }
    return dataset, tokenizer


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
    tokenizer_train_docs: int | None = None,
    memory_limit: int | None = None,
) -> dict[str, Any]:
    """A dataset and tokenizer from the documents at `docs_path`, as the challenge's exporter makes them.

    The first `val_docs` documents are validation. Without `tokenizer` a BPE tokenizer of `vocab_size`
    pieces (default 1024) is trained on every document, or on the first `tokenizer_train_docs`, with the
    challenge's recipe, once the memory that needs is found to fit `memory_limit` bytes (default: what
    the machine has available); with `tokenizer`, that SentencePiece model is used as it is. `case_ops` applies the lossless case transform first
    (core/datasets/caseops.py): its tokenizer keeps the text as it is, and the validation shards get
    their byte sidecar. The dataset is `name` (default `<docs file stem>_sp<V>`), its tokenizer
    `tokenizers/<name>.model`.
    """
    docs_path = Path(docs_path)
    if shard_tokens < 1:
        raise PgolfError(f"--shard-tokens must be at least 1, got {shard_tokens}")
    if vocab_size is not None and not 1 < vocab_size <= MAX_VOCAB:
        raise PgolfError(f"--vocab-size must be in 2..{MAX_VOCAB} (uint16 shards), got {vocab_size}")
    if tokenizer_train_docs is not None and (tokenizer is not None or tokenizer_train_docs < 1):
        raise PgolfError(
            f"--tokenizer-train-docs {tokenizer_train_docs}: a number of documents, at least 1, to train "
            "a tokenizer on (not with --tokenizer)"
        )
    if tokenizer is not None:
        given = load_tokenizer(tokenizer)
        if vocab_size is not None and given.vocab_size() != vocab_size:
            raise PgolfError(
                f"tokenizer {tokenizer} has {given.vocab_size()} pieces, not --vocab-size {vocab_size}"
            )
        vocab_size = given.vocab_size()
    vocab_size = vocab_size or 1024
    if name is None:
        name = f"{docs_path.stem}_sp{vocab_size}{'_caseops' if case_ops else ''}"
    if not name or "/" in name or "\0" in name or name.startswith("."):
        raise PgolfError(f"--name {name!r}: a dataset name is one plain folder name, not empty")
    check_targets(Path(out_root), name, name)  # again under the data folder's lock, before any change
    say = progress or (lambda message: None)
    say(f"counting the documents of {docs_path}")
    total = count_documents(docs_path)
    if not 1 <= val_docs < total:
        raise PgolfError(
            f"{docs_path} holds {total:,} documents: --val-docs {val_docs:,} must leave at least one "
            "for training and be at least 1"
        )
    train_docs = total if tokenizer_train_docs is None else min(tokenizer_train_docs, total)
    if tokenizer is None:
        limit = available_memory() if memory_limit is None else memory_limit
        check_training_memory(train_docs, _leading_bytes(docs_path, train_docs), limit)

    def make_tokenizer(prefix: Path) -> Path:
        if tokenizer is not None:
            return write_tokenizer(read_file(tokenizer, "tokenizer", MAX_TOKENIZER_BYTES), prefix)
        say(f"training a {vocab_size}-piece BPE tokenizer on {train_docs:,} documents")
        texts = itertools.islice(read_documents(docs_path), train_docs)
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
