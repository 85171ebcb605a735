"""pgolf's training step beside the challenge's own, at one shape, alternated in one process.

The challenge's scripts are not part of pgolf: give their paths (a checkout of
https://github.com/openai/parameter-golf has `train_gpt.py` and `train_gpt_mlx.py` at its root):

    .venv/bin/python bench/side_by_side.py --torch-script PATH/train_gpt.py --mlx-script PATH/train_gpt_mlx.py

or set PGOLF_CHALLENGE_TRAIN_GPT and PGOLF_CHALLENGE_TRAIN_GPT_MLX. Each round times `--steps` optimizer
steps of pgolf's backend, then of the challenge's, on the same random tokens (after one untimed
warm-up step each); the printed ratio is pgolf's tokens/s over the challenge's (above 1: pgolf is
faster). Alternating rounds lets a machine's changing load fall on both sides alike.

The shape is a preset's (`--preset`, default `tiny`: 4 layers of 128, 8,192 tokens a step in 2
micro-batches) with the baseline's features, the only ones the challenge's scripts have. Both run in
fp32 on a CPU (PyTorch: neither compiled; MLX: each at its own compile default), one thread each
(`--threads`). The MLX script computes in bf16; it is timed forced to fp32 too (`COMPUTE_DTYPE`), the
like-for-like figure on a CPU, where MLX has no fast bf16 matmul.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch-script", default=os.environ.get("PGOLF_CHALLENGE_TRAIN_GPT"))
    parser.add_argument("--mlx-script", default=os.environ.get("PGOLF_CHALLENGE_TRAIN_GPT_MLX"))
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per round and side")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if not args.torch_script and not args.mlx_script:
        parser.error("give --torch-script and/or --mlx-script (or PGOLF_CHALLENGE_TRAIN_GPT[_MLX])")
    for path in (args.torch_script, args.mlx_script):
        if path and not Path(path).is_file():
            parser.error(f"no such file: {path}")
    return args


def _challenge_env(cfg) -> None:
    """The challenge's scripts read their settings from the environment when they are imported."""
    os.environ.update(
        VOCAB_SIZE=str(cfg.vocab_size),
        NUM_LAYERS=str(cfg.num_layers),
        MODEL_DIM=str(cfg.model_dim),
        NUM_HEADS=str(cfg.num_heads),
        NUM_KV_HEADS=str(cfg.num_kv_heads),
        MLP_MULT=str(int(cfg.mlp_mult)),
        TRAIN_SEQ_LEN=str(cfg.train_seq_len),
        TRAIN_BATCH_TOKENS=str(cfg.train_batch_tokens),
        GRAD_ACCUM_STEPS=str(cfg.grad_accum_steps),
    )


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _batches(cfg, seed: int = 0):
    """The micro-batches of one step, as numpy (inputs, targets): random tokens, as `cli.py bench`'s."""
    import numpy as np

    rng = np.random.default_rng(seed)
    seqs = cfg.train_batch_tokens // cfg.grad_accum_steps // cfg.train_seq_len
    out = []
    for _ in range(cfg.grad_accum_steps):
        tokens = rng.integers(0, cfg.vocab_size, size=(seqs, cfg.train_seq_len + 1), dtype=np.int32)
        out.append((tokens[:, :-1].copy(), tokens[:, 1:].copy()))
    return out


def _timed(step: Callable[[], None], steps: int) -> float:
    """Tokens per step are equal on both sides, so seconds per step is what is compared."""
    step()  # warm-up, untimed
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def _pgolf_step(cfg, name: str) -> Callable[[], None]:
    from core.model.params import init_params

    if name == "cuda":
        from cuda_train.backend import check_config, create_backend
    else:
        from mlx_train.backend import check_config, create_backend
    check_config(cfg)
    backend = create_backend(cfg)
    backend.load_params(init_params(cfg, bf16=backend.bf16))
    batches = _batches(cfg)

    def step() -> None:
        float(backend.train_step(batches, 1.0, cfg.muon_momentum))
        backend.synchronize()

    return step


def _challenge_torch_step(path: str, cfg) -> Callable[[], None]:
    """The challenge's model and optimizers, set up as its main() sets them up, in fp32 on the CPU."""
    import torch

    ch = _load(path, "challenge_train_gpt")
    a = ch.Hyperparameters()
    model = ch.GPT(vocab_size=a.vocab_size, num_layers=a.num_layers, model_dim=a.model_dim, num_heads=a.num_heads,
                   num_kv_heads=a.num_kv_heads, mlp_mult=a.mlp_mult, tie_embeddings=a.tie_embeddings,
                   tied_embed_init_std=a.tied_embed_init_std, logit_softcap=a.logit_softcap, rope_base=a.rope_base,
                   qk_gain_init=a.qk_gain_init).float()  # fmt: skip
    named = list(model.blocks.named_parameters())
    control = ch.CONTROL_TENSOR_NAME_PATTERNS
    matrices = [p for n, p in named if p.ndim == 2 and not any(c in n for c in control)]
    scalars = [p for n, p in named if p.ndim < 2 or any(c in n for c in control)] + [model.skip_weights]
    lr = a.tied_embed_lr if a.tie_embeddings else a.embed_lr
    optimizers = [
        torch.optim.Adam([model.tok_emb.weight], lr=lr, betas=(a.beta1, a.beta2), eps=a.adam_eps),
        ch.Muon(matrices, lr=a.matrix_lr, momentum=a.muon_momentum, backend_steps=a.muon_backend_steps),
        torch.optim.Adam(scalars, lr=a.scalar_lr, betas=(a.beta1, a.beta2), eps=a.adam_eps),
    ]
    if model.lm_head is not None:
        optimizers.append(torch.optim.Adam([model.lm_head.weight], lr=a.head_lr, betas=(a.beta1, a.beta2)))
    batches = [(torch.from_numpy(x).long(), torch.from_numpy(y).long()) for x, y in _batches(cfg)]

    def step() -> None:
        for x, y in batches:
            (model(x, y) / len(batches)).backward()
        if a.grad_clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip_norm)
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)

    return step


