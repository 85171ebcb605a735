"""A training trajectory of record 2026-04-01 (Vocab4096_MLPMult4_WD085), computed by its own code.

The record's ``train_gpt.py`` is imported from the path in ``RECORD_0401``, as
``make_record_0401.py`` does (its docstring says where to get the file; its helpers are reused here):

    RECORD_0401=/tmp/rec0401.py .venv/bin/python tests/golden/make_trajectory_0401.py

It writes, next to itself, ``trajectory_0401_init.safetensors`` (the initial weights, what
``train --init-from`` takes) and ``trajectory_0401.safetensors`` (the token streams of the three shards,
the per-step training losses, the final weights and their moving average; the record's environment in
its metadata). CPU, float32, one thread.

What runs is the record's own code: ``GPT`` (its own initialisation under ``torch.manual_seed(SEED)``),
``Optimizers`` (Muon with decoupled weight decay, AdamW on the embeddings and the scalars),
``DistributedTokenLoader`` (the coprime-stride multi-shard sampler, over shards this script writes and
globs by bare file name from inside their folder, the names pgolf's loader hashes), and the closures
``step_fn`` (micro-batches, Muon momentum warm-up, lr, grad clip 0.3, the steps), ``training_frac`` and
``lr_mul`` (warm-down by fraction to a floor of MIN_LR) of ``train_model``, rebuilt over our values
(``max_wallclock_ms=None``: by steps). Transcribed from ``train_model`` (no function there): the step
loop and the moving average of the weights after each step. Substituted, as in make_record_0401.py: the
model is float32 (the record trains a bf16 model with fp32 linear layers and small tensors, so its
embedding tables and RoPE tables are bf16; pgolf at compute_dtype=float32 with rope_precision=float32
is compared), Newton-Schulz and Muon's update buffer are float32, AdamW is not fused.

Settings (``ENV``): 5 layers of width 32 (4 heads, 2 KV heads), MLP x2.5, partial RoPE (4 of 8), LN scale,
XSA on the last 3, value embeddings (dim 24) on layers 3 and 4, skip gates, tied embeddings, vocabulary
1024; 8 micro-batches of 2 x 32 tokens a step; 30 steps, warm-down over the last 0.667 of them to a
floor of 0.1, Muon momentum 0.92 to 0.99 over 10 steps, EMA decay 0.9 (so that 30 steps move it),
Adam eps 1e-10 instead of 1e-8. Adam's step, lr * m / (sqrt(v) + eps), is about lr * sign(g) where
|g| >> eps and follows g where |g| is near eps, so any element whose gradient is within a few eps of
zero turns float32 round-off into a visible difference. At eps 1e-8 about 50 embedding entries are such
at step 1 (see make_trajectory_baseline.py), and at 1e-12 the whole value-embedding table is: its
projection starts at zero, so its first gradients are 1e-12 to 1e-13, results of cancellation whose
round-off is 0.5% of them, and there eps 1e-12 makes them full-size steps (3.7e-4 relative in the
table after 30 steps, PyTorch backend). At 1e-10 neither happens: 1.6e-5 at most.
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
from make_record_0401 import COMMON, load_record, make_optimizers, nested
from make_trajectory_baseline import write_shard
from safetensors.numpy import save_file

SEED = 20260401
SHARD_TOKENS = (12_000, 9_000, 15_000)
VOCAB = 1024
SETTINGS = dict(
    vocab_size=VOCAB, num_layers=5, model_dim=32, embedding_dim=32, num_heads=4, num_kv_heads=2, mlp_mult=2.5,
    rope_dims=4, ln_scale=True, xsa_last_n=3, ve_enabled=True, ve_dim=24, ve_layers="3,4",
    skip_gates_enabled=True, qk_gain_init=4.0, tie_embeddings=True, train_seq_len=32, train_batch_tokens=512,
    iterations=30, warmdown_frac=0.667, min_lr=0.1, warmup_steps=0, max_wallclock_seconds=0.0,
    muon_momentum=0.99, muon_momentum_warmup_start=0.92, muon_momentum_warmup_steps=10, ema_decay=0.9,
    adam_eps=1e-10, seed=SEED,
)  # fmt: skip
# The same as the record's environment variables (booleans as 0/1).
ENV = {k.upper(): str(int(v)) if isinstance(v, bool) else str(v) for k, v in SETTINGS.items()}
OUT = Path(__file__).resolve().parent


def shard_streams() -> list[np.ndarray]:
    """Seeded random walks over the vocabulary (each token 3 x the previous plus 0..7, mod VOCAB)."""
    rng = np.random.default_rng(SEED)
    out = []
    for n in SHARD_TOKENS:
        steps = rng.integers(0, 8, size=n)
        tokens = np.empty(n, dtype=np.uint16)
        tokens[0] = rng.integers(0, VOCAB)
        for i in range(1, n):
            tokens[i] = (3 * int(tokens[i - 1]) + int(steps[i])) % VOCAB
        out.append(tokens)
    return out


def hparams() -> types.SimpleNamespace:
    """The record's Hyperparameters at SETTINGS (the fields its model, optimizers and closures read)."""
    return types.SimpleNamespace(**{**COMMON, **SETTINGS, "grad_accum_steps": 8, "distributed": False})


