"""Golden numbers for SmearGate with its BOS mask, computed by record 2026-04-27's own model.

The record's ``train_gpt.py`` is not part of pgolf and is never copied here: this script imports
it from the path in $RECORD_0427, through the loader and stubs of record_code.py (see
its docstring: FlashAttention as PyTorch SDPA, triton a stub, CPU, float32). From a clone of
openai/parameter-golf at commit 4908dc46f21ed3fdd08d2fdca285deb2194b9599:

    M=<clone>; C=4908dc46f21ed3fdd08d2fdca285deb2194b9599; R=records/track_10min_16mb
    git -C $M show $C:$R/2026-04-27_SP8192_LQER_SparseGate_BOSSmearFix_9HpStack_1.0611/train_gpt.py \
        > /tmp/rec0427.py
    RECORD_0427=/tmp/rec0427.py .venv/bin/python tests/golden/make_record_0427.py

It writes ``tests/golden/record_0427.safetensors`` next to itself. The model is the record's GPT at
small shapes (6 layers, dim 64, 4 heads / 2 kv, MLP 2x, vocab 96, T 32, batch 2) with
SMEAR_GATE_ENABLED=1, GATE_WINDOW=8, depth recurrence (NUM_LOOPS=2, layers 1..2), parallel lanes
from layer 4, and every other feature off where the record lets it be; the record's BOS_ID is 1 (its
loader's default). The tokens hold BOS at fixed positions (documents of different lengths, an empty
one, and one start at position 0), so that the mask decides several positions.

Then each attention gate of the record on its own, the same model without SmearGate (the record
refuses two gates at once), GATE_WINDOW=8: AttnOutGate driven by the attention's input
(attn_out_proj/) and by the raw queries (attn_out_q/), gated attention (gated/, GATED_ATTN_INIT_STD
0.01, then busy values), the sparse gate with SPARSE_ATTN_GATE_SCALE=0.7 (sparse/): each with its
own param/<name>, logits_on and loss_on (looping active) on the same x and y.

Keys (hyperparameters in the metadata as JSON, "cases" -> smear and each gate):
    param/<pgolf name>   every parameter, the record's banks split into pgolf's per-layer matrices:
                         qo_bank[i] = blocks.i.attn.c_q.weight, qo_bank[n+i] = blocks.i.attn.proj.weight,
                         kv_bank[i] = c_k, kv_bank[n+i] = c_v, mlp_up_bank[i] = mlp.fc,
                         mlp_down_bank[i] = mlp.proj; the other names are the same in both
    x, y                 token ids (2, 32), BOS = 1 at the positions in the metadata
    logits_on, loss_on   the record's forward_logits and loss with looping active
    logits_off, loss_off the same before the loop switch
    logits_nomask_on     the same weights, BOS_ID set to an id absent from x: the mask's effect
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_record_features as base
import record_code

record_code.RECORDS["0427"] = (
    "2026-04-27_SP8192_LQER_SparseGate_BOSSmearFix_9HpStack_1.0611",
    "9979400ef9f10da2fa908d9e7ce3556b82165b2a",
)
ENV_0427 = {
    **base.MODEL_ENV, "NUM_LOOPS": "2", "LOOP_START": "1", "LOOP_END": "2", "FUSED_CE_ENABLED": "0",
    "SMEAR_GATE_ENABLED": "1", "GATE_WINDOW": "8",
}  # fmt: skip
BOS = 1
BOS_POSITIONS = {0: [0, 7, 8, 20], 1: [5, 6, 31]}  # row -> positions holding BOS
SEED = 20260427
GATE_ENV = {k: v for k, v in ENV_0427.items() if k != "SMEAR_GATE_ENABLED"}
GATES = {  # each attention gate on its own (the record refuses two at once)
    "attn_out_proj": {**GATE_ENV, "ATTN_OUT_GATE_ENABLED": "1"},
    "attn_out_q": {**GATE_ENV, "ATTN_OUT_GATE_ENABLED": "1", "ATTN_OUT_GATE_SRC": "q"},
    "gated": {**GATE_ENV, "GATED_ATTN_ENABLED": "1"},
    "sparse": {**GATE_ENV, "SPARSE_ATTN_GATE_ENABLED": "1", "SPARSE_ATTN_GATE_SCALE": "0.7"},
}


def main(out_path: Path) -> None:
    torch.set_num_threads(1)
    record_code.install_stubs()
    rng = np.random.default_rng(SEED)
    rec, h, model, params = record_model(ENV_0427, rng)
    rec.BOS_ID = BOS

    x = rng.integers(2, h.vocab_size, size=(2, h.train_seq_len)).astype(np.int64)
    for row, positions in BOS_POSITIONS.items():
        x[row, positions] = BOS
    y = rng.integers(0, h.vocab_size, size=(2, h.train_seq_len)).astype(np.int64)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    out = {"x": x.astype(np.int32), "y": y.astype(np.int32)}
    for state in ("off", "on"):
        model.looping_active = state == "on"
        with torch.no_grad():
            out[f"logits_{state}"] = base.f32(model.forward_logits(xt))
            out[f"loss_{state}"] = base.f32(model(xt, yt).reshape(()))
    rec.BOS_ID = 0  # absent from x (its ids start at 2): no position is masked
    model.looping_active = True
    with torch.no_grad():
        out["logits_nomask_on"] = base.f32(model.forward_logits(xt))

    _store_params(out, "param/", params, h.num_layers)
    cases = {"smear": {"env": ENV_0427, "bos_id": BOS, "bos_positions": BOS_POSITIONS,
                       "encoder_on": model.encoder_indices, "decoder_on": model.decoder_indices}}  # fmt: skip
    for k, (name, env) in enumerate(GATES.items()):
        cases[name] = gate_case(name, env, np.random.default_rng(SEED + 1 + k), x, y, out)
    meta = {
        "record": "0427",
        "cases": cases,
        "turned_off": "XSA_LAST_N=0, SKIP_GATES_ENABLED=0, LN_SCALE=0, ROPE_DIMS=0; the features a case "
        "does not name are off (the record's defaults); FUSED_CE_ENABLED=0 and mlp.use_fused=False",
        "busy": f"matrices N(0,{base.MATRIX_STD}); others init + N(0,{base.CONTROL_NOISE}); default_rng({SEED}) for "
        "smear, then SEED + 1, + 2, ... for the gates in order",
    }
    lqer_case(out)
    meta["lqer"] = LQER_NOTE
    gate_int8_case(out)
    meta["gate_int8"] = (
        "gate_int8/w{0,1}: (4, 64) and (4, 8) N(0, 0.3) from default_rng(SEED + 10); q, s = _quantize_gate_int8_row(w)"
    )
    base.save_file(out, str(out_path), metadata={"cases": json.dumps(meta)})
    print(f"wrote {out_path}: {len(out)} tensors")


LQER_NOTE = (
    "lqer/: A (24x4), B (4x128) float32 N(0,1) from default_rng(SEED + 9); sym{3,4}/{qA,sA,qB,sB} = "
    "_lqer_pack(A, B, bits); asym/{qA,sA,qB,sB} = _lqer_pack_asym(A, B, 64); w (24x128) int6 rows q, "
    "fp16 scale s; W_sym4, W_asym = dequantize_mixed(...) of w.q/w.scale with the sym4 (meta "
    "'gptq (int6)+lqer') or asym ('gptq (int6)+lqer_asym') factors"
)


def lqer_case(out: dict) -> None:
    """The record's LQER packing and its dequantization, on fixed factors."""
    rec = record_code.load_record("0427", GATE_ENV)
    rng = np.random.default_rng(SEED + 9)
    a = torch.from_numpy(rng.standard_normal((24, 4)).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal((4, 128)).astype(np.float32))
    out["lqer/A"], out["lqer/B"] = a.numpy(), b.numpy()
    packs = {
        "sym3": rec._lqer_pack(a, b, 3),
        "sym4": rec._lqer_pack(a, b, 4),
        "asym": rec._lqer_pack_asym(a, b, 64),
    }
    for name, packed in packs.items():
        for key, value in zip(("qA", "sA", "qB", "sB"), packed, strict=True):
            out[f"lqer/{name}/{key}"] = value.numpy()
    q = torch.from_numpy(rng.integers(-31, 32, size=(24, 128)).astype(np.int8))
    s = torch.from_numpy((rng.uniform(0.01, 0.02, size=24)).astype(np.float16))
    out["lqer/q"], out["lqer/s"] = q.numpy(), s.numpy()
    template = {"w": torch.zeros(24, 128)}
    for name, suffix, tag in (("sym4", "", "+lqer"), ("asym", "_a", "+lqer_asym")):
        qa, sa, qb, sb = packs[name]
        result = {"w.q": q, "w.scale": s, f"w.lqA{suffix}": qa, f"w.lqAs{suffix}": sa, f"w.lqB{suffix}": qb,
                  f"w.lqBs{suffix}": sb}  # fmt: skip
        out[f"lqer/W_{name}"] = rec.dequantize_mixed(result, {"w": "gptq (int6)" + tag}, template)[
            "w"
        ].numpy()


