"""Golden numbers for five techniques of the challenge records, computed by the records' own code.

Techniques: MuonEq-R (row-normalised Muon update), Polar Express Newton-Schulz coefficients, depth
recurrence (looping a range of layers), parallel residual lanes, MIN_LR (warmdown floor), and the
coprime-stride multi-shard data loader.

The records' ``train_gpt.py`` files are not part of pgolf and are never copied here: this script
imports them from paths given in environment variables. From a clone of openai/parameter-golf at
commit 4908dc46f21ed3fdd08d2fdca285deb2194b9599 (the git blob of each file is checked below):

    M=<clone>; C=4908dc46f21ed3fdd08d2fdca285deb2194b9599; R=records/track_10min_16mb
    git -C $M show $C:$R/2026-03-29_Loader_FullGPTQ_XSA11_BigramHash2816/train_gpt.py > /tmp/rec0329.py
    git -C $M show $C:$R/2026-03-31_ParallelResiduals_MiniDepthRecurrence/train_gpt.py > /tmp/rec0331.py
    git -C $M show $C:$R/2026-04-04_SP4096_DepthRecurrence_ParallelResid_MuonEqR/train_gpt.py > /tmp/rec0404.py
    git -C $M show $C:$R/2026-04-23_SP8192_CaseOps_SparseGate_QuantGate_Loop45_PhasedTTT_PolarNS_MinLR_FusedCE/train_gpt.py > /tmp/rec0423.py
    RECORD_0329=/tmp/rec0329.py RECORD_0331=/tmp/rec0331.py RECORD_0404=/tmp/rec0404.py \
        RECORD_0423=/tmp/rec0423.py .venv/bin/python tests/golden/make_record_features.py

RECORD_0331 is optional (only used to check that its loader yields the same batches as 04-04's).
The 04-04 file is a self-extracting wrapper (``exec(lzma.decompress(b85decode(...)))``): it is
unpacked by running the wrapper with ``exec`` bound to a function that keeps the source, and the
source is then loaded as a module. The 04-03 record (same MuonEq-R code as 04-04) is not used: its
minified f-strings need Python 3.12.

It writes ``tests/golden/record_features.safetensors`` next to itself (or the path given as the first
argument). CPU, float32, one thread; two runs give bit-identical files.

Records are imported as modules (``__name__`` is not ``"__main__"``, so nothing trains); each record's
``Hyperparameters`` reads the environment at import, so the variables listed in the metadata
(``<case>/env``) are set while importing and every other variable the record reads is unset.

Substitutions, so that the records run on a CPU in float32:

1. ``flash_attn_interface`` (FlashAttention 3, CUDA only) is a stub module: ``flash_attn_func(q, k, v,
   causal=True)`` is ``F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)`` on q, k, v
   transposed from (B, T, H, D) to (B, H, T, D), transposed back. ``flash_attn_varlen_func(q, k, v,
   cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=True)`` on packed (N, H, D) rows is
   exact per sequence: each cu[i]..cu[i+1] (empty ones skipped) through the same causal SDPA.
2. ``triton`` (imported at top level by 04-23 for two training-only kernels) is a stub: ``triton.jit``
   returns the function unchanged and is never run. 04-23 is run on its own non-Triton paths:
   ``FUSED_CE_ENABLED=0`` (the record's eager softcap + ``F.cross_entropy``) and ``mlp.use_fused =
   False`` with the model in eval mode (the record's plain ``F.linear`` / leaky-ReLU^2 MLP).
3. ``brotli`` (imported unconditionally by 03-31, used only to compress the artifact) is a stub.
4. ``torch.compile`` is the identity while a record is imported, so its ``@torch.compile`` Newton-Schulz
   function is the plain Python function.
5. Float32 instead of bfloat16 in Newton-Schulz and Muon: while a record's NS function or
   ``Muon.step`` runs, ``Tensor.bfloat16()`` returns a float32 copy (the NS functions start with
   ``X = G.bfloat16()``; 04-23's Muon takes ``p.grad.bfloat16()``), and the record module's ``torch``
   is a view of torch whose ``bfloat16`` is ``float32`` (04-04's Muon collects updates in
   ``torch.zeros(..., dtype=torch.bfloat16)``). The arithmetic is otherwise the record's.
6. ``lr_mul`` and ``training_frac`` of 04-23 are closures inside ``train_model``: their definitions are
   taken from the record's source (AST, line numbers kept) and run with our values of the variables
   they read (``h``, ``max_wallclock_ms``). ``max_wallclock_ms`` is computed here as the record does
   inline (1000 * MAX_WALLCLOCK_SECONDS - 1000 * GPTQ_RESERVE_SECONDS, record defaults).

Cases (keys; hyperparameters as JSON strings in the metadata, one entry per case):

ns/       Newton-Schulz on in0 (24x40), in1 (40x24), in2 (32x32), N(0,1):
          classic/out<i>: 04-04 ``zeropower_via_newtonschulz5(G, steps=5)`` (3.4445, -4.7750, 2.0315);
          polar/out<i>: 04-23 ``zeropower_via_newtonschulz5(G, steps=5)`` (Polar Express list);
          muoneqr_classic/out<i>: 04-04 ``Muon.step`` on p = 0 with grad G, lr 1, momentum 0, wd 0,
          i.e. out = -p_after = NS_classic(G / ||row||) * max(1, rows/cols) ** 0.5;
          muoneqr_polar/out<i>: 04-23 ``Muon.step`` (row_normalize=True), same set-up, scale included.
loop/     04-04 model (6 layers, dim 64, 4 heads / 2 kv, mlp_mult 2, vocab 96, T 32, B 2),
          RECUR_LAYERS=1,2 (looped once more), PARALLEL_START_LAYER=4: param/<state_dict name>, x, y,
          logits_on / loss_on (recurrence active), logits_off / loss_off (before the switch),
          grad_on/<name> (d loss_on / d param, for blocks 1 and 2, skip_weights and lane_merge).
loop0423/ 04-23 model, same shapes and the same values for every tensor the two share (metadata gives
          the bank layout built from loop/param), NUM_LOOPS=2, LOOP_START=1, LOOP_END=2,
          PARALLEL_START_LAYER=4: param/<name> for every non-bank tensor, logits_on, loss_on,
          logits_off, loss_off (x and y are loop/x, loop/y).
muoneqr/  04-04 ``Muon`` (MuonEq-R), lr 0.02, momentum 0.9, nesterov, wd 0.09 (its MUON_WD), 5 NS steps,
          on w0 (24x40), w1 (40x24), w2 (32x32): before/<n>, grad1/<n>, after1/<n>, buf1/<n> (momentum
          buffer), grad2/<n>, after2/<n>, buf2/<n>.
muon0423/ 04-23 ``Muon`` (Polar Express + row_normalize), lr 0.02, momentum 0.9, wd 0.095 (its MUON_WD),
          on banks b0 (2x24x40), b1 (3x40x24): same keys as muoneqr.
lr/       04-23 ``lr_mul(training_frac(step, elapsed_ms))``: step/{step,frac,mul,mul_minlr0} (ITERATIONS
          100, no wallclock cap) and wall/{elapsed_ms,frac,mul} (600 s cap less the 4 s GPTQ reserve);
          MIN_LR 0.1, WARMDOWN_FRAC the record's 0.75.
loader/   04-04 ``DistributedTokenLoader`` (identical batches from 03-29 and 03-31 are checked) on three
          shards written to a temporary directory and globbed with the relative pattern
          ``fineweb_train_*.bin`` (the loader's RNG seed is a hash of the globbed path strings),
          seq_len 16, global batch 1024 tokens, grad_accum_steps 8 // world_size (8 sequences per rank):
          w1r0/x<b>, w1r0/y<b> (world 1, rank 0), w2r0/..., w2r1/... (world 2) for b = 0..5.

Parameters are "busy": numpy default_rng in state_dict order; N(0, 0.05) for matrices (ndim >= 2 and
not a control tensor by the record's CONTROL_TENSOR_NAME_PATTERNS); init value + N(0, 0.2) for
everything else (1-D, 0-D and the 2-D/3-D control tensors resid_mix, skip_weights, parallel lambdas).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch
from record_code import (
    MIRROR_COMMIT,
    RECORD_DIR,
    RECORDS,
    float32_for_bfloat16,
    install_stubs,
    load_record,
    nested_functions,
)
from safetensors.numpy import save_file

SEED = 20260404
MATRIX_STD = 0.05
CONTROL_NOISE = 0.2

MODEL_ENV = {  # shared by the 04-04 and 04-23 models
    "VOCAB_SIZE": "96", "NUM_LAYERS": "6", "MODEL_DIM": "64", "EMBEDDING_DIM": "64", "NUM_HEADS": "4",
    "NUM_KV_HEADS": "2", "MLP_MULT": "2.0", "TRAIN_SEQ_LEN": "32", "EVAL_SEQ_LEN": "32",
    "TIE_EMBEDDINGS": "1", "LOGIT_SOFTCAP": "30.0", "ROPE_BASE": "10000.0",
    # features outside this file's list, off where the record lets them be
    "XSA_LAST_N": "0", "SKIP_GATES_ENABLED": "0", "LN_SCALE": "0", "ROPE_DIMS": "0",
    "PARALLEL_START_LAYER": "4",
}  # fmt: skip
ENV_0404 = {**MODEL_ENV, "VE_ENABLED": "0", "RECUR_LAYERS": "1,2"}
ENV_0423 = {**MODEL_ENV, "NUM_LOOPS": "2", "LOOP_START": "1", "LOOP_END": "2", "FUSED_CE_ENABLED": "0"}
BATCH = 2

NS_SHAPES = [(24, 40), (40, 24), (32, 32)]
MUON_SHAPES = {"w0": (24, 40), "w1": (40, 24), "w2": (32, 32)}
BANK_SHAPES = {"b0": (2, 24, 40), "b1": (3, 40, 24)}
MUON_LR, MUON_MOMENTUM = 0.02, 0.9

LR_ITERATIONS, LR_MIN = 100, 0.1

SHARD_LENGTHS = (150, 1000, 2003)
SHARD_OFFSETS = (0, 20000, 40000)  # token i of shard k is SHARD_OFFSETS[k] + i
LOADER_SEQ_LEN, LOADER_GLOBAL_TOKENS, LOADER_BATCHES = 16, 1024, 6


# ----------------------------------------------------------------------------------------- stubs
# ----------------------------------------------------------------------------------------- helpers
def f32(a) -> np.ndarray:
    return np.array(a.detach().cpu().numpy() if torch.is_tensor(a) else a, dtype=np.float32, order="C")


def is_control(module, name: str) -> bool:
    return any(pattern in name for pattern in module.CONTROL_TENSOR_NAME_PATTERNS)


def fill_busy(module, model, rng, given: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Busy values in state_dict order; tensors named in `given` take those values instead."""
    given = given or {}
    values = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in given:
                v = given[name]
            elif p.ndim >= 2 and not is_control(module, name):
                v = rng.normal(0.0, MATRIX_STD, size=tuple(p.shape))
            else:
                v = p.detach().numpy().astype(np.float64) + rng.normal(
                    0.0, CONTROL_NOISE, size=tuple(p.shape)
                )
            p.copy_(torch.from_numpy(f32(v)))
            values[name] = f32(p)
    return values


