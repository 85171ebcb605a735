"""Golden numbers for document-masked (varlen) attention, computed by record 2026-04-27's own model.

The record's ``train_gpt.py`` is not part of pgolf and is never copied here: this script imports it
from the path in $RECORD_0427, through the loader and stubs of record_code.py (CPU, float32;
FlashAttention's varlen kernel is a stub that runs each sequence of cu_seqlens on its own through
causal SDPA, see its docstring). With the record extracted as make_record_0427.py's docstring says:

    RECORD_0427=/tmp/rec0427.py .venv/bin/python tests/golden/make_record_varlen.py

It writes ``tests/golden/record_varlen.safetensors`` next to itself. The model is make_record_0427.py's
(6 layers, dim 64, 4 heads / 2 kv, vocab 96, TRAIN_SEQ_LEN = EVAL_SEQ_LEN = 32, SmearGate with
GATE_WINDOW=8, loops over layers 1..2, parallel lanes from layer 4), BOS_ID 1. The input is one packed
row of 96 tokens, as the record's DocumentPackingLoader yields, with BOS at 5, 6, 20 and 70 and none at 0:
the record's ``_build_cu_seqlens(bos, 96, max_doc_len=32, bucket_size=64)`` cuts it at 0, 5, 6, 20, 52
(the document from 20 is longer than 32) and 70, and pads the list to 64 entries with 96.

Keys (the cases' settings in the metadata as JSON):
    param/<pgolf name>   every parameter, the banks split into pgolf's per-layer matrices
    x, y                 token ids (1, 96)
    cu_seqlens           the record's boundaries, padded; max_seqlen in the metadata
    logits_on, loss_on   forward_logits(x, cu_seqlens, max_seqlen) and the loss, looping active
    logits_off, loss_off the same before the loop switch
    logits_dense_on      forward_logits(x) without cu_seqlens: plain causal attention over the row
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

T = 96
BOS_POSITIONS = [5, 6, 20, 70]
SEED = 20260410


def main(out_path: Path) -> None:
    torch.set_num_threads(1)
    record_code.install_stubs()
    rng = np.random.default_rng(SEED)
    rec, h, model, params = r0427.record_model(r0427.ENV_0427, rng)
    rec.BOS_ID = r0427.BOS

    x = rng.integers(2, h.vocab_size, size=(1, T)).astype(np.int64)
    x[0, BOS_POSITIONS] = r0427.BOS
    y = rng.integers(0, h.vocab_size, size=(1, T)).astype(np.int64)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    bos = (xt[0] == rec.BOS_ID).nonzero(as_tuple=True)[0].tolist()
    cu, max_seqlen = rec._build_cu_seqlens(bos, T, xt.device, h.train_seq_len, 64)
    out = {"x": x.astype(np.int32), "y": y.astype(np.int32), "cu_seqlens": cu.numpy()}
    for state in ("off", "on"):
        model.looping_active = state == "on"
        with torch.no_grad():
            out[f"logits_{state}"] = base.f32(model.forward_logits(xt, cu_seqlens=cu, max_seqlen=max_seqlen))
            loss = model(xt, yt, cu_seqlens=cu, max_seqlen=max_seqlen)
            out[f"loss_{state}"] = base.f32(loss.reshape(()))
    with torch.no_grad():
        out["logits_dense_on"] = base.f32(model.forward_logits(xt))
    r0427._store_params(out, "param/", params, h.num_layers)
    meta = {
        "record": "0427",
        "env": r0427.ENV_0427,
        "bos_id": r0427.BOS,
        "bos_positions": BOS_POSITIONS,
        "max_doc_len": h.train_seq_len,
        "max_seqlen": int(max_seqlen),
        "busy": f"as make_record_0427.py, default_rng({SEED}) for the weights, then x and y",
    }
    base.save_file(out, str(out_path), metadata={"cases": json.dumps(meta)})
    print(f"wrote {out_path}: {len(out)} tensors, cu_seqlens {cu.tolist()[:8]}, max_seqlen {max_seqlen}")


if __name__ == "__main__":
    main(
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else Path(__file__).resolve().parent / "record_varlen.safetensors"
    )