def _challenge_mlx_step(path: str, cfg, fp32: bool) -> Callable[[], None]:
    """The challenge's MLX model, optimizers and accumulation, as its main() runs a step."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_unflatten

    ch = _load(path, f"challenge_train_gpt_mlx_{'fp32' if fp32 else 'bf16'}")
    if fp32:
        ch.COMPUTE_DTYPE = mx.float32
    a = ch.Hyperparameters()
    model = ch.GPT(vocab_size=a.vocab_size, num_layers=a.num_layers, dim=a.model_dim, num_heads=a.num_heads,
                   num_kv_heads=a.num_kv_heads, mlp_mult=a.mlp_mult, logit_chunk_tokens=a.logit_chunk_tokens,
                   logit_softcap=a.logit_softcap, rope_base=a.rope_base, tied_embed_init_std=a.tied_embed_init_std,
                   qk_gain_init=a.qk_gain_init)  # fmt: skip
    opt = ch.SplitOptimizers(model, a)
    loss_and_grad = mx.compile(nn.value_and_grad(model, lambda x, y: model.loss(x, y)),
                               inputs=model.state, outputs=model.state)  # fmt: skip
    micro = iter([])
    batches = _batches(cfg)

    class Loader:  # the micro-batches above, in turn, where its loader reads shards
        def next_batch(self, tokens: int, seq_len: int):
            nonlocal micro
            x, y = next(micro)
            return mx.array(x[: tokens // seq_len]), mx.array(y[: tokens // seq_len])

    loader = Loader()

    def step() -> None:
        nonlocal micro
        micro = iter(
            batches * len(ch.token_chunks(a.microbatch_tokens, a.train_seq_len, a.mlx_max_microbatch_tokens))
        )
        accum = None
        for _ in range(a.grad_accum_steps):
            _, grads = ch.loss_and_grad_chunked(a, loader, loss_and_grad)
            accum = ch.accumulate_flat_grads(accum, grads, 1.0 / a.grad_accum_steps)
        grads = ch.clip_grad_tree(tree_unflatten(list(accum.items())), a.grad_clip_norm)
        opt.step(model, grads, step=1, lr_mul=1.0)
        mx.eval(model.parameters())
        mx.synchronize()

    return step


def main() -> None:
    args = _arguments()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(args.threads)
    sys.path.insert(0, str(ROOT))
    from core.config.presets import preset

    cfg = preset(args.preset).replace(compute_dtype="float32", compile="off")
    _challenge_env(cfg)
    pairs = []  # (label, pgolf's step, the challenge's step)
    if args.torch_script:
        import torch

        torch.set_num_threads(args.threads)
        ours = _pgolf_step(cfg, "cuda")
        pairs.append(("torch", ours, _challenge_torch_step(args.torch_script, cfg)))
    if args.mlx_script:
        ours = _pgolf_step(cfg.replace(compile="auto"), "mlx")
        pairs.append(("mlx vs its fp32", ours, _challenge_mlx_step(args.mlx_script, cfg, fp32=True)))
        pairs.append(("mlx vs its bf16", ours, _challenge_mlx_step(args.mlx_script, cfg, fp32=False)))
    tokens = cfg.train_batch_tokens
    print(f"preset {args.preset}: {cfg.num_layers}x{cfg.model_dim}, {tokens:,} tokens a step, "
          f"{args.threads} thread(s), {args.rounds} rounds of {args.steps} steps each side")  # fmt: skip
    ratios: dict[str, list[float]] = {label: [] for label, _, _ in pairs}
    for r in range(args.rounds):
        for label, ours, theirs in pairs:
            mine, other = _timed(ours, args.steps), _timed(theirs, args.steps)
            ratios[label].append(other / mine)
            print(f"round {r + 1} {label:>15}: pgolf {tokens / mine:8,.0f} tok/s, challenge {tokens / other:8,.0f} "
                  f"tok/s, ratio {other / mine:.2f}x", flush=True)  # fmt: skip
    for label, values in ratios.items():
        print(f"{label:>15}: pgolf/challenge tokens/s {min(values):.2f}-{max(values):.2f}x "
              f"(median {statistics.median(values):.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
