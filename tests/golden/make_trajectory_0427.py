"""A training trajectory of record 2026-04-27 (SP8192_LQER_SparseGate_BOSSmearFix_9HpStack), by its own code.

The record's ``train_gpt.py`` is imported from the path in ``RECORD_0427`` through the loader and stubs of
``make_record_features.py`` (its docstring: FlashAttention and its varlen kernel as PyTorch SDPA, exact
per sequence; triton a stub; ``torch.compile`` the identity); ``make_record_0427.py`` says how to get the
file (git blob checked):

    RECORD_0427=/tmp/rec0427.py .venv/bin/python tests/golden/make_trajectory_0427.py

It writes, next to itself, ``trajectory_0427_init.safetensors`` (the initial weights, its banks split
into pgolf's per-layer matrices: what ``train --init-from`` takes) and ``trajectory_0427.safetensors``
(the token stream, the per-step training losses, the final weights and their moving average under
pgolf's names; the record's environment in its metadata). CPU, float32, one thread: seconds.

What runs is the record's own code: ``Hyperparameters`` (read from ``ENV`` at import), ``GPT`` (its own
initialisation under ``torch.manual_seed(SEED)``: the four banks, SmearGate masked at BOS, the sparse
attention gate, depth recurrence, two parallel lanes, XSA, partial RoPE, LN scale, skip gates),
``Optimizers`` (``Muon`` over the banks with Polar Express Newton-Schulz, MuonEq-R row normalisation and
decoupled weight decay: the record's Parallel Muon, here at world size 1, where it updates bank by bank
without the reduce-scatter; AdamW on the embedding and the scalars), ``DocumentPackingLoader`` (over a
shard this script writes; its ``cu_seqlens`` go to the model as in training), and the closures
``step_fn``, ``training_frac`` and ``lr_mul`` of ``train_model`` rebuilt over our values
(``max_wallclock_ms=None``: by steps). Transcribed from ``train_model`` (no function there): the step
loop, the switch that turns the loops on at ``ENABLE_LOOPING_AT`` of training, and the moving average
after each step. Substituted so that it runs on a CPU in float32: the model is float32 (the record casts
it to bfloat16 and puts back to float32 everything but the token embedding, which trains in bfloat16;
pgolf at compute_dtype=float32 keeps it in float32); Newton-Schulz and Muon's gradient and momentum run
in float32 (``Tensor.bfloat16`` returns a float32 copy during Muon's step); AdamW is not fused; the MLP's
Triton kernel and the fused cross-entropy are off (``mlp.use_fused = False``, ``FUSED_CE_ENABLED=0``:
the record's own eager paths); ``torch.cuda.Stream`` / ``stream`` / ``current_stream`` (the side stream
of ``Optimizers.step``) are no-ops; pinned memory is ordinary memory.

The initial weights are the record's own initialisation except for the tensors it initialises to all
zeros (``mlp_down_bank``, ``skip_gates``, ``smear_lambda``, ``smear_gate.weight``, each layer's
``attn_gate_w``; listed in the metadata as ``unzeroed``), which get N(0, ``ZERO_INIT_STD``) values from
``default_rng(SEED + 1)``; the attention output projections, zero halves of ``qo_bank``, stay zero. Why:
with every MLP and attention output zero, the two parallel lanes are the same multiple of the input at
the final RMSNorm, whose scale invariance makes the gradient of ``parallel_resid_lambdas`` zero but for
round-off (1e-10); Adam's first step, lr * g / (|g| + eps), turns that round-off into a step of up to lr,
so a backend rounding differently ends 9e-4 apart in those lambdas after one step (the same holds in the
record: its first step moves them by round-off). Likewise ``smear_gate.weight`` has no gradient while
``smear_lambda`` is zero. From the unzeroed init every gradient is a real one.

The record has no weight-decay taper (that came with 2026-04-18; pgolf's ``wd_taper_*`` stay off here).

The batches: the record packs ``TRAIN_BATCH_TOKENS / 8`` tokens a micro-batch as one flat sequence,
cuts attention at every BOS (and every ``TRAIN_SEQ_LEN`` tokens of a document) and gives RoPE the
positions of the flat sequence. At ``TRAIN_BATCH_TOKENS = 8 * TRAIN_SEQ_LEN`` a micro-batch is one row
of ``TRAIN_SEQ_LEN`` tokens, and the record's loader (start at the first BOS, take ``T + 1`` tokens, move
on ``T + 1``) is pgolf's sequential loader over a stream that starts with BOS: the same rows, and its
attention segments are pgolf's document mask (``varlen_attn_enabled``) of each row. So the token stream
(``TOKENS`` tokens) is documents of 4 to 60 tokens (shorter and longer than a row), each BOS (id 1) then
a seeded random walk over ids 2..1023 (each 3 x the previous plus 0..7), and it starts with BOS.

Settings (``ENV``): 5 layers of width 32 (4 heads, 2 KV heads), MLP x2.5, partial RoPE (4 of 8), LN
scale, XSA on all 5, QK gain 5, skip gates; layers 1..2 looped once more from 35% of training (the 12th
of the 30 steps is the first looped one), two parallel lanes from layer 3; SmearGate (window 8) and the
sparse attention gate (scale 0.5); tied embeddings, vocabulary 1024; 8 micro-batches of one 32-token row;
30 steps, warm-down over the last 0.85 to a floor of 0.1, Muon momentum 0.92 to 0.97 over 10 steps,
weight decay (Muon 0.095, embedding 0.085, Adam 0.02), grad clip 0.3, beta2 0.99, EMA decay 0.9, Adam eps
1e-10 (see make_trajectory_0401.py for why not 1e-8 or 1e-12; here eps 1e-8 puts MLX 1.4e-4 apart).
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record_code
from make_record_0401 import nested, patched
from make_record_0427 import _store_params
from make_trajectory_baseline import write_shard

record_code.RECORDS["0427"] = (
    "2026-04-27_SP8192_LQER_SparseGate_BOSSmearFix_9HpStack_1.0611",
    "9979400ef9f10da2fa908d9e7ce3556b82165b2a",
)
SEED = 20260427
TOKENS = 9_000
VOCAB = 1024
BOS = 1
DOC_LENGTHS = (4, 60)
ZERO_INIT_STD = 0.02
SETTINGS = dict(
    vocab_size=VOCAB, num_layers=5, model_dim=32, num_heads=4, num_kv_heads=2, mlp_mult=2.5, rope_dims=4,
    ln_scale=True, xsa_last_n=5, qk_gain_init=5.0, skip_gates_enabled=True, tie_embeddings=True,
    num_loops=1, loop_start=1, loop_end=2, enable_looping_at=0.35, parallel_start_layer=3,
    parallel_final_lane="mean", smear_gate_enabled=True, gate_window=8, sparse_attn_gate_enabled=True,
    sparse_attn_gate_init_std=0.0, sparse_attn_gate_scale=0.5, train_seq_len=32, eval_seq_len=32,
    train_batch_tokens=256, iterations=30, warmdown_frac=0.85, min_lr=0.1, warmup_steps=0,
    max_wallclock_seconds=0.0, matrix_lr=0.026, muon_momentum=0.97, muon_momentum_warmup_start=0.92,
    muon_momentum_warmup_steps=10, muon_row_normalize=True, muon_wd=0.095, embed_wd=0.085, adam_wd=0.02,
    grad_clip_norm=0.3, beta2=0.99, ema_decay=0.9, adam_eps=1e-10, seed=SEED,
)  # fmt: skip
# The record's environment variables (booleans as 0/1); FUSED_CE_ENABLED only selects its eager loss.
ENV = {k.upper(): str(int(v)) if isinstance(v, bool) else str(v) for k, v in SETTINGS.items()}
RECORD_ONLY_ENV = {"FUSED_CE_ENABLED": "0"}


def token_stream() -> np.ndarray:
    """Documents of DOC_LENGTHS tokens: BOS, then a random walk over ids 2..VOCAB-1."""
    rng = np.random.default_rng(SEED)
    tokens = np.empty(TOKENS, dtype=np.uint16)
    i = 0
    while i < TOKENS:
        n = int(rng.integers(DOC_LENGTHS[0], DOC_LENGTHS[1] + 1))
        walk = int(rng.integers(0, VOCAB - 2))
        tokens[i] = BOS
        for j in range(i + 1, min(i + n, TOKENS)):
            walk = (3 * walk + int(rng.integers(0, 8))) % (VOCAB - 2)
            tokens[j] = walk + 2
        i += n
    return tokens


class _NoStream:
    def wait_stream(self, other) -> None:
        pass


@contextlib.contextmanager
def on_cpu():
    """Optimizers.step's CUDA side stream as no-ops; pinned memory as ordinary memory."""
    real_empty = torch.empty

    def empty(*a, pin_memory=False, **k):
        return real_empty(*a, **k)

    with (
        patched(
            torch.cuda, Stream=_NoStream, current_stream=_NoStream, stream=lambda s: contextlib.nullcontext()
        ),
        patched(torch, empty=empty),
        patched(torch.Tensor, pin_memory=lambda self: self),
    ):
        yield


