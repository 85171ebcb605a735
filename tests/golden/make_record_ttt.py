"""Golden numbers for test-time training, computed by record 2026-04-27's own phased LoRA TTT.

The record's ``train_gpt.py`` is not part of pgolf and is never copied here: this script imports it
from the path in $RECORD_0427 through the loader and stubs of record_code.py (FlashAttention
as PyTorch SDPA, CPU, float32; see make_record_0427.py for the git command that extracts it):

    RECORD_0427=/tmp/rec0427.py .venv/bin/python tests/golden/make_record_ttt.py

It writes ``tests/golden/record_ttt.safetensors`` next to itself. The model is make_record_0427.py's
SmearGate model (6 layers, dim 64, vocab 96, depth recurrence, parallel lanes; its busy weights from
default_rng(SEED)). The validation stream holds 8 documents of 4 to 61 tokens, each starting with
BOS = 1 (the last one runs to the end). The record's ``eval_val_ttt_phased`` scores it with
``forward_ttt``, one process, for each case below; the LoRA adapters' A, which the record draws from
torch's generator (as it makes them, and at each reset without TTT_WARM_START_A), are drawn instead
from numpy's default_rng(CASE_SEED) as float32 uniform in
+-1/sqrt(in), adapter by adapter in the order the record makes them (head, q, v, k, mlp, o; one per
block visit), each time the record makes a set: pgolf draws the same numbers in the same order.
The byte tables are made up (base bytes 1 + id % 3, a leading space on even ids, ids 0 and 1
boundaries) and stored.

Keys: param/<pgolf name> (the record's banks split, as in make_record_0427.py), tokens,
base_bytes, has_leading_space, is_boundary; per case <case>/val_loss, <case>/val_bpb (float64).
The metadata holds each case's environment and CASE_SEED.

The full mode (chunks of the stream scored with sliding windows, then every weight trained on them)
comes from record 2026-04-06_SP8192_QK5_LegalTTT_1.0828's ``eval_val_sliding_ttt`` on its own model
(6 layers, dim 64, vocab 96, loops over layers 1..2, skip gates; busy weights from
default_rng(SEED + 1)), with $RECORD_0406 the record's script (extracted as make_record_0427.py
says, from that folder). Keys full/param/<name>, and full/<case>/val_loss, full/<case>/val_bpb for
the cases of FULL_CASES (the second freezes the first two blocks).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_record_0427 as r0427
import make_record_features as base
import record_code

CASE_SEED = 1234
DOC_LENGTHS = (12, 61, 4, 30, 45, 9, 23, 37)  # tokens after each BOS
TTT_ENV = {
    "TTT_ENABLED": "1", "TTT_LORA_RANK": "4", "TTT_LORA_ALPHA": "8", "TTT_LORA_LR": "0.01",
    "TTT_CHUNK_SIZE": "8", "TTT_EVAL_SEQ_LEN": "24", "TTT_BATCH_SIZE": "3", "TTT_GRAD_STEPS": "2",
    "TTT_BETA1": "0.9", "TTT_BETA2": "0.99", "TTT_WEIGHT_DECAY": "0.5", "TTT_WARM_START_A": "1",
}  # fmt: skip
CASES = {
    # LoRA alone: no global phase
    "lora": {**TTT_ENV, "PHASED_TTT_PREFIX_DOCS": "0"},
    # A fresh A for every batch, SGD on the adapters
    "sgd_cold": {**TTT_ENV, "PHASED_TTT_PREFIX_DOCS": "0", "TTT_WARM_START_A": "0", "TTT_OPTIMIZER": "sgd"},
    # Two global phases over the first 5 documents (sequences of EVAL_SEQ_LEN, no document masking)
    "phased": {
        **TTT_ENV, "PHASED_TTT_PREFIX_DOCS": "5", "PHASED_TTT_NUM_PHASES": "2", "GLOBAL_TTT_LR": "0.01",
        "GLOBAL_TTT_MOMENTUM": "0.9", "GLOBAL_TTT_CHUNK_TOKENS": "40", "GLOBAL_TTT_BATCH_SEQS": "1",
        "GLOBAL_TTT_WARMUP_CHUNKS": "2", "GLOBAL_TTT_WARMUP_START_LR": "0.001", "GLOBAL_TTT_GRAD_CLIP": "0.5",
        "GLOBAL_TTT_RESPECT_DOC_BOUNDARIES": "0",
    },
}  # fmt: skip


record_code.RECORDS["0406"] = (
    "2026-04-06_SP8192_QK5_LegalTTT_1.0828",
    "e2343918af3af1dc11dc6aa16d7285e7c8ca3ccb",
)
ENV_0406 = {
    **{k: v for k, v in base.MODEL_ENV.items() if k != "PARALLEL_START_LAYER"},
    "NUM_LOOPS": "2", "LOOP_START": "1", "LOOP_END": "2", "SKIP_GATES_ENABLED": "1", "EVAL_STRIDE": "8",
    "TTT_ENABLED": "1", "TTT_LR": "0.02", "TTT_EPOCHS": "2", "TTT_CHUNK_TOKENS": "96", "TTT_MOMENTUM": "0.9",
    "TTT_BATCH_SEQS": "2", "TTT_GRAD_CLIP": "0.5",
}  # fmt: skip
FULL_CASES = {"full": ENV_0406, "frozen": {**ENV_0406, "TTT_FREEZE_BLOCKS": "2"}}


def python311(unwrap):
    """The record's source as Python 3.11 reads it: two log lines nest their f-string's own quotes (3.12)."""

    def patched(text: str, path: str) -> str:
        source = unwrap(text, path)
        for inner in ('", "', '"fineweb_train_*.bin"'):
            source = source.replace(inner, inner.replace('"', "'"))
        return source

    return patched


def full_mode(out: dict, meta: dict, tokens: np.ndarray, tables: dict) -> None:
    """The record's eval_val_sliding_ttt, each case on the same busy weights."""
    record_code.unwrap = python311(record_code.unwrap)
    for name, env in FULL_CASES.items():
        rec = record_code.load_record("0406", env)
        h, model = base._model(rec)
        params = base.fill_busy(rec, model, np.random.default_rng(r0427.SEED + 1))
        model.looping_active = True
        val_data = SimpleNamespace(
            val_tokens=torch.from_numpy(tokens.astype(np.int64)),
            base_bytes_lut=torch.from_numpy(tables["base_bytes"]),
            has_leading_space_lut=torch.from_numpy(tables["has_leading_space"]),
            is_boundary_token_lut=torch.from_numpy(tables["is_boundary"]),
        )
        compile_, torch.compile = torch.compile, lambda fn=None, **kw: fn
        try:
            loss, bpb = rec.eval_val_sliding_ttt(
                h, model, 0, 1, torch.device("cpu"), val_data, stride=h.eval_stride
            )
        finally:
            torch.compile = compile_
        out[f"full/{name}/val_loss"] = np.array(loss, dtype=np.float64)
        out[f"full/{name}/val_bpb"] = np.array(bpb, dtype=np.float64)
        meta["full_cases"][name] = env
        print(f"full/{name}: val_loss {loss:.8f} val_bpb {bpb:.8f}")
    for k, v in params.items():
        out[f"full/param/{k}"] = v


