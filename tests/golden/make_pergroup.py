"""Golden bytes of record 2026-04-27's per-group compressor (COMPRESSOR=pergroup), made by its own code.

The record's ``train_gpt.py`` is not part of pgolf and is never copied here: this script imports it
from the path in $RECORD_0427, through the loader and stubs of record_code.py (as
make_record_eval.py loads it; see make_record_0427.py for the git command that extracts it):

    RECORD_0427=/tmp/rec0427.py .venv/bin/python tests/golden/make_pergroup.py

Needs torch, brotli and the lrzip program. CPU, seconds. Not run by CI. It writes beside itself
``record_pergroup.safetensors``:

    sort/<case>          an int8 matrix: random (48 x 24, values in -31..31), few_values (40 x 12, values
                         in -1..1: many rows at equal distances, so the order of ties counts), repeated
                         (30 x 8, every row twice, shuffled)
    order/<case>         its ``_similarity_sort_l1`` (uint16)
    w/<name>             a small quantized model in the record's naming (``tok_emb.weight.q``, per layer
                         ``blocks.<i>.attn.c_q.weight.q`` ... ``mlp.proj.weight.q`` for 3 layers, their
                         fp16 ``.scale``, an int8 attention-gate ``.gq`` that no group takes, an fp16
                         passthrough): busy int6 values (N(0, 8) rounded, clipped)
    group/<kind>         what its ``_serialize_pergroup`` hands ``_lrzip_compress`` for each group
                         (rows sorted where it sorts them, transposed, layers in order), before lrzip
    lrzip/<kind>         what ``_lrzip_compress`` (``lrzip -z -L 9``) made of it on this machine
    perms                its row orders (uint16, the record's brotli stream decompressed)
    record.pergroup      the whole blob ``_serialize_pergroup`` wrote (uint8)

The metadata says the lrzip version and the record's group order.

And ``record_eval_0427_pergroup.ptz``: the quantized model in make_record_eval.py's
``record_eval_0427.ptz`` (its ``_decompress`` with brotli, ``torch.load``) written again by its
``_serialize_pergroup``, what COMPRESSOR=pergroup would have written; its ``_deserialize_pergroup``
reads back every tensor equal (checked here).
"""

from __future__ import annotations

import collections
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import brotli
import numpy as np
import torch
from safetensors.numpy import save_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_record_eval import ENV_0427, load_record_0427  # noqa: E402

SEED = 20261126
LAYERS = 3
SHAPES = {  # kind -> (rows, cols) of a tiny model: dim 16, kv dim 8, MLP 32
    "attn.c_q.weight": (16, 16), "attn.c_k.weight": (8, 16), "attn.c_v.weight": (8, 16),
    "attn.proj.weight": (16, 16), "mlp.fc.weight": (32, 16), "mlp.proj.weight": (16, 32),
}  # fmt: skip


def sort_cases(rng: np.random.Generator) -> dict[str, np.ndarray]:
    repeated = rng.integers(-31, 32, (15, 8))
    return {
        "random": rng.integers(-31, 32, (48, 24)).astype(np.int8),
        "few_values": rng.integers(-1, 2, (40, 12)).astype(np.int8),
        "repeated": np.concatenate([repeated, repeated])[rng.permutation(30)].astype(np.int8),
    }


def busy(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return np.clip(np.rint(rng.normal(0, 8, shape)), -31, 31).astype(np.int8)


def quantized_model(rng: np.random.Generator) -> dict[str, np.ndarray]:
    w = {"tok_emb.weight.q": busy(rng, (64, 16)), "tok_emb.weight.scale": rng.random(64).astype(np.float16)}
    for i in range(LAYERS):
        for kind, shape in SHAPES.items():
            w[f"blocks.{i}.{kind}.q"] = busy(rng, shape)
            w[f"blocks.{i}.{kind}.scale"] = rng.random(shape[0]).astype(np.float16)
    w["blocks.0.attn.attn_gate_w.gq"] = busy(rng, (4, 12))
    w["blocks.0.attn.attn_gate_w.gs"] = rng.random(4).astype(np.float16)
    w["blocks.0.attn_scale"] = rng.random(16).astype(np.float16)
    return w


def main() -> None:
    rec = load_record_0427()
    rng = np.random.default_rng(SEED)
    out: dict[str, np.ndarray] = {}
    for case, matrix in sort_cases(rng).items():
        out[f"sort/{case}"] = matrix
        out[f"order/{case}"] = np.asarray(rec._similarity_sort_l1(matrix), dtype=np.uint16)

    w = quantized_model(rng)
    out |= {f"w/{k}": v for k, v in w.items()}
    handed: dict[str, bytes] = collections.OrderedDict()
    made: dict[str, bytes] = {}
    lrzip = rec._lrzip_compress

    def capture(data, tmpdir, label):
        handed[label], made[label] = data, lrzip(data, tmpdir, label)
        return made[label]

    rec._lrzip_compress = capture
    with tempfile.TemporaryDirectory() as tmp:
        blob = rec._serialize_pergroup({k: torch.from_numpy(v) for k, v in w.items()}, {}, LAYERS, tmp)
    labels = {key.replace(".", "_"): key.lstrip("_").removesuffix(".q") for key in rec._GROUP_ORDER}
    for label, data in handed.items():
        out[f"group/{labels[label]}"] = np.frombuffer(data, dtype=np.uint8)
        out[f"lrzip/{labels[label]}"] = np.frombuffer(made[label], dtype=np.uint8)
    streams = rec._unpack_streams(blob)
    out["perms"] = np.frombuffer(brotli.decompress(streams[len(rec._GROUP_ORDER) + 1]), dtype=np.uint16)
    out["record.pergroup"] = np.frombuffer(blob, dtype=np.uint8)

    record_eval = HERE / "record_eval_0427.ptz"
    state = torch.load(io.BytesIO(rec._decompress(record_eval.read_bytes(), "brotli")), map_location="cpu")
    layers = int(ENV_0427["NUM_LAYERS"])
    with tempfile.TemporaryDirectory() as tmp:
        blob = rec._serialize_pergroup(state["w"], state["m"], layers, tmp)
        back, meta_back = rec._deserialize_pergroup(blob, layers, tmp)
    assert meta_back == state["m"] and back.keys() == state["w"].keys()
    assert all(torch.equal(back[k], v) for k, v in state["w"].items())
    (HERE / "record_eval_0427_pergroup.ptz").write_bytes(blob)

    version = subprocess.run(["lrzip", "-V"], capture_output=True, text=True).stdout.strip()
    meta = {"lrzip": version, "group_order": list(rec._GROUP_ORDER), "seed": SEED, "layers": LAYERS}
    save_file(out, str(HERE / "record_pergroup.safetensors"), metadata={"golden": json.dumps(meta)})
    print(
        {k: v.shape for k, v in out.items() if not k.startswith("w/")}, version, len(blob), "B pergroup ptz"
    )


if __name__ == "__main__":
    main()
