"""Regenerate the quantization and sliding-evaluation goldens from a challenge record's own code.

    RECORD_0401=/path/to/records/track_10min_16mb/2026-04-01_Vocab4096_MLPMult4_WD085/train_gpt.py \\
    RECORD_0405=/path/to/records/track_10min_16mb/2026-04-05_SP8192_GPTQ-Embeddings_SDClip_Loop45x2/train_gpt_human.py \\
    python tests/golden/make_quant_goldens.py

(RECORD_0405 is optional: without it the SDClip+GPTQ golden is left out.) Needs torch,
brotli and the challenge tokenizer (tests/fixtures/challenge/fineweb_1024_bpe.model,
or TOKENIZER=...). Runs on CPU in fp32, in seconds. Not run by CI: the tests read what
it writes:
- quant_goldens.safetensors: fixed weights, a fixed Hessian, a fixed byte string, a tiny
  record model's weights (its state-dict names, prefixed "model/") and validation tokens,
  and what the record's functions make of them; metadata "golden" (JSON) holds the
  settings, the record's sliding-window val_loss / val_bpb and the sha256 of each tensor
  its dequantizer returns from record_int6.ptz;
- record_int6.ptz: an artifact written by the record's own quantize/serialize path.
The record's module is imported with `flash_attn_interface` stubbed by an SDPA
equivalent and torch.compile made a no-op (neither matters for the numbers on CPU).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import types
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
import torch.nn.functional as F
from record_code import module_from_file, stub_flash_attn
from safetensors.numpy import save_file

HERE = Path(__file__).resolve().parent
TOKENIZER = Path(os.environ.get("TOKENIZER", HERE.parent / "fixtures/challenge/fineweb_1024_bpe.model"))

# Our own text for the evaluation tokens (two documents; "é" and "ü" are not in the
# sp1024 tokenizer and become <unk>, which counts 0 bytes).
DOCS = [
    "The river keeps its own calendar. In March the ice breaks into plates that grind past the mill, "
    "and by June the water is low enough to show the old stones of the ford. Children count the "
    "herons; there were 14 of them last year, and 9 the year before.",
    "A café on the corner sells bread until noon. Its owner, Jürgen, bakes 120 loaves a day and "
    "writes the price of each one on a slate by the door: rye 3.50, wheat 2.80, seeded 4.10.",
]


def flash_attn_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """flash_attn_func's contract, (B, T, H, D) in and out, with grouped KV heads, by SDPA."""
    heads, kv_heads = q.size(2), k.size(2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if kv_heads != heads:  # query head h reads KV head h // (heads // kv_heads)
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal).transpose(1, 2)


def import_record(path: str, name: str) -> types.ModuleType:
    stub_flash_attn(flash_attn_func=flash_attn_sdpa)
    return module_from_file(path, name)


