"""A training trajectory of the challenge's baseline ``train_gpt.py``, computed by its own code.

The script is not part of pgolf and is never copied here: this script imports it from a path given
in the environment variable ``BASELINE_TRAIN_GPT`` (the root ``train_gpt.py`` of openai/parameter-golf;
git blob checked below, a warning when it differs):

    BASELINE_TRAIN_GPT=/path/to/parameter-golf/train_gpt.py .venv/bin/python tests/golden/make_trajectory_baseline.py

It writes, next to itself, ``trajectory_baseline_init.safetensors`` (the model's initial weights, what
``train --init-from`` takes) and ``trajectory_baseline.safetensors`` (the token stream, the per-step
training losses and the final weights; the settings in its metadata). CPU, float32, one thread: a few
seconds; two runs give the same tensors bit for bit.

What runs is the baseline's own code: ``Hyperparameters`` (read from the environment at import, as the
script does: ``ENV`` below), ``GPT`` (its own initialisation under ``torch.manual_seed(SEED)``, forward
and loss), ``TokenStream`` / ``DistributedTokenLoader`` over a shard this script writes, ``Muon``,
``CONTROL_TENSOR_NAME_PATTERNS``, and ``lr_mul`` (the closure in ``main``, rebuilt from its code object
over our ``args`` and ``max_wallclock_ms=None``). ``main`` itself needs CUDA, so two pieces of it are
transcribed (marked so in the metadata): the optimizer split (its four optimizers and their groups) and
the body of a training step (zero grads, the micro-batches with ``loss * grad_scale`` backward, the mean
train loss, the Muon momentum warm-up, lr = base_lr * lr_mul, the optional grad clip, every optimizer's
step). Substituted so that it runs on a CPU in float32:

1. the model is ``.float()`` (the script casts it to bfloat16 and puts the linear layers and the small
   tensors back to float32, so its token embedding trains in bfloat16; pgolf at compute_dtype=float32
   keeps every parameter in float32, which is what is compared here);
2. ``zeropower_via_newtonschulz5`` (``torch.compile``d, bfloat16 inside) is, during Muon's step, a float32
   function with the coefficients and defaults read from the script's own function, same operation order;
3. Muon's bfloat16 update buffer is float32 (the module's ``torch`` is a view whose ``bfloat16`` is float32
   during the step);
4. ``torch.optim.Adam`` is built with ``fused=False``; ``torch.autocast("cuda")`` is off on a CPU.

The token stream: ``TOKENS`` tokens of a seeded random walk over the 1024-token vocabulary (each token
is 3 x the previous plus 0..7, mod 1024), so that there is something to learn in 30 steps. The model:
4 layers of width 32 (4 heads, 2 KV heads), MLP x2, tied embeddings; 8 micro-batches of 2 x 32 tokens a
step (the script's grad_accum_steps for one process); 30 steps, the last 10 a linear warm-down, the Muon
momentum warming up from 0.85 to 0.95 over 10 steps, grad clip 1.0, and Adam's eps 1e-12 instead of
1e-8. Why the eps: Adam's first step is lr * g / (|g| + eps), about lr * sign(g), except for the
elements whose gradient is within a few eps of zero, where the step follows g itself and so amplifies
float32 round-off. At this size about 50 of the 32,768 embedding entries have such a gradient at step 1;
with eps 1e-8 they put the MLX backend (whose kernels round differently from PyTorch's) 3e-5 apart from
the script after one step, and Muon carries that to 7e-4 in the attention projections by step 30
(PyTorch's, 5e-6). With eps 1e-12 the two backends stay 1e-5 apart at every step.
"""

from __future__ import annotations

import json
import os
import tempfile
import types
from pathlib import Path

import numpy as np
import record_code
import torch
from make_record_0401 import _TorchBf16AsFp32, newton_schulz_fp32, patched
from record_code import module_from_file
from safetensors.numpy import save_file

SCRIPT_BLOB = "651beb2b895c3ff8ba4a232914d8b3772baaa868"
SEED = 20260317
TOKENS = 40_000
VOCAB = 1024
ENV = {
    "VOCAB_SIZE": "1024",
    "NUM_LAYERS": "4",
    "MODEL_DIM": "32",
    "NUM_HEADS": "4",
    "NUM_KV_HEADS": "2",
    "MLP_MULT": "2",
    "TRAIN_SEQ_LEN": "32",
    "TRAIN_BATCH_TOKENS": "512",
    "ITERATIONS": "30",
    "WARMDOWN_ITERS": "10",
    "WARMUP_STEPS": "0",
    "MAX_WALLCLOCK_SECONDS": "0",
    "MUON_MOMENTUM_WARMUP_STEPS": "10",
    "GRAD_CLIP_NORM": "1.0",
    "ADAM_EPS": "1e-12",
    "SEED": str(SEED),
}
OUT = Path(__file__).resolve().parent


def write_shard(path: Path, tokens: np.ndarray) -> None:
    """The challenge's shard layout: 256 int32 (magic 20240520, version 1, count), then uint16 tokens."""
    header = np.zeros(256, dtype="<i4")
    header[:3] = (20240520, 1, tokens.size)
    path.write_bytes(header.tobytes() + tokens.astype("<u2").tobytes())


def token_stream() -> np.ndarray:
    rng = np.random.default_rng(SEED)
    steps = rng.integers(0, 8, size=TOKENS)
    tokens = np.empty(TOKENS, dtype=np.uint16)
    tokens[0] = 1
    for i in range(1, TOKENS):
        tokens[i] = (3 * int(tokens[i - 1]) + int(steps[i])) % VOCAB
    return tokens


def load_script(path: Path) -> types.ModuleType:
    return module_from_file(path, "baseline_train_gpt", SCRIPT_BLOB)


