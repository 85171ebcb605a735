"""Golden numbers for the 2026-04-01 record (Vocab4096_MLPMult4_WD085), computed by the record's own code.

The record's ``train_gpt.py`` is not part of pgolf and is never copied here: this script imports it
from a path given in the environment variable ``RECORD_0401``. To get that file (git blob
91b83705bc65fed504e6fa7fbfcb5b89af108d75, checked below) from a clone of openai/parameter-golf:

    git -C <clone> show 4908dc46f21ed3fdd08d2fdca285deb2194b9599:records/track_10min_16mb/2026-04-01_Vocab4096_MLPMult4_WD085/train_gpt.py > /tmp/rec0401.py
    RECORD_0401=/tmp/rec0401.py .venv/bin/python tests/golden/make_record_0401.py

It writes ``tests/golden/record_0401.safetensors`` next to itself (or the path given as the first argument).
Runs on CPU in float32 with one thread, in seconds; two runs give bit-identical tensors and metadata
(safetensors writes the metadata keys in no fixed order, so the bytes of the header may differ).

What runs is the record's own code: ``GPT`` (forward and loss), ``Optimizers``, ``Muon``,
``classify_param``, ``CONTROL_TENSOR_NAME_PATTERNS``, and the closures ``step_fn``, ``training_frac``
and ``lr_mul`` nested in ``train_model`` (rebuilt from their code objects with our own values for the
variables they close over). Four things are substituted so that it runs on a CPU in float32:

1. ``flash_attn_interface.flash_attn_func`` (FlashAttention 3, CUDA only) is a stub module holding
   ``F.scaled_dot_product_attention(..., is_causal=True, enable_gqa=True)`` with the (B, T, H, D)
   layout transposed to (B, H, T, D) and back. Query head h reads key/value head h // (H / H_kv) in both.
2. ``zeropower_via_newtonschulz5`` (``@torch.compile``, bfloat16 inside) is replaced, during the Muon
   step only, by a float32 function with the same coefficients (read from the record's function),
   the same normalisation X / (||X||_F + eps), the same transpose rule and the same operation order.
3. ``Muon.step`` collects the updates in a bfloat16 buffer (``dtype=torch.bfloat16``); during the Muon
   step the module's ``torch`` is a view of torch whose ``bfloat16`` is ``float32``, so the updates
   stay float32. Nothing else in the step reads ``torch.bfloat16``.
4. ``torch.optim.AdamW`` / ``Adam`` are built with ``fused=False`` (the record asks ``fused=True``).

The record's ``step_fn`` wraps the forward in ``torch.autocast("cuda", bfloat16)``, which torch turns off
on a machine without CUDA, so the whole step is float32. The record trains a bfloat16 model
(``GPT(h).bfloat16()`` then ``restore_fp32_params``): here every tensor is float32 instead.
Two things are not functions in the record and are transcribed from it (marked so in the metadata):
the EMA update (lines 1477 and 1511-1513) and the wallclock cap (lines 1412-1414).

Cases (hyperparameters as JSON in the metadata under ``<case>/hparams``; vocab 96, batch 2 x 32 tokens):
  case_full     5 layers, dim 32, 4 heads / 2 kv heads (head_dim 8), mlp_mult 2.5 (hidden 80), partial RoPE
                (4 of 8), LN scale, XSA on the last 3, value embeddings (dim 24, projected to 16) on layers 3,4,
                sigmoid skip gates, tied embeddings. Also a forward at T=48 > train_seq_len=32 (the NTK RoPE
                base rescale) and the EMA.
  case_plain    3 layers, dim 16 (head_dim 4), mlp_mult 2.0, full RoPE; no XSA, value embeddings, skip gates
                or LN scale: the plain leaky-ReLU(0.5)^2 block with additive skips.
  case_untied   2 layers, dim 16, a separate lm_head (AdamW tok at embed_lr, Adam head at head_lr).
  case_embproj  2 layers, dim 16, embedding_dim 12 (embed_proj / head_proj; the record puts these two in no
                optimizer, so they do not move in the step, though their gradients count in the clip norm).
Dims are small so the file stays near 1 MB.

Parameters are "busy": numpy default_rng(seed) in state_dict order; N(0, 0.05) for matrices and
embeddings; for 1-D/0-D tensors and for the 2-D control tensors (resid_mix, skip_weights, skip_gates)
their init value plus N(0, 0.2), so that gates, scales and mixes all matter. Then x and y from the same
generator (and x_long for case_full).

Keys: <case>/param/<name> (before the step), <case>/x, <case>/y, <case>/logits (after the softcap),
<case>/loss, <case>/grad_norm (pre-clip L2 norm of all gradients; both shape (1,)),
<case>/after_step/<name> (one step at lr_mult 0.7, Muon momentum 0.9), case_full/ema/<name> (one EMA
update at 0.997 from the pre-step weights, after the step), case_full/x_long, case_full/logits_long;
lr_table/... (training_frac and lr_mul at a grid of (step, elapsed_ms), variants described in the metadata
``lr_table``); momentum_table/... (transcribed formula); rope_bf16/... (the record's Rotary inv_freq after ``.bfloat16()``). The metadata also holds,
per case, ``param_info`` (shape, optimizer, base lr, weight decay, classify_param, control pattern) and the
largest difference after the step when the record's own bf16 Newton-Schulz or fused CPU AdamW is used.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import record_code
import torch
import torch.nn.functional as F
from record_code import module_from_file, stub_flash_attn
from safetensors.numpy import save_file

RECORD_BLOB = "91b83705bc65fed504e6fa7fbfcb5b89af108d75"
SEED = 20260401
LR_MULT = 0.7
EMA_DECAY = 0.997

COMMON = dict(
    vocab_size=96,
    num_layers=5,
    model_dim=32,
    embedding_dim=32,
    num_heads=4,
    num_kv_heads=2,
    mlp_mult=2.5,
    rope_base=10000.0,
    rope_dims=4,
    train_seq_len=32,
    ln_scale=True,
    xsa_last_n=3,
    ve_enabled=True,
    ve_dim=24,
    ve_layers="3,4",
    skip_gates_enabled=True,
    qk_gain_init=4.0,
    logit_softcap=30.0,
    tie_embeddings=True,
    tied_embed_init_std=0.005,
    embed_lr=0.6,
    head_lr=0.008,
    tied_embed_lr=0.03,
    matrix_lr=0.02,
    scalar_lr=0.02,
    muon_momentum=0.9,
    muon_momentum_warmup_start=0.92,
    muon_momentum_warmup_steps=0,
    muon_backend_steps=5,
    beta1=0.9,
    beta2=0.95,
    adam_eps=1e-8,
    grad_clip_norm=0.3,
    adam_wd=0.02,
    muon_wd=0.085,
    embed_wd=0.085,
    grad_accum_steps=1,
    distributed=False,
    train_batch_tokens=64,
)
SMALL = dict(model_dim=16, embedding_dim=16, rope_dims=2)  # head_dim 4: the other cases only add paths
CASES = {
    "case_full": {},
    "case_plain": dict(
        SMALL,
        num_layers=3,
        mlp_mult=2.0,
        rope_dims=0,
        ln_scale=False,
        xsa_last_n=0,
        ve_enabled=False,
        skip_gates_enabled=False,
    ),
    "case_untied": dict(SMALL, num_layers=2, tie_embeddings=False, xsa_last_n=1, ve_layers="1"),
    "case_embproj": dict(SMALL, num_layers=2, embedding_dim=12, xsa_last_n=2, ve_layers="0"),
}


def sdpa_flash_attn_func(q, k, v, causal=True):
    """FlashAttention's (B, T, H, D) interface on top of PyTorch SDPA."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal, enable_gqa=True
    )
    return out.transpose(1, 2)


