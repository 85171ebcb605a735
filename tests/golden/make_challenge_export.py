"""Golden of the challenge's exporter: the tokenizer and shards its own functions make from documents.

The exporter (`data/download_hf_docs_and_tokenize.py` of openai/parameter-golf) is not part of
pgolf and is never copied here: this script imports it from the path given in an environment
variable and calls its `build_sentencepiece_tokenizer` and `export_shards` (CPU only; its module
imports huggingface_hub, which they do not use). From a clone at commit
4908dc46f21ed3fdd08d2fdca285deb2194b9599 (the file's git blob is checked below):

    M=<clone>; git -C $M show 4908dc46f21ed3fdd08d2fdca285deb2194b9599:data/download_hf_docs_and_tokenize.py \\
        > /tmp/exporter.py
    CHALLENGE_EXPORTER=/tmp/exporter.py .venv/bin/python tests/golden/make_challenge_export.py

It writes ``tests/golden/challenge_export.json``: the documents (tests/golden_data.py's
``write_export_docs``: paragraphs of the embedded corpus, and lines with accents, CJK, emoji, runs of
spaces and a NUL) and their SHA-256, the export's settings, the SHA-256 of its tokenizer's pieces,
scores and types (``tokenizer_digest``) and of each shard, once trained and once reusing the
challenge's sp1024 model (its ``--reuse_sp_model``); under "train_docs", the same for documents whose
first ``TRAIN_DOCS`` differ from the rest (``write_train_docs_docs``) with the tokenizer trained on
those only (its ``--tokenizer-train-docs``), and the digest of the tokenizer trained on all of them;
and what made them: SentencePiece's version and the threads. The
tokenizer's trainer runs on SentencePiece's default threads (16); BPE merges are counted exactly,
so the pieces do not depend on them, which the test's agreement on another machine confirms.

With ``--docs FILE --vocab-size V --val-docs N --shard-tokens T [--reuse MODEL]`` it prints the same
digests for any documents instead (how docs/tokenizers.md's figures were checked).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.golden_data import (  # noqa: E402
    CHALLENGE_EXPORT,
    TRAIN_DOCS,
    shard_sha256,
    tokenizer_digest,
    write_export_docs,
    write_train_docs_docs,
)

MIRROR_COMMIT = "4908dc46f21ed3fdd08d2fdca285deb2194b9599"
EXPORTER_BLOB = "dcabd40b75e1befaacd503d072b049aa09b2923a"
SETTINGS = {"vocab_size": 512, "val_docs": 200, "shard_tokens": 50_000}
REUSED = ROOT / "tests" / "fixtures" / "challenge" / "fineweb_1024_bpe.model"


def exporter():
    path = os.environ.get("CHALLENGE_EXPORTER")
    if not path:
        sys.exit("set CHALLENGE_EXPORTER to the exporter's file (see this script's docstring)")
    blob = subprocess.run(
        ["git", "hash-object", path], capture_output=True, text=True, check=True
    ).stdout.strip()
    if blob != EXPORTER_BLOB:
        sys.exit(f"{path} is blob {blob}, not the exporter at {MIRROR_COMMIT} ({EXPORTER_BLOB})")
    spec = importlib.util.spec_from_file_location("challenge_exporter", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def export(
    module,
    docs: Path,
    vocab_size: int,
    val_docs: int,
    shard_tokens: int,
    reuse: Path | None = None,
    train_docs: int | None = None,
) -> dict:
    """Digests of the exporter's tokenizer and shards for `docs`, in a temporary folder."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = {"name": f"sp_bpe_{vocab_size}", "vocab_size": vocab_size}
        if reuse is not None:
            spec["reuse_model_path"] = str(reuse)
        if train_docs is not None:  # as its --tokenizer-train-docs sets it
            spec["tokenizer_train_docs"] = train_docs
        tok = module.build_sentencepiece_tokenizer(
            spec=spec, docs_jsonl=docs, tokenizers_dir=Path(tmp) / "tokenizers"
        )
        out = Path(tmp) / "datasets" / "export"
        module.export_shards(
            docs, tok, out, num_val_docs=val_docs, shard_size=shard_tokens, docs_total=module.count_docs(docs)
        )
        return {
            "tokenizer": tokenizer_digest(Path(tok["manifest"]["model_path"])),
            "shards": shard_sha256(out),
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=Path)
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--val-docs", type=int, default=50_000)
    parser.add_argument("--shard-tokens", type=int, default=10**8)
    parser.add_argument("--reuse", type=Path)
    args = parser.parse_args()
    module = exporter()
    if args.docs is not None:
        print(
            json.dumps(
                export(module, args.docs, args.vocab_size, args.val_docs, args.shard_tokens, args.reuse),
                indent=1,
            )
        )
        return
    with tempfile.TemporaryDirectory() as tmp:
        docs = write_export_docs(Path(tmp) / "docs.jsonl")
        trained = export(module, docs, **SETTINGS)
        # Reusing another model: the challenge's own sp1024 (no byte fallback: <unk> for what it lacks).
        reused = export(module, docs, **{**SETTINGS, "vocab_size": 1024}, reuse=REUSED)
        # The tokenizer trained on the first TRAIN_DOCS documents only, which differ from the rest.
        limited_docs = write_train_docs_docs(Path(tmp) / "limited.jsonl")
        limited = export(module, limited_docs, **SETTINGS, train_docs=TRAIN_DOCS)
        on_all = export(module, limited_docs, **SETTINGS)
        golden = {
            "made_with": {
                "exporter": f"openai/parameter-golf {MIRROR_COMMIT} data/download_hf_docs_and_tokenize.py",
                "sentencepiece": spm.__version__,
                "python": platform.python_version(),
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (encoding threads)",
                "trainer_threads": "SentencePiece's default (16)",
            },
            "docs_sha256": hashlib.sha256(docs.read_bytes()).hexdigest(),
            "settings": SETTINGS,
            "trained": trained,
            "reused": reused,
            "train_docs": {
                "docs_sha256": hashlib.sha256(limited_docs.read_bytes()).hexdigest(),
                "tokenizer_train_docs": TRAIN_DOCS,
                **limited,
                "tokenizer_on_all_docs": on_all["tokenizer"],
            },
        }
    CHALLENGE_EXPORT.write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {CHALLENGE_EXPORT}: {len(trained['shards'])} shards")


if __name__ == "__main__":
    main()