def nested(mod, name: str, **free):
    """A function defined inside the script's main, closed over our values."""
    return record_code.nested(mod.main, name, **free)


def optimizers(mod, args, base_model):
    """Transcribed from main: the optimizer split (fused=False on a CPU)."""
    block_named_params = list(base_model.blocks.named_parameters())
    control = mod.CONTROL_TENSOR_NAME_PATTERNS
    matrix_params = [p for n, p in block_named_params if p.ndim == 2 and not any(c in n for c in control)]
    scalar_params = [p for n, p in block_named_params if p.ndim < 2 or any(c in n for c in control)]
    if base_model.skip_weights.numel() > 0:
        scalar_params.append(base_model.skip_weights)
    token_lr = args.tied_embed_lr if args.tie_embeddings else args.embed_lr
    betas = (args.beta1, args.beta2)
    opt_tok = torch.optim.Adam(
        [{"params": [base_model.tok_emb.weight], "lr": token_lr, "base_lr": token_lr}],
        betas=betas, eps=args.adam_eps, fused=False,
    )  # fmt: skip
    opt_muon = mod.Muon(
        matrix_params, lr=args.matrix_lr, momentum=args.muon_momentum, backend_steps=args.muon_backend_steps
    )
    for group in opt_muon.param_groups:
        group["base_lr"] = args.matrix_lr
    opt_scalar = torch.optim.Adam(
        [{"params": scalar_params, "lr": args.scalar_lr, "base_lr": args.scalar_lr}],
        betas=betas, eps=args.adam_eps, fused=False,
    )  # fmt: skip
    opts = [opt_tok, opt_muon, opt_scalar]
    if base_model.lm_head is not None:
        opt_head = torch.optim.Adam(
            [{"params": [base_model.lm_head.weight], "lr": args.head_lr, "base_lr": args.head_lr}],
            betas=betas, eps=args.adam_eps, fused=False,
        )  # fmt: skip
        opts.insert(1, opt_head)
    return opts, opt_muon


def main() -> None:
    torch.set_num_threads(1)
    path = os.environ.get("BASELINE_TRAIN_GPT")
    if not path:
        raise SystemExit("set BASELINE_TRAIN_GPT to the challenge's train_gpt.py")
    tokens = token_stream()
    with tempfile.TemporaryDirectory() as tmp:
        write_shard(Path(tmp) / "fineweb_train_000000.bin", tokens)
        os.environ.update(ENV, DATA_PATH=tmp)
        mod = load_script(Path(path))
        args = mod.Hyperparameters()
        grad_accum_steps = 8  # main's 8 // world_size, one process
        grad_scale = 1.0 / grad_accum_steps
        torch.manual_seed(args.seed)
        base_model = mod.GPT(
            vocab_size=args.vocab_size, num_layers=args.num_layers, model_dim=args.model_dim,
            num_heads=args.num_heads, num_kv_heads=args.num_kv_heads, mlp_mult=args.mlp_mult,
            tie_embeddings=args.tie_embeddings, tied_embed_init_std=args.tied_embed_init_std,
            logit_softcap=args.logit_softcap, rope_base=args.rope_base, qk_gain_init=args.qk_gain_init,
        ).float()  # fmt: skip
        init = {k: v.detach().numpy().copy() for k, v in base_model.state_dict().items()}
        opts, opt_muon = optimizers(mod, args, base_model)
        lr_mul = nested(mod, "lr_mul", args=args, max_wallclock_ms=None)
        loader = mod.DistributedTokenLoader(args.train_files, 0, 1, torch.device("cpu"))
        ns = newton_schulz_fp32(mod)
        losses = []
        base_model.train()
        for step in range(args.iterations):  # transcribed from main: one training step
            scale = lr_mul(step, 0.0)
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            train_loss = torch.zeros(())
            for _ in range(grad_accum_steps):
                x, y = loader.next_batch(args.train_batch_tokens, args.train_seq_len, grad_accum_steps)
                loss = base_model(x, y)
                train_loss += loss.detach()
                (loss * grad_scale).backward()
            train_loss /= grad_accum_steps
            warm = args.muon_momentum_warmup_steps
            frac = min(step / warm, 1.0) if warm > 0 else 1.0
            for group in opt_muon.param_groups:
                group["momentum"] = (1 - frac) * args.muon_momentum_warmup_start + frac * args.muon_momentum
            for opt in opts:
                for group in opt.param_groups:
                    group["lr"] = group["base_lr"] * scale
            if args.grad_clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(base_model.parameters(), args.grad_clip_norm)
            with patched(mod, torch=_TorchBf16AsFp32(), zeropower_via_newtonschulz5=ns):
                for opt in opts:
                    opt.step()
            losses.append(train_loss.item())
            print(f"step:{step + 1} train_loss:{train_loss.item():.6f} lr_mul:{scale:.3f}")
        final = {k: v.detach().numpy().copy() for k, v in base_model.state_dict().items()}
    meta = {
        "env": json.dumps(ENV),
        "script_blob": SCRIPT_BLOB,
        "transcribed": "main: the optimizer split; the body of a training step",
        "substituted": "float32 model; float32 Newton-Schulz and Muon buffer; Adam fused=False",
        "grad_accum_steps": str(grad_accum_steps),
    }
    save_file(init, str(OUT / "trajectory_baseline_init.safetensors"))
    tensors = {"train_tokens": tokens, "train_loss": np.array(losses, dtype=np.float64)}
    tensors.update({f"final/{k}": v for k, v in final.items()})
    save_file(tensors, str(OUT / "trajectory_baseline.safetensors"), metadata=meta)
    print(f"wrote {OUT / 'trajectory_baseline.safetensors'} and the init beside it")


if __name__ == "__main__":
    main()