# ----------------------------------------------------------------------------------------- cases
def case_newton_schulz(r0404, r0423, rng, out, meta) -> None:
    inputs = [rng.normal(0.0, 1.0, size=s) for s in NS_SHAPES]
    for i, g in enumerate(inputs):
        out[f"ns/in{i}"] = f32(g)
        G = torch.from_numpy(f32(g))
        with float32_for_bfloat16(r0404):
            out[f"ns/classic/out{i}"] = f32(r0404.zeropower_via_newtonschulz5(G.clone(), steps=5))
        with float32_for_bfloat16(r0423):
            out[f"ns/polar/out{i}"] = f32(r0423.zeropower_via_newtonschulz5(G.clone(), steps=5))
        for name, rec, kwargs in (
            ("muoneqr_classic", r0404, {}),
            ("muoneqr_polar", r0423, {"row_normalize": True}),
        ):
            p = torch.nn.Parameter(torch.zeros(G.shape))
            p.grad = G.clone()
            opt = rec.Muon(
                [p], lr=1.0, momentum=0.0, backend_steps=5, nesterov=True, weight_decay=0.0, **kwargs
            )
            with float32_for_bfloat16(rec):
                opt.step()
            out[f"ns/{name}/out{i}"] = f32(-p.detach())
    meta["ns"] = {
        "inputs": "in<i>: numpy default_rng normal(0, 1), shapes " + str(NS_SHAPES),
        "steps": 5,
        "classic": "record 0404 zeropower_via_newtonschulz5(G, steps=5), float32",
        "polar": "record 0423 zeropower_via_newtonschulz5(G, steps=5), float32",
        "polar_coeffs": [list(c) for c in r0423._PE_COEFFS],
        "muoneqr_classic": "record 0404 Muon.step, p=0, grad=G, lr=1, momentum=0, wd=0; out=-p_after "
        "= NS_classic(G / rownorm(G)) * max(1, rows/cols)**0.5",
        "muoneqr_polar": "record 0423 Muon.step(row_normalize=True), same set-up; out=-p_after "
        "= NS_polar(G / rownorm(G)) * max(1, rows/cols)**0.5",
        "shape_scale": [max(1, r / c) ** 0.5 for r, c in NS_SHAPES],
    }