def load_record(path: Path) -> types.ModuleType:
    if "CONTROL_TENSOR_NAME_PATTERNS" in os.environ:
        raise SystemExit("unset CONTROL_TENSOR_NAME_PATTERNS: the record reads it at import")
    stub_flash_attn(flash_attn_func=sdpa_flash_attn_func)
    return module_from_file(path, "record_0401", RECORD_BLOB)


def nested(rec, name: str, **free):
    """One of the functions defined inside the record's train_model, closed over our values."""
    return record_code.nested(rec.train_model, name, **free)


def newton_schulz_fp32(rec):
    """The script's Newton-Schulz iteration in float32: coefficients and defaults read from its function
    (the record's is compiled: its original function is read)."""
    fn = rec.zeropower_via_newtonschulz5
    orig = getattr(fn, "_torchdynamo_orig_callable", fn)
    ((a, b, c),) = [k for k in orig.__code__.co_consts if isinstance(k, tuple) and len(k) == 3]
    default_steps, default_eps = orig.__defaults__

    def ns(G, steps=default_steps, eps=default_eps):
        X = G.float()
        X /= X.norm() + eps
        transposed = G.size(0) > G.size(1)
        if transposed:
            X = X.T
        for _ in range(steps):
            A = X @ X.T
            B = b * A + c * A @ A
            X = a * X + B @ X
        return X.T if transposed else X

    return ns