def make_optimizers(rec, h, model):
    """The record's Optimizers, AdamW unfused; its Muon step in float32 (the record's own NS function)."""

    def unfused(cls):
        return lambda *a, **k: cls(*a, **{**k, "fused": False})

    with patched(torch.optim, AdamW=unfused(torch.optim.AdamW)):
        opts = rec.Optimizers(h, model)
    muon, step = opts.optimizer_muon, opts.optimizer_muon.step

    def step_fp32(*a, **k):
        with record_code.float32_for_bfloat16(rec):
            return step(*a, **k)

    muon.step = step_fp32
    return opts


def unzero(model, rng) -> list[str]:
    """Give each all-zero tensor of the record's init N(0, ZERO_INIT_STD) values (the docstring says why)."""
    names = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.any():
                p.copy_(
                    torch.from_numpy(rng.normal(0.0, ZERO_INIT_STD, size=tuple(p.shape)).astype(np.float32))
                )
                names.append(name)
    return names


def rows_checked(next_batch, tokens: np.ndarray, seq_len: int):
    """The loader's next_batch, checked to give pgolf's sequential rows and its BOS segments."""
    count = 0

    def checked(*a, **k):
        nonlocal count
        x, y, cu, max_seqlen = next_batch(*a, **k)
        start = count * (seq_len + 1)
        row = tokens[start : start + seq_len + 1].astype(np.int64)
        assert x.shape == (1, seq_len) and np.array_equal(x[0].numpy(), row[:-1])
        assert np.array_equal(y[0].numpy(), row[1:])
        bounds = sorted({0, seq_len, *np.flatnonzero(row[:-1] == BOS).tolist()})
        assert np.array_equal(np.unique(cu.numpy()), bounds), (cu, bounds)
        count += 1
        return x, y, cu, max_seqlen

    return checked


