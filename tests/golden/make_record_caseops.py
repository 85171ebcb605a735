"""Golden CaseOps cases, computed by the records' own transform and tokenizer.

The records' ``lossless_caps.py`` and CaseOps tokenizer are not part of pgolf and are never copied
here: this script imports the one and loads the other from the paths given in environment
variables. From a clone of openai/parameter-golf at commit 4908dc46f21ed3fdd08d2fdca285deb2194b9599
(the git blob of each file is checked below; 2026-04-18 and 2026-04-19 ship the same lossless_caps.py):

    M=<clone>; C=4908dc46f21ed3fdd08d2fdca285deb2194b9599
    R=records/track_10min_16mb/2026-04-27_SP8192_LQER_SparseGate_BOSSmearFix_9HpStack_1.0611
    git -C $M show $C:$R/lossless_caps.py > /tmp/lossless_caps.py
    git -C $M show $C:$R/tokenizers/fineweb_8192_bpe_lossless_caps_caseops_v1_reserved.model > /tmp/caseops.model
    RECORD_CASEOPS=/tmp/lossless_caps.py RECORD_CASEOPS_TOKENIZER=/tmp/caseops.model \\
        .venv/bin/python tests/golden/make_record_caseops.py

It writes ``tests/golden/record_caseops.json`` next to itself: the record's control symbols for
``lossless_caps_caseops_v1`` and their ids in its tokenizer, then for each case

    text            the input: hand-picked strings (capitals of every kind, operators written
                    literally, non-ASCII letters, digits, newlines), the opening of a speech of the
                    embedded corpus, and random strings over an alphabet rich in those characters
    encoded         the record's ``encode_lossless_caps_v2(text)`` (its caseops_v1 transform),
                    checked to decode back with its ``decode_lossless_caps_v2``
    surfaces        the surface text of each piece the record's tokenizer cuts ``encoded`` into
    original_bytes  the record's ``surface_piece_original_byte_counts(surfaces, caseops_v1)``: what
                    its byte sidecar stores for those pieces
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
from pathlib import Path

import sentencepiece as spm
from record_code import git_blob_id

MIRROR_COMMIT = "4908dc46f21ed3fdd08d2fdca285deb2194b9599"
FOLDER = "records/track_10min_16mb/2026-04-27_SP8192_LQER_SparseGate_BOSSmearFix_9HpStack_1.0611"
BLOBS = {
    "RECORD_CASEOPS": ("lossless_caps.py", "98e472f8242c9bc4b3ec575c32b9ebb40d9da1d7"),
    "RECORD_CASEOPS_TOKENIZER": (
        "tokenizers/fineweb_8192_bpe_lossless_caps_caseops_v1_reserved.model",
        "fffc8bb3062a77df55030b36cb0d85f2c6a9c211",
    ),
}
TRANSFORM = "lossless_caps_caseops_v1"
HAND_PICKED = [
    "The NASA Launch",
    "iPhone OpenAI",
    "The quick brown FOX.",
    "McDonald's HTTPServer XMLHttpRequest ABc aB A I a",
    "HELLO, World! e.g. U.S.A. and U.K.; 1,234.5 USD",
    "Café ÉCOLE école NAÏVE Straße STRASSE ǅ",
    "tab\there\nnew line\r\n  two  spaces  ",
    "\ue001\ue002\ue003\ue004 literal operators: A\ue001b \ue004\ue004 X\ue003Y",
    "\ue000 sentinel of v1, \ue005 next to ours",
    "emoji 😀 CJK 世界 ½ cup — dash “quotes”",
    "",
    "Z",
    "aBcDeF AbCdEf ABCDEF abcdef",
]
ALPHABET = [*"aAbBzZ", "\ue001", "\ue002", "\ue003", "\ue004", " ", "é", "É", "1", "\n", "😀", "'"]
RANDOM_CASES, RANDOM_LEN, SEED = 40, 24, 20260418


def checked(var: str) -> Path:
    if var not in os.environ:
        raise SystemExit(f"{var} is not set; see the docstring for the git commands that extract it")
    path = Path(os.environ[var])
    name, blob = BLOBS[var]
    if git_blob_id(path.read_bytes()) != blob:
        raise SystemExit(f"{path} is not {FOLDER}/{name} at {MIRROR_COMMIT} (blob {blob})")
    return path


def speech_opening() -> str:
    """The first 600 characters of the first speech of the embedded corpus."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from core.datasets.embedded import read_text, speech_files

    return read_text(speech_files()[0])[:600]


def main() -> None:
    spec = importlib.util.spec_from_file_location("record_lossless_caps", checked("RECORD_CASEOPS"))
    record = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(record)
    sp = spm.SentencePieceProcessor(model_file=str(checked("RECORD_CASEOPS_TOKENIZER")))
    controls = record.get_text_transform_control_symbols(TRANSFORM)
    rng = random.Random(SEED)
    texts = [*HAND_PICKED, speech_opening()]
    texts += ["".join(rng.choice(ALPHABET) for _ in range(RANDOM_LEN)) for _ in range(RANDOM_CASES)]
    cases = []
    for text in texts:
        encoded = record.get_text_transform(TRANSFORM)(text)
        assert record.get_text_inverse_transform(TRANSFORM)(encoded) == text, text
        surfaces = [piece.surface for piece in sp.encode(encoded, out_type="proto").pieces]
        counts = record.surface_piece_original_byte_counts(surfaces, text_transform_name=TRANSFORM)
        cases.append({"text": text, "encoded": encoded, "surfaces": surfaces, "original_bytes": counts})
    golden = {
        "source": {"folder": FOLDER, "commit": MIRROR_COMMIT, **{v: b for v, (_, b) in BLOBS.items()}},
        "transform": TRANSFORM,
        "controls": controls,
        "control_ids": [sp.piece_to_id(c) for c in controls],
        "cases": cases,
    }
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "record_caseops.json"
    head = json.dumps({k: v for k, v in golden.items() if k != "cases"}, ensure_ascii=True)
    lines = ",\n".join(json.dumps(case, ensure_ascii=True) for case in cases)  # one case a line
    out.write_text(f'{head[:-1]}, "cases": [\n{lines}\n]}}\n', encoding="ascii")
    print(f"wrote {out}: {len(cases)} cases")


if __name__ == "__main__":
    main()