def main() -> None:
    torch.set_num_threads(1)
    path = os.environ.get("RECORD_0401")
    if not path:
        raise SystemExit("set RECORD_0401 to the record's train_gpt.py")
    rec = load_record(Path(path))
    h = hparams()
    streams = shard_streams()
    here = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        for i, tokens in enumerate(streams):
            write_shard(Path(tmp) / f"fineweb_train_{i:06d}.bin", tokens)
        os.chdir(tmp)  # the record hashes the glob's strings: bare names, as pgolf hashes
        try:
            torch.manual_seed(h.seed)
            model = rec.GPT(h).float()
            init = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
            opts = make_optimizers(rec, h, model, fused=False, muon_fp32=True)
            loader = rec.DistributedTokenLoader("fineweb_train_*.bin", 0, 1, torch.device("cpu"))
            step_fn = nested(
                rec, "step_fn", base_model=model, device=torch.device("cpu"), h=h, model=model,
                optimizers=opts, train_loader=loader,
            )  # fmt: skip
            training_frac = nested(rec, "training_frac", h=h, max_wallclock_ms=None)
            lr_mul = nested(rec, "lr_mul", h=h)
            ema = {k: t.detach().float().clone() for k, t in model.state_dict().items()}
            losses = []
            model.train()
            for step in range(h.iterations):  # transcribed from train_model: the loop and the EMA
                scale = lr_mul(training_frac(step, 0.0))
                losses.append(step_fn(step, scale).item())
                with torch.no_grad():
                    for k, t in model.state_dict().items():
                        ema[k].mul_(h.ema_decay).add_(t.detach().float(), alpha=1.0 - h.ema_decay)
                print(f"step:{step + 1} train_loss:{losses[-1]:.6f} lr_mul:{scale:.4f}")
        finally:
            os.chdir(here)
    final = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    meta = {
        "env": json.dumps(ENV),
        "transcribed": "train_model: the step loop; the moving average after each step",
        "substituted": "float32 model; float32 Newton-Schulz and Muon buffer; AdamW fused=False",
    }
    save_file(init, str(OUT / "trajectory_0401_init.safetensors"))
    tensors = {f"train_tokens_{i}": t for i, t in enumerate(streams)}
    tensors["train_loss"] = np.array(losses, dtype=np.float64)
    tensors.update({f"final/{k}": v for k, v in final.items()})
    tensors.update({f"ema/{k}": v.numpy() for k, v in ema.items()})
    save_file(tensors, str(OUT / "trajectory_0401.safetensors"), metadata=meta)
    print(f"wrote {OUT / 'trajectory_0401.safetensors'} and the init beside it", file=sys.stderr)


if __name__ == "__main__":
    main()