def fixed_weight(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    w = rng.normal(0, 0.05, (rows, cols)) * rng.uniform(0.3, 2.0, (rows, 1))
    w[rng.integers(0, rows, 6), rng.integers(0, cols, 6)] *= 12  # outliers the clip search sees
    w[3] = 0.0  # a zero row: scale 1/R
    w[5] = np.round(w[5] * 40) / 40  # ties
    return w.astype(np.float32)


def hessian_with_dead_inputs(rng: np.random.Generator, cols: int, samples: int) -> np.ndarray:
    x = rng.normal(0, 1, (samples, cols)) @ rng.normal(0, 0.3, (cols, cols)) + rng.normal(
        0, 1, (samples, cols)
    )
    x[:, [7, 40]] = 0.0  # inputs that never fire: diag(H) = 0
    h = (x.T @ x).astype(np.float32)
    live = np.diagonal(h)[np.diagonal(h) > 0]
    assert len(np.unique(live)) == len(live), "ties in diag(H): the record's act order is machine-dependent"
    return h


def as_np(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().numpy() if t.dtype == torch.bfloat16 else t.detach().numpy()


def quant_goldens(rec: types.ModuleType, rec5: types.ModuleType | None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(20260401)
    w = fixed_weight(rng, 48, 96)
    v = (rng.normal(0, 0.1, 500)).astype(np.float32)
    h = hessian_with_dead_inputs(rng, 96, 256)
    out = {"rows/w": w, "rows/v": v, "gptq/h": h}
    tw, th = torch.from_numpy(w), torch.from_numpy(h)
    for r in (31, 15, 63, 127):
        q, s = rec.quantize_int6_per_row(tw, clip_range=r)
        out[f"rows/q{r}"], out[f"rows/s{r}"] = q.numpy(), s.numpy()
    q, s = rec.quantize_int6_per_row(torch.from_numpy(v), clip_range=31)
    out["rows/v_q31"], out["rows/v_s31"] = q.numpy(), s.numpy()
    for r, block in ((31, 128), (31, 32), (15, 32)):
        q, s = rec.gptq_quantize_weight(tw, th, clip_range=r, block_size=block)
        out[f"gptq/q{r}_b{block}"], out[f"gptq/s{r}_b{block}"] = q.numpy(), s.numpy()
    if rec5 is not None:  # 2026-04-05: GPTQ with SDClip scales
        q, s = rec5.gptq_quantize_weight(tw, th, clip_sigmas=12.85, clip_range=63, block_size=32)
        out["sdclip/q63_b32"], out["sdclip/s63_b32"] = q.numpy(), s.numpy()
    data = bytes((i * 37 + (i * i) % 11) % 256 for i in range(1001))
    out["shuffle/data"] = np.frombuffer(data, np.uint8).copy()
    for stride in (2, 3, 4):
        out[f"shuffle/s{stride}"] = np.frombuffer(rec._byte_shuffle(data, stride), np.uint8).copy()
    return out


# ------------------------------------------------------------ the tiny record model
TINY = dict(
    vocab_size=1024, num_layers=3, model_dim=32, embedding_dim=32, num_heads=2, num_kv_heads=1,
    mlp_mult=4.0, rope_dims=8, xsa_last_n=3, ve_enabled=True, ve_dim=8, ve_layers="2",
    skip_gates_enabled=True, ln_scale=True, qk_gain_init=4.0, tie_embeddings=True,
    logit_softcap=30.0, rope_base=10000.0, train_seq_len=64, rope_train_seq_len=64,
    eval_seq_len=64, eval_stride=16, rank=0, world_size=1,
)  # fmt: skip
BATCH_SEQS = 3  # 8 windows: the last batch is short
EVAL_TOKENS = 171  # 170 targets: the last window is short (58 tokens, 10 scored)
CONTROL_INIT = {"q_gain": 4.0, "attn_scale": 1.0, "mlp_scale": 1.0, "skip_weights": 1.0, "scale": 0.1}


def tiny_hparams(rec: types.ModuleType) -> object:
    h = rec.Hyperparameters()
    for key, value in TINY.items():
        setattr(h, key, value)
    h.logfile, h.is_main_process = None, True
    return h


def fixed_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """Weights from our own seeded generator, in the record's state-dict names."""
    rng = np.random.default_rng(7)
    state = {}
    for name, p in model.state_dict().items():
        shape = tuple(p.shape)
        last = name.split(".")[-1]
        if name == "tok_emb.weight":
            a = rng.normal(0, 0.3, shape)
        elif name.endswith("resid_mix"):
            a = np.stack([np.ones(shape[1]), np.zeros(shape[1])]) + rng.normal(0, 0.2, shape)
        elif name == "skip_gates":
            a = rng.normal(0, 0.5, shape)
        elif name.startswith("ve_layer_scales"):
            a = 1.0 + rng.normal(0, 0.1, shape)
        elif last in CONTROL_INIT:
            a = CONTROL_INIT[last] + rng.normal(0, 0.1, shape)
        elif len(shape) == 2:
            a = rng.normal(0, 1.0 / np.sqrt(shape[1]), shape)
        else:
            raise SystemExit(f"no rule for the record parameter {name} {shape}")
        state[name] = np.asarray(a, dtype=np.float32)
    return state


def eval_goldens(rec: types.ModuleType) -> tuple[dict[str, np.ndarray], dict]:
    torch.manual_seed(0)
    torch.compile = lambda fn=None, **kw: fn  # a no-op: on CPU it would only need a compiler
    h = tiny_hparams(rec)
    rec.set_logging_hparams(h)
    model = rec.GPT(h).float()
    state = fixed_state(model)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    sp = spm.SentencePieceProcessor(model_file=str(TOKENIZER))
    ids: list[int] = []
    for doc in DOCS:
        ids += [sp.bos_id(), *sp.encode(doc)]
    assert len(ids) >= EVAL_TOKENS
    tokens = torch.tensor(ids[:EVAL_TOKENS], dtype=torch.int64)
    luts = rec.build_sentencepiece_luts(sp, h.vocab_size, torch.device("cpu"))
    val = types.SimpleNamespace(
        val_tokens=tokens,
        base_bytes_lut=luts[0],
        has_leading_space_lut=luts[1],
        is_boundary_token_lut=luts[2],
    )
    val_loss, val_bpb = rec.eval_val_sliding(h, torch.device("cpu"), val, model, batch_seqs=BATCH_SEQS)
    # Per-window NLL from the same model, batched as the record batches, for the scorer's test.
    total, seq, stride = tokens.numel() - 1, h.eval_seq_len, h.eval_stride
    starts = [ws for ws in range(0, total, stride) if ws + seq - stride < total]
    rows, xs = [], []
    with torch.inference_mode():
        for i in range(0, len(starts), BATCH_SEQS):
            batch = starts[i : i + BATCH_SEQS]
            x = torch.zeros(len(batch), seq, dtype=torch.int64)
            y = torch.zeros(len(batch), seq, dtype=torch.int64)
            for j, ws in enumerate(batch):
                end = min(ws + seq, total)
                x[j, : end - ws], y[j, : end - ws] = tokens[ws:end], tokens[ws + 1 : end + 1]
            logits = model.forward_logits(x)
            nll = F.cross_entropy(
                logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1), reduction="none"
            )
            rows.append(nll.reshape(len(batch), seq).numpy())
            xs.append(x.numpy())
    tensors = {f"model/{k}": v for k, v in state.items()}
    tensors |= {
        "eval/tokens": tokens.numpy(),
        "eval/window_nll": np.concatenate(rows),
        "eval/window_x": np.concatenate(xs),
    }
    meta = {
        "model": {k: v for k, v in TINY.items() if k not in ("rank", "world_size")},
        "eval": {
            "seq_len": seq,
            "stride": stride,
            "batch_seqs": BATCH_SEQS,
            "val_loss": val_loss,
            "val_bpb": val_bpb,
        },
        "note": "record GPT built in fp32 on CPU; tok_emb kept fp32 (the record's eval model has it in bf16)",
    }
    return tensors, meta


# ------------------------------------------------------- the record's own artifact
def record_artifact(rec: types.ModuleType) -> tuple[bytes, dict[str, str]]:
    """A state dict covering every entry kind, quantized and written as the record's serialize() does."""
    rng = np.random.default_rng(11)

    def low_entropy(shape: tuple[int, ...], scale: float) -> torch.Tensor:
        return torch.from_numpy((rng.integers(-3, 4, shape) * scale).astype(np.float32))

    sd = {
        "tok_emb.weight": torch.from_numpy(fixed_weight(rng, 260, 256)),  # embed: int8, per row
        "blocks.0.attn.c_q.weight": torch.from_numpy(fixed_weight(rng, 272, 256)),  # int6 by GPTQ
        "blocks.0.mlp.fc.weight": torch.from_numpy(fixed_weight(rng, 264, 256)),  # int6 by clip search
        "blocks.0.mlp.gain_vector": low_entropy((70_000,), 0.01),  # int6, one fp16 scale
        "extra.cube": low_entropy((20, 60, 60), 0.02),  # other: int8, one fp32 scale
        "skip_weights": torch.ones(2, 33_000),  # large control: fp32
        "blocks.0.attn_scale": torch.from_numpy(rng.normal(1, 0.1, 32).astype(np.float32)),  # small: fp16
        "blocks.0.attn.q_gain": torch.full((2,), 4.0),
        "step": torch.tensor([17], dtype=torch.int64),
    }
    x = rng.normal(0, 1, (512, 256)).astype(np.float32)
    hessians = {"blocks.0.attn.c_q.weight": torch.from_numpy(x.T @ x)}
    result, meta = rec.gptq_mixed_quantize_int6(sd, {"mlp", "attn"}, hessians)
    buf = io.BytesIO()
    torch.save({"w": result, "m": meta}, buf)
    blob = rec._compress(buf.getvalue(), "brotli")
    # The record's reader, with the dtypes its eval model has (tok_emb in bf16).
    template = {k: (v.bfloat16() if k == "tok_emb.weight" else v) for k, v in sd.items()}
    state = torch.load(io.BytesIO(rec._decompress(blob, "brotli")), map_location="cpu")
    deq = rec.dequantize_mixed_int6(state["w"], state["m"], template)
    digests = {
        k: hashlib.sha256(np.ascontiguousarray(as_np(t)).tobytes()).hexdigest() for k, t in deq.items()
    }
    return blob, digests


def main() -> None:
    path = os.environ.get("RECORD_0401")
    if not path:
        raise SystemExit("set RECORD_0401 to the 2026-04-01 record's train_gpt.py")
    rec = import_record(path, "record_0401")
    rec5 = import_record(os.environ["RECORD_0405"], "record_0405") if os.environ.get("RECORD_0405") else None
    tensors = quant_goldens(rec, rec5)
    eval_tensors, meta = eval_goldens(rec)
    blob, digests = record_artifact(rec)
    meta["record_int6_sha256"] = digests
    meta["record_int6_dtypes"] = {"tok_emb.weight": "bfloat16"}
    meta["sources"] = {
        "RECORD_0401": Path(path).parent.name,
        "RECORD_0405": bool(rec5),
        "torch": torch.__version__,
    }
    save_file(
        tensors | eval_tensors, HERE / "quant_goldens.safetensors", metadata={"golden": json.dumps(meta)}
    )
    (HERE / "record_int6.ptz").write_bytes(blob)
    for f in ("quant_goldens.safetensors", "record_int6.ptz"):
        print(f, (HERE / f).stat().st_size, "bytes")


if __name__ == "__main__":
    main()