class _TorchBf16AsFp32:
    """torch, except that torch.bfloat16 is float32 (for Muon's update buffer)."""

    bfloat16 = torch.float32

    def __getattr__(self, name):
        return getattr(torch, name)


@contextlib.contextmanager
def patched(obj, **attrs):
    saved = {k: getattr(obj, k) for k in attrs}
    for k, v in attrs.items():
        setattr(obj, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(obj, k, v)


def make_optimizers(rec, h, model, *, fused: bool, muon_fp32: bool):
    def unfused(cls):
        return lambda *a, **k: cls(*a, **{**k, "fused": fused})

    with patched(torch.optim, AdamW=unfused(torch.optim.AdamW), Adam=unfused(torch.optim.Adam)):
        opts = rec.Optimizers(h, model)
    if muon_fp32:
        muon, step = opts.optimizer_muon, opts.optimizer_muon.step
        ns = newton_schulz_fp32(rec)

        def step_fp32(*a, **k):
            with patched(rec, torch=_TorchBf16AsFp32(), zeropower_via_newtonschulz5=ns):
                return step(*a, **k)

        muon.step = step_fp32
    return opts


def param_info(rec, model, opts) -> dict:
    owner = {}
    for label, opt in [
        ("adamw_tok", opts.optimizer_tok),
        ("muon", opts.optimizer_muon),
        ("adamw_scalar", opts.optimizer_scalar),
        ("adam_head", opts.optimizer_head),
    ]:
        for group in opt.param_groups if opt is not None else []:
            for p in group["params"]:
                owner[id(p)] = dict(
                    optimizer=label, base_lr=group["base_lr"], weight_decay=group.get("weight_decay", 0.0)
                )
    return {
        name: dict(
            shape=list(p.shape),
            classify_param=rec.classify_param(name),
            control=any(s in name for s in rec.CONTROL_TENSOR_NAME_PATTERNS),
            **owner.get(id(p), dict(optimizer=None)),
        )
        for name, p in model.named_parameters()
    }


def run_case(rec, hp: dict, seed: int, *, fused=False, muon_fp32=True, extras=False) -> dict:
    h = types.SimpleNamespace(**hp)
    torch.manual_seed(seed)
    model = rec.GPT(h).float()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.state_dict(keep_vars=True).items():
            if p.ndim < 2 or any(s in name for s in rec.CONTROL_TENSOR_NAME_PATTERNS):
                p.add_(torch.from_numpy(rng.normal(0.0, 0.2, size=p.shape)).float())
            else:
                p.copy_(torch.from_numpy(rng.normal(0.0, 0.05, size=p.shape)).float())
    T = h.train_seq_len
    x = torch.from_numpy(rng.integers(0, h.vocab_size, size=(2, T)))
    y = torch.from_numpy(rng.integers(0, h.vocab_size, size=(2, T)))
    out = {"x": x.numpy(), "y": y.numpy()}
    out.update({f"param/{k}": v.detach().numpy().copy() for k, v in model.state_dict().items()})

    with torch.no_grad():
        out["logits"] = model.forward_logits(x).numpy()
        if extras:
            x_long = torch.from_numpy(rng.integers(0, h.vocab_size, size=(1, T + T // 2)))
            out["x_long"] = x_long.numpy()
            out["logits_long"] = model.forward_logits(x_long).numpy()
    loss = model(x, y)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    out["loss"] = np.array([loss.item()], dtype=np.float32)
    out["grad_norm"] = np.array(
        [torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item()],
        dtype=np.float32,
    )
    model.zero_grad(set_to_none=True)

    opts = make_optimizers(rec, h, model, fused=fused, muon_fp32=muon_fp32)
    batches = types.SimpleNamespace(next_batch=lambda *_: (x, y))
    step_fn = nested(
        rec,
        "step_fn",
        base_model=model,
        device=torch.device("cpu"),
        h=h,
        model=model,
        optimizers=opts,
        train_loader=batches,
    )
    ema = {k: t.detach().float().clone() for k, t in model.state_dict().items()}
    model.train()
    # With muon_fp32 False: the record's own bf16 Newton-Schulz, undecorated (eager), for a comparison only.
    eager_ns = rec.zeropower_via_newtonschulz5._torchdynamo_orig_callable
    with patched(rec, zeropower_via_newtonschulz5=eager_ns):
        train_loss = step_fn(0, LR_MULT)
    assert torch.equal(train_loss, loss.detach()), (train_loss, loss)
    for k, t in model.state_dict().items():
        ema[k].mul_(EMA_DECAY).add_(t.detach().float(), alpha=1.0 - EMA_DECAY)
    out.update({f"after_step/{k}": v.detach().numpy().copy() for k, v in model.state_dict().items()})
    if extras:
        out.update({f"ema/{k}": v.numpy() for k, v in ema.items()})
    out["_info"] = param_info(rec, model, opts)
    return out


def lr_tables(rec) -> tuple[dict, dict]:
    steps = np.array(
        [0, 1, 10, 20, 30, 33, 34, 40, 50, 60, 66, 67, 80, 90, 99, 100, 101, 120], dtype=np.int64
    )
    elapsed = np.array(
        [0, 1000, 16650, 16700, 17000, 25000, 40000, 49000, 49999, 50000, 55000, 59999, 60000, 70000],
        dtype=np.float64,
    )
    out, variants = {"lr_table/step": steps, "lr_table/elapsed_ms": elapsed}, {}
    for min_lr in (0.0, 0.1):
        for cap, gptq in ((0.0, True), (60.0, True), (60.0, False)):
            h = types.SimpleNamespace(
                iterations=100,
                warmdown_frac=0.667,
                min_lr=min_lr,
                max_wallclock_seconds=cap,
                gptq_enabled=gptq,
                gptq_reserve_seconds=10.0,
            )
            # train_model lines 1412-1414, transcribed: the cap in ms, less the GPTQ reserve.
            cap_ms = 1000.0 * h.max_wallclock_seconds if h.max_wallclock_seconds > 0 else None
            if h.gptq_enabled and cap_ms is not None:
                cap_ms -= h.gptq_reserve_seconds * 1000.0
            training_frac = nested(rec, "training_frac", h=h, max_wallclock_ms=cap_ms)
            lr_mul = nested(rec, "lr_mul", h=h)
            frac = np.array([[training_frac(int(s), float(e)) for e in elapsed] for s in steps])
            name = f"min_lr_{min_lr}_cap_{int(cap)}s" + ("_gptq_reserve_10s" if cap and gptq else "")
            out[f"lr_table/{name}/frac"] = frac
            out[f"lr_table/{name}/lr_mul"] = np.vectorize(lr_mul)(frac).astype(np.float64)
            variants[name] = {**vars(h), "effective_cap_ms": cap_ms}
    return out, variants


def momentum_table() -> dict:
    # step_fn lines 1443-1444, transcribed (record defaults: 0.92 -> 0.99 over 1500 steps).
    steps = np.array([0, 1, 100, 750, 1499, 1500, 3000], dtype=np.int64)
    frac = np.minimum(steps / 1500, 1.0)
    return {"momentum_table/step": steps, "momentum_table/momentum": (1 - frac) * 0.92 + frac * 0.99}


def main() -> None:
    torch.set_num_threads(1)
    src = os.environ.get("RECORD_0401")
    if not src:
        raise SystemExit(__doc__.split("\n\n")[1])
    rec = load_record(Path(src))
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("record_0401.safetensors")

    tensors, meta = {}, {}
    for i, (case, changes) in enumerate(CASES.items()):
        hp = {**COMMON, **changes}
        res = run_case(rec, hp, SEED + i, extras=case == "case_full")
        meta[f"{case}/param_info"] = json.dumps(res.pop("_info"))
        meta[f"{case}/hparams"] = json.dumps(
            {
                **hp,
                "seed": SEED + i,
                "lr_mult": LR_MULT,
                "ema_decay": EMA_DECAY,
                "batch": [2, hp["train_seq_len"]],
            }
        )
        tensors.update({f"{case}/{k}": v for k, v in res.items()})
        # How far the record's own bf16 Muon and fused AdamW land from the float32 goldens (not stored).
        for label, kw in (
            ("muon_bf16_newton_schulz", dict(muon_fp32=False)),
            ("adam_fused_cpu", dict(fused=True)),
        ):
            alt = run_case(rec, hp, SEED + i, **kw)
            alt.pop("_info")
            diff = max(float(np.max(np.abs(alt[k] - res[k]))) for k in res if k.startswith("after_step/"))
            meta[f"{case}/max_abs_diff_after_step/{label}"] = repr(diff)

    lr, variants = lr_tables(rec)
    tensors.update(lr)
    tensors.update(momentum_table())
    meta["lr_table"] = json.dumps(
        {
            "source": "the record's training_frac and lr_mul code objects; wallclock "
            "cap transcribed from lines 1412-1414",
            "frac/lr_mul shape": "[step, elapsed_ms]",
            "variants": variants,
        }
    )
    meta["momentum_table"] = (
        "transcribed from step_fn lines 1443-1444 with the record's defaults 0.92, 0.99, 1500"
    )
    meta["ema"] = (
        "transcribed from train_model lines 1477, 1511-1513: ema = pre_step.float(); "
        "ema = 0.997 * ema + 0.003 * after_step"
    )

    rot = rec.Rotary(64, base=10000.0, train_seq_len=2048, rope_dims=16)
    tensors["rope_bf16/inv_freq_fp32"] = rot.inv_freq.numpy().copy()
    tensors["rope_bf16/inv_freq_after_module_bfloat16"] = rot.bfloat16().inv_freq.float().numpy()
    meta["rope_bf16"] = (
        "record Rotary(head_dim 64, rope_dims 16): its inv_freq buffer before and after "
        "Module.bfloat16(), which train_model applies and restore_fp32_params does not undo"
    )
    meta["record"] = (
        f"records/track_10min_16mb/2026-04-01_Vocab4096_MLPMult4_WD085/train_gpt.py blob {RECORD_BLOB}"
    )
    meta["substitutions"] = (
        "flash_attn_func -> torch SDPA (enable_gqa); Newton-Schulz in float32 with the record's "
        "coefficients; Muon update buffer float32; AdamW/Adam fused=False; no bf16 autocast "
        "(CUDA absent); model in float32"
    )
    meta["torch"] = torch.__version__
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(dest), metadata=meta)
    print(f"wrote {dest} ({dest.stat().st_size} bytes, {len(tensors)} tensors)")


if __name__ == "__main__":
    main()