def draw_a_from(rng: np.random.Generator, lora_class) -> None:
    """The record's adapters take their A from `rng` (float32 uniform in +-1/sqrt(in)) where it draws
    them from torch's generator: as they are made, and at each reset without TTT_WARM_START_A."""
    original = lora_class.__init__

    def draw(self) -> None:
        bsz, rank, in_features = self.A.shape
        bound = 1.0 / np.sqrt(in_features)
        a = rng.uniform(-bound, bound, size=(bsz, rank, in_features)).astype(np.float32)
        with torch.no_grad():
            self.A.copy_(torch.from_numpy(a))

    def init(self, bsz, in_features, out_features, rank):
        original(self, bsz, in_features, out_features, rank)
        draw(self)

    def reset(self):
        if not self._WARM_START_A:
            draw(self)
        with torch.no_grad():
            self.B.zero_()

    lora_class.__init__ = init
    lora_class.reset = reset


def main(out_path: Path) -> None:
    torch.set_num_threads(1)
    record_code.install_stubs()
    rng = np.random.default_rng(r0427.SEED)
    tokens = np.concatenate([np.concatenate([[r0427.BOS], rng.integers(2, 96, size=n)]) for n in DOC_LENGTHS])
    vocab = np.arange(96)
    tables = {
        "base_bytes": (1 + vocab % 3).astype(np.int16),
        "has_leading_space": vocab % 2 == 0,
        "is_boundary": vocab < 2,
    }
    out = {"tokens": tokens.astype(np.int32), **tables}
    meta = {"case_seed": CASE_SEED, "doc_lengths": DOC_LENGTHS, "cases": {}, "full_cases": {}}
    for name, ttt_env in CASES.items():
        env = {**r0427.ENV_0427, **ttt_env}
        rec = record_code.load_record("0427", env)
        rec.BOS_ID = r0427.BOS
        h, model = base._model(rec)
        params = base.fill_busy(rec, model, np.random.default_rng(r0427.SEED))
        for block in model.blocks:
            block.mlp.use_fused = False
        model.looping_active = True
        h.run_id = f"golden_ttt_{name}"
        val_data = SimpleNamespace(
            val_tokens=torch.from_numpy(tokens.astype(np.int64)),
            base_bytes_lut=torch.from_numpy(tables["base_bytes"]),
            has_leading_space_lut=torch.from_numpy(tables["has_leading_space"]),
            is_boundary_token_lut=torch.from_numpy(tables["is_boundary"]),
            caseops_enabled=False,
            val_bytes=None,
        )
        draw_a_from(np.random.default_rng(CASE_SEED), rec.BatchedLinearLoRA)
        loss, bpb = rec.eval_val_ttt_phased(h, model, torch.device("cpu"), val_data, model.forward_ttt)
        out[f"{name}/val_loss"] = np.array(loss, dtype=np.float64)
        out[f"{name}/val_bpb"] = np.array(bpb, dtype=np.float64)
        meta["cases"][name] = env
        print(f"{name}: val_loss {loss:.8f} val_bpb {bpb:.8f}")
    r0427._store_params(out, "param/", params, h.num_layers)
    full_mode(out, meta, tokens, tables)
    base.save_file(out, str(out_path), metadata={"ttt": json.dumps(meta)})
    print(f"wrote {out_path}: {len(out)} tensors")


if __name__ == "__main__":
    main(Path(__file__).resolve().parent / "record_ttt.safetensors")
