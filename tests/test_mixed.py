"""Mixed-precision artifacts: classes, bits, the pickle-free container, the budget table, the records' .ptz."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import zlib

import numpy as np
import pytest
from safetensors.numpy import load as st_load

from core.artifact import container, int8_format, upstream
from core.artifact import quantized as quant
from core.artifact.budget import budget_table
from core.artifact.load import load_mixed_artifact
from core.artifact.mixed import dequantize_mixed, mixed_artifact_bytes, quantize_mixed
from core.artifact.records import load_record_artifact
from core.artifact.rowquant import Clip, dequantize_rows, quantize_rows
from core.common import compress
from core.common.errors import PgolfError
from tests.golden_data import RECORD_PTZ, goldens
from tests.support.artifacts import RunsCode, model_state, ramp
from tests.support.backends import requires_torch, run_blocked
from tests.support.cli import IMPORTABLE

try:
    import torch
except ImportError:
    torch = None


def test_each_tensor_is_stored_by_its_class(mixed_model):
    info = mixed_model.info
    assert {n: i["store"] for n, i in info.items()} == {
        "tok_emb.weight": "int", "blocks.0.attn.c_q.weight": "int", "blocks.0.mlp.fc.weight": "int",
        "blocks.0.mlp.proj.weight": "int", "extra.vector": "int", "blocks.0.attn_scale": "fp32",
        "skip_weights": "fp32", "blocks.0.attn.q_gain": "fp32", "extra.small": "fp16", "step": "raw",
    }  # fmt: skip
    assert info["tok_emb.weight"] == {
        "class": "embedding", "dtype": "bfloat16", "store": "int", "bits": 8, "method": "rows",
        "clip": {"kind": "percentile", "q": 0.9999},
    }  # fmt: skip
    assert (info["blocks.0.attn.c_q.weight"]["method"], info["blocks.0.attn.c_q.weight"]["bits"]) == (
        "gptq",
        6,
    )
    assert info["blocks.0.mlp.fc.weight"]["clip"] == {"kind": "sdclip", "k": 4.0}
    assert (
        info["extra.vector"]["clip"] == {"kind": "percentile", "q": 1.0}
        and mixed_model.scales["extra.vector"].ndim == 0
    )
    for name, bits in (("tok_emb.weight", 8), ("blocks.0.attn.c_q.weight", 6), ("blocks.0.mlp.fc.weight", 5)):
        q, s = mixed_model.quantized[name], mixed_model.scales[name]
        assert q.dtype == np.int8 and s.dtype == np.float16 and s.shape == (q.shape[0],)
        assert 0 < int(np.abs(q).max()) <= 2 ** (bits - 1) - 1
    assert mixed_model.passthrough["skip_weights"].dtype == np.float32
    assert mixed_model.passthrough["extra.small"].dtype == np.float16


def test_values_are_the_row_quantizers(mixed_model):
    state, _, _ = model_state()
    emb = quant.round_to_bfloat16(state["tok_emb.weight"])  # bf16 weights are rounded first
    q, s = quantize_rows(emb, 8, Clip.percentile(0.9999))
    assert np.array_equal(mixed_model.quantized["tok_emb.weight"], q)
    assert np.array_equal(mixed_model.scales["tok_emb.weight"], s)
    deq = dequantize_mixed(mixed_model)
    assert np.array_equal(deq["tok_emb.weight"], quant.round_to_bfloat16(dequantize_rows(q, s)))
    assert np.array_equal(deq["skip_weights"], state["skip_weights"])
    assert np.array_equal(deq["extra.small"], state["extra.small"].astype(np.float16).astype(np.float32))
    assert deq["step"].dtype == np.int64 and set(deq) == set(state)
    for name in ("blocks.0.mlp.proj.weight", "extra.vector"):
        err = np.abs(deq[name] - state[name]).max()
        assert 0 < err < 0.1 * np.abs(state[name]).max()


def test_fp16_classes_and_defaults():
    state, classes, _ = model_state()
    model = quantize_mixed(state, classes, bits={"mlp": "fp16"})
    assert model.info["blocks.0.mlp.fc.weight"]["store"] == "fp16"
    assert model.info["tok_emb.weight"]["bits"] == 8 and model.info["blocks.0.attn.c_q.weight"]["bits"] == 6
    assert model.info["blocks.0.attn.c_q.weight"]["clip"] == Clip().to_json()  # the records' search


def _request(case: str) -> dict:
    state, classes, _ = model_state()
    if case == "missing class":
        classes = {k: v for k, v in classes.items() if k != "blocks.0.attn.c_q.weight"}
    elif case == "unknown class":
        classes = classes | {"step": "bias"}
    elif case in ("too large", "float64"):
        state = {"w": np.full((300, 300), 1e7, np.float32) if case == "too large" else np.zeros(4)}
        classes = {"w": "mlp"}
    bits = {"control bits": {"control": 8}, "4 bits": {"mlp": 4}, "unknown bits class": {"head": 6}}.get(case)
    hessians = {"nope.weight": np.eye(2, dtype=np.float32)} if case == "stray hessian" else None
    return dict(state=state, classes=classes, bits=bits, hessians=hessians)


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("missing class", "no class given for blocks.0.attn.c_q.weight"),
        ("unknown class", "step has unknown class 'bias'"),
        ("control bits", "control tensors always stay in fp32"),
        ("4 bits", "bits for mlp: 4"),
        ("unknown bits class", "bits for head: 6"),
        ("stray hessian", "Hessians given for tensors not in the model: nope.weight"),
        ("too large", "w is too large for the format's float16"),
        ("float64", "w has dtype float64"),
    ],
)
def test_bad_requests_are_refused(case, match):
    with pytest.raises(PgolfError, match=match):
        quantize_mixed(**_request(case))


# ------------------------------------------------------------------ container
@pytest.mark.slow
@pytest.mark.parametrize(
    ("compressor", "shuffle"), [("brotli", 2), ("zstd", 0), ("zstd", 2), ("lzma", 2), ("none", 0)]
)
def test_round_trip(tmp_path, mixed_model, compressor, shuffle):
    info = container.write_artifact(
        tmp_path / "m.pgolf", mixed_artifact_bytes(mixed_model, compressor, shuffle=shuffle), compressor
    )
    blob = info.path.read_bytes()
    assert blob.startswith(container.MAGIC) and blob[len(container.MAGIC)] == compress.COMPRESSORS[
        compressor
    ].id | (0x80 if shuffle else 0)
    back = load_mixed_artifact(info.path)
    assert back.info == mixed_model.info
    a, b = dequantize_mixed(mixed_model), dequantize_mixed(back)
    assert all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)
    assert mixed_artifact_bytes(back, compressor, shuffle=shuffle) == blob


def test_metadata_is_canonical_json(mixed_model):
    blob = mixed_artifact_bytes(mixed_model, "none", shuffle=0)
    payload = blob[len(container.MAGIC) + 1 : -container.DIGEST_BYTES]
    header = json.loads(payload[8 : 8 + int.from_bytes(payload[:8], "little")])
    text = header["__metadata__"]["pgolf"]
    meta = json.loads(text)
    assert text == json.dumps(meta, sort_keys=True, separators=(",", ":"))
    assert {k: meta[k] for k in ("format", "version", "compressor", "level", "shuffle")} == {
        "format": "pgolf-mixed", "version": 1, "compressor": "none", "level": None, "shuffle": 0,
    }  # fmt: skip
    assert meta["tensors"]["blocks.0.mlp.fc.weight"]["bits"] == 5
    inner = st_load(payload)
    assert inner["q/blocks.0.mlp.fc.weight"].dtype == np.int8 and inner["p/step"].dtype == np.int64
    assert json.loads(json.dumps(meta))["tensors"] == mixed_model.info


# Recorded from this code; a change means the mixed format changed (bump MIXED_VERSION).
GOLDEN_MIXED_SHA256 = (
    "7796e704d4fd47372b28c12ef75f0f90e14781773584ba15742d7f0db6c8fe27"  # with the checksum (v1: 2fa9aabc...)
)


@pytest.mark.slow  # ~2 s
def test_golden_bytes_and_any_order_and_other_processes(mixed_model):
    state, classes, dtypes = model_state()
    args = dict(bits={"embedding": 8, "attention": 6, "mlp": 5, "other": 7})
    blob = mixed_artifact_bytes(quantize_mixed(state, classes, orig_dtypes=dtypes, **args), "none", shuffle=0)
    assert hashlib.sha256(blob).hexdigest() == GOLDEN_MIXED_SHA256
    reordered = dict(reversed(list(state.items())))
    again = mixed_artifact_bytes(
        quantize_mixed(reordered, classes, orig_dtypes=dtypes, **args), "none", shuffle=0
    )
    assert again == blob
    brotli_blob = mixed_artifact_bytes(mixed_model)
    code = (
        "import hashlib, numpy as np\n"
        "from core.artifact import mixed\n"
        "from core.artifact.rowquant import Clip\n"
        "from tests.support.artifacts import model_state, ramp\n"
        "from tests.support.artifacts import hessian\n"
        "state, classes, dtypes = model_state()\n"
        "m = mixed.quantize_mixed(state, classes, bits={'embedding': 8, 'attention': 6, 'mlp': 5, 'other': 7},\n"
        "    clip={'embedding': Clip.percentile(0.9999), 'mlp': Clip.sdclip(4.0)},\n"
        "    hessians={'blocks.0.attn.c_q.weight': hessian(ramp((300, 256), 1.0, 65_537))}, orig_dtypes=dtypes)\n"
        "print(hashlib.sha256(mixed.mixed_artifact_bytes(m)).hexdigest())"
    )
    env = {"PYTHONHASHSEED": "12345", "PATH": os.environ.get("PATH", ""), **IMPORTABLE}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == hashlib.sha256(brotli_blob).hexdigest()


@pytest.mark.slow
def test_read_with_numpy_alone_and_no_pickle(tmp_path, mixed_model, monkeypatch):
    path = container.write_artifact(tmp_path / "m.pgolf", mixed_artifact_bytes(mixed_model), "brotli").path
    code = (
        "import numpy as np\n"
        "from core.artifact import mixed\n"
        "from core.artifact.load import load_mixed_artifact\n"
        f"m = load_mixed_artifact({str(path)!r})\n"
        "w = mixed.dequantize_mixed(m)\n"
        "print(len(w), float(np.abs(w['blocks.0.mlp.fc.weight']).max()))"
    )
    result = run_blocked(code)
    assert result.returncode == 0, result.stderr
    expected = dequantize_mixed(mixed_model)
    assert result.stdout.split() == [
        str(len(expected)),
        str(float(np.abs(expected["blocks.0.mlp.fc.weight"]).max())),
    ]

    def refuse(*args, **kwargs):
        raise AssertionError("unpickling")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    assert load_mixed_artifact(path).info == mixed_model.info


@pytest.mark.slow
def test_the_int8_reader_names_a_mixed_file(tmp_path, mixed_model):
    path = container.write_artifact(tmp_path / "m.pgolf", mixed_artifact_bytes(mixed_model), "brotli").path
    with pytest.raises(PgolfError, match="format 'pgolf-mixed', not the int8 format"):
        upstream.load_artifact(path)
    int8 = container.write_artifact(
        tmp_path / "i.pgolf",
        int8_format.artifact_bytes(int8_format.quantize_int8({"w": ramp((300, 300), 1, 7)})),
        "zlib",
    ).path
    with pytest.raises(PgolfError, match="format 'pgolf-int8', not the mixed-precision format"):
        load_mixed_artifact(int8)


# ------------------------------------------------------------ the budget table
def test_budget_table(mixed_model):
    state, _, _ = model_state()
    rows = budget_table(mixed_model, "zlib", shuffle=2, weights=state)
    by_class = {r["class"]: r for r in rows}
    assert list(by_class) == ["embedding", "attention", "mlp", "other", "control", "total"]
    assert by_class["mlp"]["params"] == 2 * 264 * 256 and by_class["mlp"]["bits"] == "int5"
    assert by_class["other"]["bits"] == "fp16+int7+raw" and by_class["control"]["bits"] == "fp32"
    assert by_class["embedding"]["bytes_raw"] == 300 * 256 + 300 * 2  # int8 values + fp16 scales
    assert by_class["total"]["params"] == sum(v.size for v in state.values())
    assert by_class["total"]["bytes_raw"] == sum(r["bytes_raw"] for r in rows[:-1])
    assert by_class["total"]["bytes_compressed"] == len(mixed_artifact_bytes(mixed_model, "zlib", shuffle=2))
    for r in rows:
        assert r["share"] == r["bytes_compressed"] / 16_000_000
        assert 0 < r["bytes_compressed"] < r["bytes_raw"] or r["class"] == "total"
    w = state["tok_emb.weight"].astype(np.float64)
    assert by_class["embedding"]["rms"] == pytest.approx(np.sqrt(np.mean(w**2)), rel=1e-12)
    assert by_class["mlp"]["bytes_compressed"] < 0.8 * by_class["mlp"]["bytes_raw"]  # 5 of 8 bits used
    assert json.loads(json.dumps(rows)) == rows  # plain data
    rows_deq = budget_table(mixed_model, "none", shuffle=0)  # without weights: the dequantized ones
    assert rows_deq[0]["rms"] == pytest.approx(by_class["embedding"]["rms"], rel=1e-2)


# ------------------------------------------------------------ the records' .ptz
@pytest.mark.torch
@requires_torch
def test_the_records_artifact_dequantizes_as_the_record_does():
    """tests/golden/record_int6.ptz was written by the record's serialize path; sha256 of its dequantizer's output."""
    _, meta = goldens()
    model = load_record_artifact(RECORD_PTZ, orig_dtypes=meta["record_int6_dtypes"])
    deq = dequantize_mixed(model)
    digests = {k: hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest() for k, v in deq.items()}
    assert digests == meta["record_int6_sha256"]
    info = model.info
    assert (info["blocks.0.attn.c_q.weight"]["bits"], info["blocks.0.attn.c_q.weight"]["method"]) == (
        6,
        "gptq",
    )
    assert (info["blocks.0.mlp.fc.weight"]["bits"], info["blocks.0.mlp.fc.weight"]["method"]) == (6, "rows")
    assert info["tok_emb.weight"]["bits"] == 8 and model.scales["extra.cube"].dtype == np.float32
    assert {info[n]["store"] for n in ("skip_weights", "blocks.0.attn_scale", "step")} == {
        "fp32",
        "fp16",
        "raw",
    }


@pytest.mark.slow
@pytest.mark.torch
@requires_torch
def test_a_records_artifact_converts_to_pgolfs_without_loss(tmp_path):
    _, meta = goldens()
    classes = {"tok_emb.weight": "embedding", "blocks.0.attn.c_q.weight": "attention"}
    model = load_record_artifact(RECORD_PTZ, orig_dtypes=meta["record_int6_dtypes"], classes=classes)
    assert model.info["tok_emb.weight"]["class"] == "embedding" and model.info["step"]["class"] == "other"
    back = load_mixed_artifact(
        container.write_artifact(tmp_path / "m.pgolf", mixed_artifact_bytes(model), "brotli").path
    )
    a, b = dequantize_mixed(model), dequantize_mixed(back)
    assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.torch
@requires_torch
def test_a_records_artifact_in_other_compressors(tmp_path):
    """lzma (the record's other COMPRESSOR) and no shuffle read the same."""
    raw = compress.byte_unshuffle(compress.decompress(RECORD_PTZ.read_bytes(), "brotli"))
    expected = dequantize_mixed(load_record_artifact(RECORD_PTZ))
    for blob in (
        __import__("lzma").compress(compress.byte_shuffle(raw)),
        zlib.compress(raw),
        compress.compress(raw, "brotli", 5),
    ):
        (tmp_path / "r.ptz").write_bytes(blob)
        got = dequantize_mixed(load_record_artifact(tmp_path / "r.ptz"))
        assert all(np.array_equal(got[k], expected[k]) for k in expected)


def test_a_records_artifact_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(PgolfError, match=r"record_int6.ptz: reading a record's .ptz artifact needs PyTorch"):
        load_record_artifact(RECORD_PTZ)


def damaged_record(case: str) -> dict:
    """A record-style object with one thing wrong (built lazily: torch may be absent)."""
    q6 = {"a.q": torch.zeros(2, 3, dtype=torch.int8), "a.scale": torch.ones(2).half()}
    return {
        "no m": {"w": {}},
        "missing tensor": {"w": {}, "m": {"a": "passthrough"}},
        "missing scale": {"w": {"a.q": q6["a.q"]}, "m": {"a": {"type": "int6"}}},
        "unknown entry": {"w": {"a": torch.zeros(2)}, "m": {"a": {"type": "int4"}}},
        "stray tensor": {"w": {"a": torch.zeros(2), "b": torch.zeros(1)}, "m": {"a": "passthrough"}},
        "out of range": {
            "w": q6 | {"a.q": torch.full((2, 3), 40, dtype=torch.int8)},
            "m": {"a": {"type": "int6"}},
        },
        "bad scales": {"w": q6 | {"a.scale": torch.ones(3).half()}, "m": {"a": {"type": "int6"}}},
    }[case]


@pytest.mark.torch
@requires_torch
@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("no m", "a dict with 'w' and 'm' maps"),
        ("missing tensor", "'a' is missing"),
        ("missing scale", "'a.scale' is missing"),
        ("unknown entry", "unknown entry"),
        ("stray tensor", "'b' has no entry"),
        ("out of range", "beyond the int6 range"),
        ("bad scales", r"scales of shape \(3,\)"),
    ],
)
def test_a_damaged_records_artifact_is_one_clear_error(tmp_path, case, reason):
    import io

    buf = io.BytesIO()
    torch.save(damaged_record(case), buf)
    path = tmp_path / "r.ptz"
    path.write_bytes(compress.compress(compress.byte_shuffle(buf.getvalue()), "brotli", 1))
    with pytest.raises(PgolfError, match=f"r.ptz is damaged or not a record artifact: .*{reason}") as err:
        load_record_artifact(path)
    assert "\n" not in str(err.value)


@pytest.mark.torch
@requires_torch
def test_a_record_artifact_holding_code_is_refused(tmp_path):
    """weights_only: a pickle that would run code is refused, and does not run."""
    import io

    buf = io.BytesIO()
    torch.save({"w": {}, "m": {}, "x": RunsCode(tmp_path / "pwned")}, buf)
    (tmp_path / "r.ptz").write_bytes(compress.compress(buf.getvalue(), "brotli", 1))
    with pytest.raises(PgolfError, match="r.ptz is damaged or not a record artifact"):
        load_record_artifact(tmp_path / "r.ptz")
    assert not (tmp_path / "pwned").exists()
