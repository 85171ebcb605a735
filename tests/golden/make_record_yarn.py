"""Golden numbers for ROPE_YARN, computed by record 2026-04-27's own Rotary and GPT.

The record's ``train_gpt.py`` is imported from $RECORD_0427 through the loader and stubs of
make_record_features.py, as make_record_0427.py does (its docstring has the git command that
extracts the script; CPU, float32):

    RECORD_0427=/tmp/rec0427.py .venv/bin/python tests/golden/make_record_yarn.py

It writes ``tests/golden/record_yarn.safetensors`` next to itself.

The record keeps one table per attention layer, made for the longest length it was asked for so
far, and cuts it for shorter inputs. Every number here comes from a fresh object's first call, so
each table is the one for its own length: the function of the config and the length that pgolf
computes.

Keys (the cases' settings in the metadata as JSON):
    table/<case>/cos, sin   Rotary(16, base 10000, train_seq_len 32, rope_dims, yarn)(length) as
                            (length, R/2), for rope_dims 0 (all 16) and 8, yarn on and off, lengths
                            20, 32 (not longer than the training length) and 33, 80, 200
    x, y                    token ids (2, 80): longer than TRAIN_SEQ_LEN=32
    param/<pgolf name>      the weights of the record's GPT (6 layers, dim 64, 4 heads / 2 kv,
                            ROPE_DIMS=8, ROPE_YARN=1, loops and lanes as in make_record_0427.py;
                            the record's banks split into pgolf's per-layer matrices)
    logits_yarn, loss_yarn  its forward_logits and loss on x, y (looping active), a fresh model
    logits_plain            the same weights and tokens with each layer's Rotary yarn off
    logits_short            a fresh model again with yarn on, on x[:, :24]: the tables are plain
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_record_0427 as r0427
import make_record_features as base
import record_code

ENV = {**r0427.GATE_ENV, "ROPE_DIMS": "8", "ROPE_YARN": "1"}
SEED = 20260427 + 20
HEAD_DIM, TRAIN_LEN = 16, 32
TABLE_CASES = [
    (rope_dims, yarn, length)
    for rope_dims in (0, 8)
    for yarn in (False, True)
    for length in (20, 32, 33, 80, 200)
]
LENGTH = 80


def case_name(rope_dims: int, yarn: bool, length: int) -> str:
    return f"r{rope_dims}_{'yarn' if yarn else 'plain'}_{length}"


def fresh_model(rec, params: dict[str, np.ndarray]):
    """The record's GPT (fresh Rotary tables) with the given weights, looping active."""
    _, model = base._model(rec)
    with torch.no_grad():
        for name, value in model.state_dict().items():
            value.copy_(torch.from_numpy(params[name]))
    for block in model.blocks:
        block.mlp.use_fused = False
    model.eval()
    model.looping_active = True
    return model


def main(out_path: Path) -> None:
    torch.set_num_threads(1)
    record_code.install_stubs()
    rec = record_code.load_record("0427", ENV)
    out: dict[str, np.ndarray] = {}
    for rope_dims, yarn, length in TABLE_CASES:
        rotary = rec.Rotary(HEAD_DIM, base=10000.0, train_seq_len=TRAIN_LEN, rope_dims=rope_dims, yarn=yarn)
        cos, sin = rotary(length, torch.device("cpu"), torch.float32)
        name = case_name(rope_dims, yarn, length)
        out[f"table/{name}/cos"], out[f"table/{name}/sin"] = base.f32(cos[0, :, 0]), base.f32(sin[0, :, 0])

    rng = np.random.default_rng(SEED)
    h, model = base._model(rec)
    assert h.rope_yarn and h.rope_dims == 8 and h.train_seq_len == TRAIN_LEN
    params = base.fill_busy(rec, model, rng)
    state = {k: base.f32(v) for k, v in model.state_dict().items()}
    x = rng.integers(0, h.vocab_size, size=(2, LENGTH)).astype(np.int64)
    y = rng.integers(0, h.vocab_size, size=(2, LENGTH)).astype(np.int64)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    out["x"], out["y"] = x.astype(np.int32), y.astype(np.int32)
    with torch.no_grad():
        model = fresh_model(rec, state)
        out["logits_yarn"] = base.f32(model.forward_logits(xt))
        out["loss_yarn"] = base.f32(model(xt, yt).reshape(()))
        model = fresh_model(rec, state)
        out["logits_short"] = base.f32(model.forward_logits(xt[:, :24]))
        model = fresh_model(rec, state)
        for block in model.blocks:
            block.attn.rotary.yarn = False
        out["logits_plain"] = base.f32(model.forward_logits(xt))
    r0427._store_params(out, "param/", params, h.num_layers)
    meta = {
        "record": "0427",
        "env": ENV,
        "tables": {case_name(*c): {"rope_dims": c[0], "yarn": c[1], "length": c[2]} for c in TABLE_CASES},
        "table_settings": {"head_dim": HEAD_DIM, "rope_base": 10000.0, "train_seq_len": TRAIN_LEN},
        "busy": f"fill_busy with default_rng({SEED}), then x and y from the same generator",
    }
    base.save_file(out, str(out_path), metadata={"cases": json.dumps(meta)})
    print(f"wrote {out_path}: {len(out)} tensors")


if __name__ == "__main__":
    main(Path(__file__).resolve().parent / "record_yarn.safetensors")