def main() -> None:
    torch.set_num_threads(1)
    record_code.install_stubs()
    rec = record_code.load_record("0427", {**ENV, **RECORD_ONLY_ENV})
    h = rec.Hyperparameters()
    assert h.grad_accum_steps == 8 and h.train_batch_tokens == 8 * h.train_seq_len
    tokens = token_stream()
    with tempfile.TemporaryDirectory() as tmp, on_cpu():
        write_shard(Path(tmp) / "fineweb_train_000000.bin", tokens)
        h.train_files = str(Path(tmp) / "fineweb_train_*.bin")
        torch.manual_seed(h.seed)
        model = rec.GPT(h).float()
        for block in model.blocks:
            block.mlp.use_fused = False
        zeros = unzero(model, np.random.default_rng(SEED + 1))
        init = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
        opts = make_optimizers(rec, h, model)
        loader = rec.DocumentPackingLoader(h, torch.device("cpu"))
        loader.next_batch = rows_checked(loader.next_batch, tokens, h.train_seq_len)
        clip = [p for p in model.parameters() if p.requires_grad]
        step_fn = nested(
            rec, "step_fn", _clip_params=clip, device=torch.device("cpu"), h=h, model=model,
            optimizers=opts, train_loader=loader,
        )  # fmt: skip
        training_frac = nested(rec, "training_frac", h=h, max_wallclock_ms=None)
        lr_mul = nested(rec, "lr_mul", h=h)
        ema = {k: t.detach().float().clone() for k, t in model.state_dict().items()}
        losses, loop_step = [], None
        model.train()
        for step in range(h.iterations):  # transcribed from train_model: the loop, the loop switch, the EMA
            frac = training_frac(step, 0.0)
            scale = lr_mul(frac)
            if h.num_loops > 0 and not model.looping_active and frac >= h.enable_looping_at:
                model.looping_active, loop_step = True, step
            losses.append(step_fn(step, scale).item())
            with torch.no_grad():
                for k, t in model.state_dict().items():
                    ema[k].mul_(h.ema_decay).add_(t.detach().float(), alpha=1.0 - h.ema_decay)
            print(
                f"step:{step + 1} train_loss:{losses[-1]:.6f} lr_mul:{scale:.4f} loop:{model.looping_active}"
            )
    as_np = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    init_out, final_out, ema_out = {}, {}, {}
    _store_params(init_out, "", init, h.num_layers)
    _store_params(final_out, "final/", as_np, h.num_layers)
    _store_params(ema_out, "ema/", {k: v.numpy() for k, v in ema.items()}, h.num_layers)
    meta = {
        "env": json.dumps(ENV),
        "record_only_env": json.dumps(RECORD_ONLY_ENV),
        "loops_on_at_step": str(loop_step),
        "unzeroed": json.dumps(zeros),
        "transcribed": "train_model: the step loop, the switch to looping, the moving average after each step",
        "substituted": "float32 model; float32 Newton-Schulz and Muon buffers; AdamW fused=False; eager MLP "
        "and cross-entropy; CUDA streams and pinned memory as no-ops",
    }
    out = Path(__file__).resolve().parent
    save_file(init_out, str(out / "trajectory_0427_init.safetensors"))
    tensors = {
        "train_tokens": tokens,
        "train_loss": np.array(losses, dtype=np.float64),
        **final_out,
        **ema_out,
    }
    save_file(tensors, str(out / "trajectory_0427.safetensors"), metadata=meta)
    print(
        f"wrote {out / 'trajectory_0427.safetensors'} and the init beside it (loops on at step {loop_step}; unzeroed: {', '.join(zeros)})"
    )


if __name__ == "__main__":
    main()