def gate_int8_case(out: dict) -> None:
    """The record's int8 rows for attention-gate weights (GATED_ATTN_QUANT_GATE)."""
    rec = record_code.load_record("0427", GATE_ENV)
    rng = np.random.default_rng(SEED + 10)
    for i, shape in enumerate(((4, 64), (4, 8))):
        w = (rng.standard_normal(shape) * 0.3).astype(np.float32)
        w[0, 0] = 0.0  # a row's other values decide its scale
        q, s = rec._quantize_gate_int8_row(torch.from_numpy(w))
        out[f"gate_int8/w{i}"], out[f"gate_int8/q{i}"], out[f"gate_int8/s{i}"] = w, q.numpy(), s.numpy()


def record_model(env: dict[str, str], rng):
    """(record, hyperparameters, GPT, its busy weights) under env: eval mode, the MLP's Triton kernel off."""
    rec = record_code.load_record("0427", env)
    h, model = base._model(rec)
    params = base.fill_busy(rec, model, rng)
    for block in model.blocks:
        block.mlp.use_fused = False
    model.eval()
    return rec, h, model, params


def gate_case(name: str, env: dict[str, str], rng, x, y, out) -> dict:
    """One attention gate: the record's model with it on, logits and loss looped, under `<name>/`."""
    _, h, model, params = record_model(env, rng)
    model.looping_active = True
    xt, yt = torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))
    with torch.no_grad():
        out[f"{name}/logits_on"] = base.f32(model.forward_logits(xt))
        out[f"{name}/loss_on"] = base.f32(model(xt, yt).reshape(()))
    _store_params(out, f"{name}/param/", params, h.num_layers)
    return {"env": env}


def _store_params(out: dict, prefix: str, params: dict, n: int) -> None:
    """The record's parameters under pgolf's names: its banks split into per-layer matrices."""
    banks = {
        "qo_bank": [f"blocks.{i}.attn.c_q.weight" for i in range(n)] + [f"blocks.{i}.attn.proj.weight" for i in range(n)],
        "kv_bank": [f"blocks.{i}.attn.c_k.weight" for i in range(n)] + [f"blocks.{i}.attn.c_v.weight" for i in range(n)],
        "mlp_up_bank": [f"blocks.{i}.mlp.fc.weight" for i in range(n)],
        "mlp_down_bank": [f"blocks.{i}.mlp.proj.weight" for i in range(n)],
    }  # fmt: skip
    for name, value in params.items():
        if name in banks:
            for j, pgolf_name in enumerate(banks[name]):
                out[prefix + pgolf_name] = np.ascontiguousarray(value[j])
        else:
            out[prefix + name] = value


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("record_0427.safetensors"))
