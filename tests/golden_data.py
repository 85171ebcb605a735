"""The goldens: the quantization goldens written by tests/golden/make_quant_goldens.py from the challenge
record's own code, the records' golden files read back, and a record's environment as a config."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open

from core.config.fields import from_env
from core.config.presets import preset

GOLDEN = Path(__file__).resolve().parent / "golden"
QUANT_GOLDENS = GOLDEN / "quant_goldens.safetensors"
RECORD_PTZ = GOLDEN / "record_int6.ptz"


@cache
def goldens() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(tensors, metadata) of quant_goldens.safetensors."""
    with safe_open(QUANT_GOLDENS, "np") as f:
        meta = json.loads(f.metadata()["golden"])
        return {k: f.get_tensor(k) for k in f.keys()}, meta  # noqa: SIM118 (safe_open is not a dict)


# ---------------------------------------- the records' golden files
def read_golden(path: Path, prefix: str) -> tuple[dict, dict[str, np.ndarray]]:
    if not path.is_file():
        pytest.skip(f"golden file {path} is missing")
    with safe_open(str(path), "np") as f:
        meta = f.metadata()
        tensors = {k.removeprefix(prefix): f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}  # noqa: SIM118 (safe_open is not a dict)
    return meta, tensors


def record_config(env: dict[str, str]):
    """pgolf's config for a record's environment: fp32, eager, the record's fixed choices."""
    # Variables pgolf has no field for, at the values its model implies.
    assert env.get("EMBEDDING_DIM", env["MODEL_DIM"]) == env["MODEL_DIM"]
    assert env.get("EVAL_SEQ_LEN", env["TRAIN_SEQ_LEN"]) == env["TRAIN_SEQ_LEN"]
    assert env.get("FUSED_CE_ENABLED", "0") == "0"
    # Not environment switches in the record: leaky-ReLU(0.5)^2 MLP (the rest is pgolf's baseline).
    return (
        preset("smoke")
        .replace(**from_env(env), mlp_activation="leaky_relu2", compute_dtype="float32", compile="off")
        .validate()
    )


# The challenge exporter's golden (tests/golden/make_challenge_export.py, tests/test_prepare_docs.py).
CHALLENGE_EXPORT = GOLDEN / "challenge_export.json"
EXPORT_SPEECHES = 30  # the first speeches of the embedded corpus, one paragraph a document
EXPORT_EXTRA = [  # text that takes byte fallback, NFKC and whitespace folding
    "Café ÉCOLE naïve Straße — “quotes” ½ cup, ﬁne print",
    "世界 你好, emoji 😀🎉 and Ελληνικά, русский текст",
    "  leading and   inner   spaces\tand a tab  ",
    "digits 1234567890 and 3.14159, a\x00NUL",
]

# What web text holds that the speeches do not (bench/prepare_scale.py writes them into its documents).
WEB_HAZARDS = [
    "  ", "   ", "\n", "\n\n", "\t", " \t ",  # whitespace runs
    "ﬁne", "ﬀ", "½", "①", "™", "Ｆｕｌｌ", "x²", "\u212b", "ｶﾀｶﾅ", "…",  # NFKC changes these
    "😀", "🇺🇸", "👍🏽", "❤️", "🎉",  # emoji (a flag, a skin tone, a variation selector)
    "世界", "日本語のテキスト", "한국어", "中文",  # CJK
    "café", "naïve", "Straße", "Ελληνικά", "русский",  # accents and other scripts
    "\x00", "\x07", "\x1b[0m", "\x7f", "\u200b", "\u200d", "\u00ad", "\ufeff",  # control and invisible
    "\u2581", "a\u2581b", " \u2581 ",  # SentencePiece's own space mark, written literally
]  # fmt: skip


def with_hazards(text: str, rng, count: int) -> str:
    """`text` with `count` of WEB_HAZARDS written in at word boundaries (`rng`: a random.Random)."""
    words = text.split(" ")
    for _ in range(count):
        at = rng.randrange(len(words))
        words[at] += rng.choice(WEB_HAZARDS)
    return " ".join(words)


def write_export_docs(path: Path) -> Path:
    """The golden's documents as JSON lines: the first EXPORT_SPEECHES speeches' paragraphs, with
    EXPORT_EXTRA after every 50th (so that some are validation documents and some train)."""
    from core.datasets.embedded import paragraphs, read_text, speech_files

    lines = []
    for i, text in enumerate(paragraphs(read_text(f) for f in speech_files()[:EXPORT_SPEECHES])):
        lines.append(text)
        if i % 50 == 0:
            lines.append(EXPORT_EXTRA[(i // 50) % len(EXPORT_EXTRA)])
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines), encoding="utf-8")
    return path


TRAIN_DOCS = 400  # the golden's tokenizer_train_docs: its tokenizer is trained on these first documents


def write_train_docs_docs(path: Path) -> Path:
    """Documents whose first TRAIN_DOCS differ from the rest, as JSON lines: paragraphs of the first
    speeches, then paragraphs of the last twenty with WEB_HAZARDS written in (random.Random(0)), so that
    a tokenizer trained on all of them is another."""
    import random

    from core.datasets.embedded import paragraphs, read_text, speech_files

    files, rng = speech_files(), random.Random(0)
    first = list(paragraphs(read_text(f) for f in files[:8]))[:TRAIN_DOCS]
    rest = [with_hazards(p, rng, 2) for p in paragraphs(read_text(f) for f in files[-20:])][:1200]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in first + rest), encoding="utf-8")
    return path


def tokenizer_digest(model: Path) -> str:
    """SHA-256 of a SentencePiece model's pieces, scores and types, one "piece<TAB>score<TAB>type" line
    each (the model file itself also records where it was trained, which differs run to run)."""
    import hashlib

    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(model).read_bytes())
    lines = "".join(f"{p.piece}\t{p.score!r}\t{p.type}\n" for p in proto.pieces)
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def shard_sha256(folder: Path) -> dict[str, str]:
    """{name: SHA-256} of the token shards of a dataset folder (byte sidecars left out)."""
    import hashlib

    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(Path(folder).glob("fineweb_*.bin"))
        if "_bytes_" not in p.name
    }