def _model(rec):
    """The record's GPT; its Hyperparameters read the environment when the record was imported."""
    torch.manual_seed(0)
    h = rec.Hyperparameters()
    return h, rec.GPT(h)


def case_loop(r0404, r0423, rng, out, meta) -> None:
    h, model = _model(r0404)
    params = fill_busy(r0404, model, rng)
    for name, v in params.items():
        out[f"loop/param/{name}"] = v
    x = torch.from_numpy(rng.integers(0, h.vocab_size, size=(BATCH, h.train_seq_len)).astype(np.int64))
    y = torch.from_numpy(rng.integers(0, h.vocab_size, size=(BATCH, h.train_seq_len)).astype(np.int64))
    out["loop/x"], out["loop/y"] = x.numpy(), y.numpy()
    model.eval()
    sequences = {}
    for state in ("off", "on"):
        model.set_recurrence_active(state == "on")
        sequences[state] = model._get_virtual_layers()
        with torch.no_grad():
            out[f"loop/logits_{state}"] = f32(model.forward_logits(x))
        model.zero_grad(set_to_none=True)
        loss = model(x, y)
        out[f"loop/loss_{state}"] = f32(loss.reshape(()))
        if state == "on":
            loss.backward()
            for name, p in model.named_parameters():
                if name.startswith(("blocks.1.", "blocks.2.")) or name in ("skip_weights", "lane_merge"):
                    out[f"loop/grad_on/{name}"] = f32(p.grad)
    n_virtual = len(sequences["on"])
    meta["loop"] = {
        "record": "0404",
        "env": ENV_0404,
        "batch": BATCH,
        "virtual_layers_on": sequences["on"],
        "encoder_on": sequences["on"][: n_virtual // 2],
        "decoder_on": sequences["on"][n_virtual // 2 :],
        "virtual_layers_off": sequences["off"],
        "parallel_lanes_from_physical_layer": model.parallel_start_layer,
        "num_skip_weights": model.num_skip_weights,
        "left_at_record_setting": "leaky_relu(0.5)^2 MLP, q/k RMSNorm, resid_mix, q_gain (init QK_GAIN_INIT "
        f"{h.qk_gain_init}), tied embeddings, softcap {h.logit_softcap}, full RoPE (ROPE_DIMS=0 = head_dim)",
        "turned_off": "XSA_LAST_N=0, VE_ENABLED=0, SKIP_GATES_ENABLED=0 (plain x + w*skip), LN_SCALE=0",
        "busy": f"default_rng({SEED}) after case ns; matrices N(0,{MATRIX_STD}); others init + N(0,{CONTROL_NOISE})",
        "loss": "record GPT.forward: mean cross-entropy of softcapped logits, float32",
        "grad_on": "gradient of loss_on for blocks.1.*, blocks.2.* (the looped blocks), skip_weights, lane_merge",
    }

    # 04-23's model: same tensors where the two models share one, banks assembled from the 04-04 matrices.
    h23, m23 = _model(r0423)
    n = h23.num_layers
    shapes23 = {name: tuple(p.shape) for name, p in m23.named_parameters()}
    shared = {
        name: params[name]
        for name, shape in shapes23.items()
        if name in params and params[name].shape == shape
    }
    blk = "blocks.{}.".format
    banks = {
        "qo_bank": [params[blk(i) + "attn.c_q.weight"] for i in range(n)] + [params[blk(i) + "attn.proj.weight"] for i in range(n)],
        "kv_bank": [params[blk(i) + "attn.c_k.weight"] for i in range(n)] + [params[blk(i) + "attn.c_v.weight"] for i in range(n)],
        "mlp_up_bank": [params[blk(i) + "mlp.fc.weight"] for i in range(n)],
        "mlp_down_bank": [params[blk(i) + "mlp.proj.weight"] for i in range(n)],
    }  # fmt: skip
    shared.update({k: np.stack(v) for k, v in banks.items()})
    p23 = fill_busy(r0423, m23, rng, given=shared)
    for name, v in p23.items():
        if name not in banks:
            out[f"loop0423/param/{name}"] = v
    for block in m23.blocks:
        block.mlp.use_fused = False
    m23.eval()
    for state in ("off", "on"):
        m23.looping_active = state == "on"
        with torch.no_grad():
            out[f"loop0423/logits_{state}"] = f32(m23.forward_logits(x))
            out[f"loop0423/loss_{state}"] = f32(m23(x, y).reshape(()))
    meta["loop0423"] = {
        "record": "0423",
        "env": ENV_0423,
        "x_y": "loop/x, loop/y",
        "encoder_on": m23.encoder_indices,
        "decoder_on": m23.decoder_indices,
        "encoder_off": list(range(m23.num_encoder_layers)),
        "decoder_off": list(range(m23.num_encoder_layers, n)),
        "num_skip_weights": m23.num_skip_weights,
        "parallel_final_lane": m23.parallel_final_lane,
        "banks": "qo_bank[i] = loop/param/blocks.i.attn.c_q.weight, qo_bank[n+i] = blocks.i.attn.proj.weight, "
        "kv_bank[i] = blocks.i.attn.c_k.weight, kv_bank[n+i] = blocks.i.attn.c_v.weight, "
        "mlp_up_bank[i] = blocks.i.mlp.fc.weight, mlp_down_bank[i] = blocks.i.mlp.proj.weight (n = 6)",
        "params": "loop0423/param/<name> holds every non-bank tensor; those with a same-named, same-shaped "
        "tensor in loop/param have its values, the rest (skip_weights (5,64), parallel_post_lambdas, "
        "parallel_resid_lambdas) fresh busy values",
        "turned_off": "XSA_LAST_N=0, SKIP_GATES_ENABLED=0, LN_SCALE=0; attention gates and SmearGate are off by "
        "default; FUSED_CE_ENABLED=0 and mlp.use_fused=False (the non-Triton paths)",
    }


def _muon_case(prefix, rec, shapes, wd, kwargs, rng, out, meta_entry) -> None:
    params = {
        k: torch.nn.Parameter(torch.from_numpy(f32(rng.normal(0.0, MATRIX_STD, size=s))))
        for k, s in shapes.items()
    }
    for k, p in params.items():
        out[f"{prefix}/before/{k}"] = f32(p)
    opt = rec.Muon(list(params.values()), lr=MUON_LR, momentum=MUON_MOMENTUM, backend_steps=5, nesterov=True,
                   weight_decay=wd, **kwargs)  # fmt: skip
    for step in (1, 2):
        for k, p in params.items():
            p.grad = torch.from_numpy(f32(rng.normal(0.0, 1.0, size=tuple(p.shape))))
            out[f"{prefix}/grad{step}/{k}"] = f32(p.grad)
        with float32_for_bfloat16(rec):
            opt.step()
        for k, p in params.items():
            out[f"{prefix}/after{step}/{k}"] = f32(p)
            out[f"{prefix}/buf{step}/{k}"] = f32(opt.state[p]["momentum_buffer"])
    meta_entry.update(lr=MUON_LR, momentum=MUON_MOMENTUM, nesterov=True, backend_steps=5, weight_decay=wd,
                      shapes={k: list(s) for k, s in shapes.items()}, **kwargs)  # fmt: skip


def case_muon(r0404, r0423, rng, out, meta) -> None:
    wd04 = r0404.Hyperparameters().muon_wd
    h23 = r0423.Hyperparameters()
    meta["muoneqr"] = {"record": "0404", "class": "Muon (MuonEq-R row normalisation, classic NS)"}
    _muon_case("muoneqr", r0404, MUON_SHAPES, wd04, {}, rng, out, meta["muoneqr"])
    meta["muon0423"] = {"record": "0423", "class": "Muon (Polar Express NS, row_normalize)"}
    _muon_case("muon0423", r0423, BANK_SHAPES, h23.muon_wd, {"row_normalize": h23.muon_row_normalize}, rng, out,
               meta["muon0423"])  # fmt: skip


def case_lr(r0423, out, meta) -> None:
    h = r0423.Hyperparameters()
    warmdown = h.warmdown_frac
    capped_ms = 1e3 * h.max_wallclock_seconds - h.gptq_reserve_seconds * 1e3  # as lines 3079-3083 compute it

    def table(max_ms, min_lr, points):
        hp = types.SimpleNamespace(iterations=LR_ITERATIONS, warmdown_frac=warmdown, min_lr=min_lr)
        fns = nested_functions(
            r0423, "train_model", ("training_frac", "lr_mul"), {"h": hp, "max_wallclock_ms": max_ms}
        )
        fracs = [fns["training_frac"](step, ms) for step, ms in points]
        return np.array(fracs), np.array([fns["lr_mul"](f) for f in fracs])

    steps = np.arange(LR_ITERATIONS + 1)
    frac, mul = table(None, LR_MIN, [(int(s), 0.0) for s in steps])
    _, mul0 = table(None, 0.0, [(int(s), 0.0) for s in steps])
    out.update(
        {
            "lr/step/step": steps.astype(np.int64),
            "lr/step/frac": frac,
            "lr/step/mul": mul,
            "lr/step/mul_minlr0": mul0,
        }
    )
    elapsed = np.unique(
        np.concatenate([np.arange(0.0, 620001.0, 10000.0), capped_ms * np.array([0.25, 0.9, 0.95, 1.0])])
    )
    frac_w, mul_w = table(capped_ms, LR_MIN, [(0, float(ms)) for ms in elapsed])
    out.update({"lr/wall/elapsed_ms": elapsed, "lr/wall/frac": frac_w, "lr/wall/mul": mul_w})
    meta["lr"] = {
        "record": "0423",
        "functions": "train_model.training_frac and train_model.lr_mul (record source), mul = lr_mul(training_frac(step, elapsed_ms))",
        "iterations": LR_ITERATIONS, "warmdown_frac": warmdown, "min_lr": LR_MIN,
        "step": "max_wallclock_ms None: frac = step / iterations; mul_minlr0 is the same with min_lr 0",
        "wall": f"max_wallclock_ms = 1000*{h.max_wallclock_seconds} - 1000*{h.gptq_reserve_seconds} = {capped_ms} "
        "(record defaults MAX_WALLCLOCK_SECONDS, GPTQ_RESERVE_SECONDS); frac = elapsed_ms / max_wallclock_ms",
    }  # fmt: skip


def case_loader(loaders: dict, out, meta) -> None:
    names = [f"fineweb_train_{k:06d}.bin" for k in range(len(SHARD_LENGTHS))]
    runs = {}
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            for name, n, offset in zip(names, SHARD_LENGTHS, SHARD_OFFSETS, strict=True):
                header = np.zeros(256, dtype="<i4")
                header[:3] = (20240520, 1, n)
                with open(name, "wb") as f:
                    f.write(header.tobytes())
                    f.write((offset + np.arange(n)).astype("<u2").tobytes())
            for key, rec in loaders.items():
                for world, rank in ((1, 0), (2, 0), (2, 1)):
                    loader = rec.DistributedTokenLoader(
                        "fineweb_train_*.bin", rank, world, torch.device("cpu")
                    )
                    batches = [
                        loader.next_batch(LOADER_GLOBAL_TOKENS, LOADER_SEQ_LEN, 8 // world)
                        for _ in range(LOADER_BATCHES)
                    ]
                    runs[key, world, rank] = [(x.numpy(), y.numpy()) for x, y in batches]
        finally:
            os.chdir(cwd)
    for (key, world, rank), batches in runs.items():
        for b, (x, y) in enumerate(batches):
            ref_x, ref_y = runs["0404", world, rank][b]
            assert np.array_equal(x, ref_x) and np.array_equal(y, ref_y), f"loader {key} differs from 0404"
            if key == "0404":
                out[f"loader/w{world}r{rank}/x{b}"] = x
                out[f"loader/w{world}r{rank}/y{b}"] = y
    meta["loader"] = {
        "record": "0404",
        "same_batches_from": sorted(k for k in loaders if k != "0404"),
        "shards": names, "shard_lengths": SHARD_LENGTHS,
        "tokens": "shard k, token i: SHARD_OFFSETS[k] + i with SHARD_OFFSETS " + str(SHARD_OFFSETS),
        "format": "256 little-endian int32 header (20240520, 1, n, 0...) then n uint16 tokens",
        "pattern": "fineweb_train_*.bin (relative, glob run in the shard folder; the RNG seed hashes these strings)",
        "call": f"DistributedTokenLoader(pattern, rank, world, cpu).next_batch({LOADER_GLOBAL_TOKENS}, "
        f"{LOADER_SEQ_LEN}, 8 // world) x {LOADER_BATCHES}; a fresh loader per (world, rank)",
        "sequences_per_rank": LOADER_GLOBAL_TOKENS // 8 // LOADER_SEQ_LEN,
    }  # fmt: skip


def sort_metadata(path: Path) -> None:
    """Put the header's metadata entries in key order (safetensors writes them in hash order)."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n], object_pairs_hook=dict)
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    if len(text) > n:
        raise RuntimeError("sorted header is longer than the original")
    path.write_bytes(n.to_bytes(8, "little") + text.ljust(n, b" ") + data[8 + n :])


def main() -> None:
    target = (
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("record_features.safetensors")
    )
    torch.set_num_threads(1)
    install_stubs()
    r0329 = load_record("0329", {})
    r0331 = load_record("0331", {})
    r0404 = load_record("0404", ENV_0404)
    r0423 = load_record("0423", ENV_0423)

    out: dict[str, np.ndarray] = {}
    meta: dict[str, object] = {}
    rng = np.random.default_rng(SEED)
    case_newton_schulz(r0404, r0423, rng, out, meta)
    case_loop(r0404, r0423, rng, out, meta)
    case_muon(r0404, r0423, rng, out, meta)
    case_lr(r0423, out, meta)
    loaders = {"0404": r0404, "0329": r0329}
    if r0331 is not None:
        loaders["0331"] = r0331
    case_loader(loaders, out, meta)

    meta["records"] = {
        k: {"path": f"{RECORD_DIR}/{folder}/train_gpt.py", "commit": MIRROR_COMMIT, "blob": blob}
        for k, (folder, blob) in RECORDS.items()
        if k != "0331" or r0331 is not None
    }
    meta["seed"] = SEED
    meta["torch"] = torch.__version__
    save_file(out, str(target), metadata={k: json.dumps(v) for k, v in meta.items()})
    sort_metadata(target)
    size = target.stat().st_size
    print(f"wrote {target} ({size} bytes, {len(out)} arrays)")


if __name__ == "__main__":
    main()
