"""The int8 artifact: the challenge's quantization, pgolf's container, upstream containers."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import re
import subprocess
import sys
import zlib
from fractions import Fraction

import numpy as np
import pytest
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from core.artifact import container, int8_format, upstream
from core.artifact import quantized as quant
from core.common import compress
from core.common.errors import PgolfError
from core.config.presets import preset
from core.model.params import artifact_classes, init_params, storage_dtypes
from tests.support.artifacts import (
    CONTROL_PATTERNS,
    RunsCode,
    equal_weights,
    golden_state,
    int8_stats,
    quantize,
    same,
)
from tests.support.backends import requires_torch
from tests.support.cli import IMPORTABLE

try:
    import torch
except ImportError:
    torch = None

CLIP_Q = 99.99984 / 100


def baseline_like_state(seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Trained-looking tensors in the baseline's shapes, plus the odd cases the format handles."""
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        w = rng.normal(0, 1, (rows, cols)) * rng.uniform(0.005, 0.2, (rows, 1))
        w[rng.integers(0, rows, 8), rng.integers(0, cols, 8)] *= 40  # outliers the clip must catch
        w[3] = 0.0  # an all-zero row: clip 0, scale 1/127
        w[5] = np.round(w[5] * 50) / 50  # many ties
        return w.astype(np.float32)

    state = {
        "tok_emb.weight": matrix(1024, 512),
        "skip_weights": rng.normal(1, 0.1, (4, 512)).astype(np.float32),
        "blocks.0.attn.c_q.weight": matrix(512, 512),
        "blocks.0.attn.c_k.weight": matrix(256, 512),
        "blocks.0.attn.proj.weight": np.zeros((512, 512), np.float32),
        "blocks.0.attn.q_gain": np.full(8, 1.5, np.float32),
        "blocks.0.mlp.fc.weight": matrix(1024, 512),
        "blocks.0.mlp.proj.weight": matrix(512, 1024),
        "blocks.0.attn_scale": rng.normal(1, 0.1, 512).astype(np.float32),
        "blocks.0.resid_mix": rng.normal(0.5, 0.3, (2, 512)).astype(np.float32),
        "extra.cube": rng.normal(0, 0.05, (40, 40, 50)).astype(np.float32),  # one scale per tensor
        "extra.zero_cube": np.zeros((2, 200, 200), np.float32),  # clip 0 -> scale 1
        "extra.long_vector": rng.normal(0, 1, 70_000).astype(np.float32),
        "extra.bias": rng.normal(0, 0.1, 300).astype(np.float32),  # small non-control: stored fp16
        "extra.small_bf16": rng.normal(0, 3, 64).astype(np.float32),
        "extra.half": rng.normal(0, 0.1, (300, 256)).astype(np.float32),
        "extra.small_half": rng.normal(0, 0.1, 10).astype(np.float32),
        "step": np.array([1234], np.int64),
    }
    dtypes = {
        "tok_emb.weight": "bfloat16",
        "extra.small_bf16": "bfloat16",
        "extra.half": "float16",
        "extra.small_half": "float16",
    }
    return state, dtypes


# ------------------------------------------------- the format against torch
def torch_reference(state: dict[str, np.ndarray], dtypes: dict[str, str]) -> dict[str, tuple]:
    """The challenge's int8 format written directly in torch, on tensors in the model's own dtypes.

    Per name: ("pass", stored tensor, dequantized) or ("q", int8, scale, dequantized).
    """
    out: dict[str, tuple] = {}
    for name, a in state.items():
        t = torch.from_numpy(a)
        if not t.is_floating_point():
            out[name] = ("pass", t, t)
            continue
        t = t.to(getattr(torch, dtypes.get(name, "float32")))
        if t.numel() <= 65_536:
            if any(c in name for c in CONTROL_PATTERNS):
                out[name] = ("pass", t.float(), t.float())
            elif t.dtype in (torch.float32, torch.bfloat16):
                out[name] = ("pass", t.half(), t.half().to(t.dtype))
            else:
                out[name] = ("pass", t, t)
            continue
        t32 = t.float()
        if t32.ndim == 2:
            clip = torch.quantile(t32.abs(), CLIP_Q, dim=1)
            scale = (clip / 127.0).clamp_min(1.0 / 127.0)
            clipped = torch.maximum(torch.minimum(t32, clip[:, None]), -clip[:, None])
            q = torch.clamp(torch.round(clipped / scale[:, None]), -127, 127).to(torch.int8)
            s = scale.half()
            out[name] = ("q", q, s, (q.float() * s.float()[:, None]).to(t.dtype))
        else:
            clip = float(torch.quantile(t32.abs().flatten(), CLIP_Q))
            s = torch.tensor(clip / 127.0 if clip > 0 else 1.0)
            q = torch.clamp(torch.round(torch.clamp(t32, -clip, clip) / s), -127, 127).to(torch.int8)
            out[name] = ("q", q, s, (q.float() * float(s)).to(t.dtype))
    return out


def as_numpy(t) -> np.ndarray:
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


@pytest.mark.torch
@requires_torch
@pytest.mark.parametrize("seed", [0, 1])
def test_quantize_and_dequantize_match_the_torch_reference(seed):
    state, dtypes = baseline_like_state(seed)
    model = quantize(state, dtypes)
    deq = int8_format.dequantize_int8(model)
    ref = torch_reference(state, dtypes)
    assert set(deq) == set(ref)
    for name, r in ref.items():
        if r[0] == "pass":
            assert same(model.passthrough[name], r[1].numpy()), name
        else:
            assert same(model.quantized[name], r[1].numpy()), name
            assert same(np.asarray(model.scales[name]), r[2].numpy()), name
            assert model.dtypes[name] == dtypes.get(name, "float32"), name
        expected = as_numpy(r[-1])
        assert np.array_equal(
            deq[name], expected.astype(np.float32) if expected.dtype.kind == "f" else expected
        )
    assert model.passthrough_orig_dtypes == {"extra.bias": "float32", "extra.small_bf16": "bfloat16"}
    assert set(model.qmeta) == {n for n, r in ref.items() if r[0] == "q" and r[2].ndim == 1}


def lerp_weight(n: int) -> np.float32:
    rank = np.float32(CLIP_Q) * np.float32(n - 1)  # torch's rank, in float32
    return rank - np.float32(int(rank))


def unfused_lerp(lo: np.ndarray, hi: np.ndarray, w: np.float32) -> np.ndarray:
    """The textbook lerp with two roundings: what torch.quantile does NOT compute."""
    return lo + w * (hi - lo) if w < 0.5 else hi - (hi - lo) * (np.float32(1) - w)


def lerp_sensitive_rows(n: int, rng: np.random.Generator, count: int = 64) -> np.ndarray:
    """Rows whose two order statistics around the rank make an unfused lerp differ from a fused one."""
    w = lerp_weight(n)
    lo = rng.uniform(0.01, 1, 400_000).astype(np.float32)
    hi = (lo * rng.uniform(1, 3, lo.size)).astype(np.float32)
    d, base, coeff = (hi - lo).astype(np.float64), (lo if w < 0.5 else hi), (w if w < 0.5 else w - 1)
    fused = (np.float64(coeff) * d + base).astype(np.float32)  # one rounding (close enough to pick rows)
    pick = np.nonzero(fused != unfused_lerp(lo, hi, w))[0][:count]
    assert len(pick) >= 8, "no sensitive pairs found"
    rows = rng.uniform(0, 1, (len(pick), n)).astype(np.float32) * lo[pick, None]
    rows[:, :2] = np.stack([-lo[pick], hi[pick]], axis=1)
    return rng.permuted(rows, axis=1)


@pytest.mark.torch
@requires_torch
@pytest.mark.parametrize(("cols", "sharp"), [(512, True), (1024, True), (300, False), (7, False)])
def test_row_clip_is_torch_quantile_bit_for_bit(cols, sharp):
    """At 300 columns the weight is 1 - 2**-11 and both lerps round alike; at 512 and 1024 they differ."""
    rng = np.random.default_rng(cols)
    w = (rng.normal(0, 1, (3000, cols)) * rng.uniform(1e-3, 10, (3000, 1))).astype(np.float32)
    w[:50] = 0.0
    w[50:300] = np.round(w[50:300] * 4) / 4  # ties, also between the two order statistics used
    w[300:400, -2:] = w[300:400, :1]  # equal top values
    if sharp:
        w = np.concatenate([w, lerp_sensitive_rows(cols, rng)])
    expected = torch.quantile(torch.from_numpy(w).abs(), CLIP_Q, dim=1).numpy()
    got = quant.abs_quantile(w)
    assert got.dtype == np.float32 and np.array_equal(got, expected)
    if not sharp:
        return
    # torch's lerp is fused: the textbook one would fail here.
    s = np.sort(np.abs(w), axis=1)
    rank = np.float32(CLIP_Q) * np.float32(cols - 1)
    unfused = unfused_lerp(s[:, int(rank)], s[:, int(np.ceil(rank))], lerp_weight(cols))
    assert not np.array_equal(unfused, expected)


def round_to_float32(x: Fraction) -> np.float32:
    """The float32 nearest to an exact rational, ties to even."""
    f = np.float32(float(x))
    near = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    return min(near, key=lambda c: (abs(Fraction(float(c)) - x), int(np.array(c).view(np.uint32)) & 1))


def test_fused_multiply_add_rounds_once():
    rng = np.random.default_rng(5)
    a, b, c = (rng.normal(0, 1, 3000) * 10.0 ** rng.integers(-8, 8, 3000) for _ in range(3))
    # A float64 sum that lands exactly on a float32 midpoint: a naive cast would round up, not down.
    a[0], b[0], c[0] = 2**-12 * (1 + 2**-23), 2**-12 * (1 - 2**-23), 1 + 2**-23
    a, b, c = (x.astype(np.float32) for x in (a, b, c))
    got = quant.fma32(a, b, c)
    expected = [
        round_to_float32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
        for x, y, z in zip(a, b, c, strict=True)
    ]
    assert got[0] == np.float32(1 + 2**-23) and np.array_equal(got, np.array(expected, np.float32))


@pytest.mark.torch
@requires_torch
def test_tensor_clip_is_torch_quantile_bit_for_bit():
    rng = np.random.default_rng(7)
    for n in (65_537, 70_000, 100_003, 250_000):
        for scale in (1e-3, 1.0, 50.0):
            w = (rng.normal(0, scale, n)).astype(np.float32)
            expected = torch.quantile(torch.from_numpy(w).abs(), CLIP_Q).numpy()
            assert np.array_equal(quant.abs_quantile(w.reshape(1, -1))[0], expected)


@pytest.mark.torch
@requires_torch
def test_round_to_bfloat16_matches_torch():
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)
    edge_bits = np.array(
        [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,
         0x7F7FFFFF, 0x7F7F8000, 0x3F808000, 0x3F818000, 0x3F808001, 0x00008000, 0x00018000,
         0x00000001, 0x807FFFFF, 0x3F800000, 0x477FE000],
        dtype=np.uint32,
    )  # fmt: skip
    for a in (random_bits.view(np.float32), edge_bits.view(np.float32)):
        got = quant.round_to_bfloat16(a)
        expected = torch.from_numpy(a.copy()).to(torch.bfloat16).float().numpy()
        assert got.dtype == np.float32
        assert np.array_equal(got, expected, equal_nan=True)
        assert np.array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(expected[~np.isnan(expected)]))


def test_baseline_payload_is_the_published_figure():
    cfg = preset("baseline")
    # The parameter table's classes keep exactly the challenge's control tensors in fp32.
    params, dtypes = init_params(cfg, bf16=True), storage_dtypes(cfg, bf16=True)
    model = int8_format.quantize_int8(params, dtypes, artifact_classes(cfg))
    stats = int8_stats(params, model, dtypes)
    assert stats["int8_payload_bytes"] == 17_178_912
    assert stats["param_count"] == 17_059_912
    assert stats["baseline_tensor_bytes"] == 4 * 17_059_912 - 2 * 1024 * 512  # bf16 embedding
    assert (stats["num_tensors"], stats["num_float_tensors"]) == (92, 55)
    assert model.dtypes["tok_emb.weight"] == "bfloat16" and "tok_emb.weight" in model.qmeta


def test_non_float_tensors_pass_through():
    state = {"counter": np.arange(5, dtype=np.int64), "mask": np.ones(3, bool)}
    model = quantize(state)
    deq = int8_format.dequantize_int8(model)
    assert same(deq["counter"], np.arange(5, dtype=np.int64)) and same(deq["mask"], np.ones(3, bool))
    stats = int8_stats(state, model)
    assert stats["num_nonfloat_tensors"] == 2 and stats["int8_payload_bytes"] == 43


def test_bf16_weights_are_rounded_before_quantizing():
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.02, (300, 256)).astype(np.float32)
    a = quantize({"w": w}, {"w": "bfloat16"})
    b = quantize({"w": quant.round_to_bfloat16(w)}, {"w": "bfloat16"})
    assert same(a.quantized["w"], b.quantized["w"]) and same(a.scales["w"], b.scales["w"])


def test_unsupported_weights_are_refused():
    with pytest.raises(PgolfError, match="w has dtype float64"):
        quantize({"w": np.zeros(4)})
    bad = np.zeros((300, 256), np.float32)
    bad[7, 7] = np.nan
    with pytest.raises(PgolfError, match="w holds NaN"):
        quantize({"w": bad})
    with pytest.raises(PgolfError, match="small holds NaN"):  # kept in float, checked all the same
        quantize({"small": np.array([1.0, np.inf], np.float32)})
    # Finite, but past float16: as a passed-through tensor, and as a per-row scale (|w| / 127).
    with pytest.raises(PgolfError, match="small is too large for the format's float16"):
        quantize({"small": np.array([1.0, 1e5], np.float32)})
    with pytest.raises(PgolfError, match="w is too large for the format's float16"):
        quantize({"w": np.full((300, 256), 1e7, np.float32)})


# ------------------------------------------------------------- the container


# Recorded from this code; a change means the artifact format changed (bump CONTAINER_VERSION).
GOLDEN_SHA256 = {
    "none": "853f4d1847e4cd725ba3635aa53b5df8aac1cecc87932c7274dc0144bd9eda76",
    "zlib": "4bbccfa706352fff0c910744b37f34c4594688c1426cc389b52b89f19c2b5e4d",
}
# The same weights in the first container (MAGIC_V1, no checksum), as pgolf wrote them then.
GOLDEN_V1_SHA256 = {
    "none": "820133e7df107982438b658c866e74947e78b872ef1afcb9fbe9d746bf6afe09",
    "zlib": "de9559ef8d0152c40fe35b5ccb976ec0311a0a0c436a2ca64d5fbecab6389483",
}


@pytest.mark.parametrize("compressor", ["none", "zlib"])
def test_golden_bytes(compressor):
    if compressor == "zlib" and "ng" in zlib.ZLIB_RUNTIME_VERSION:
        pytest.skip(f"zlib-ng ({zlib.ZLIB_RUNTIME_VERSION}) deflates differently from zlib")
    blob = int8_format.artifact_bytes(quantize(*golden_state()), compressor=compressor)
    assert hashlib.sha256(blob).hexdigest() == GOLDEN_SHA256[compressor]
    old = (
        container.MAGIC_V1 + blob[len(container.MAGIC) : -container.DIGEST_BYTES]
    )  # the checksum is all that changed
    assert hashlib.sha256(old).hexdigest() == GOLDEN_V1_SHA256[compressor]


def test_artifacts_written_before_the_checksum_still_load_with_a_warning(tmp_path):
    model = quantize(*golden_state())
    blob = int8_format.artifact_bytes(model, compressor="zlib")
    path = tmp_path / "old.pgolf"
    path.write_bytes(container.MAGIC_V1 + blob[len(container.MAGIC) : -container.DIGEST_BYTES])
    with pytest.warns(UserWarning, match="before pgolf's containers carried a checksum"):
        assert equal_weights(model, upstream.load_artifact(path))


@pytest.mark.slow  # ~4 s
def test_same_bytes_in_other_processes_and_any_order(tmp_path):
    state, dtypes = golden_state()
    np.savez(tmp_path / "state.npz", **state)
    code = (
        "import hashlib, sys, numpy as np\n"
        "from tests.support.artifacts import quantize\n"
        "from core.artifact import int8_format\n"
        f"state = dict(np.load({str(tmp_path / 'state.npz')!r}))\n"
        f"print(hashlib.sha256(int8_format.artifact_bytes(quantize(state, {dtypes!r}))).hexdigest())"
    )
    digests = set()
    for seed in ("0", "1", "12345"):
        env = {"PYTHONHASHSEED": seed, "PATH": os.environ.get("PATH", ""), **IMPORTABLE}
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        assert result.returncode == 0, result.stderr
        digests.add(result.stdout.strip())
    reordered = dict(reversed(list(state.items())))
    digests.add(hashlib.sha256(int8_format.artifact_bytes(quantize(reordered, dtypes))).hexdigest())
    assert len(digests) == 1


@pytest.mark.parametrize(("compressor", "level"), [("none", None), ("zlib", None), ("zlib", 1), ("lzma", None),
                                                   ("lzma", 6), ("bz2", None), ("bz2", 1)])  # fmt: skip
def test_round_trip_through_every_compressor(tmp_path, compressor, level):
    model = quantize(*golden_state())
    info = container.write_artifact(
        tmp_path / "m.pgolf", int8_format.artifact_bytes(model, compressor, level), compressor
    )
    blob = info.path.read_bytes()
    assert info.file_bytes == len(blob)
    assert blob[len(container.MAGIC)] == compress.COMPRESSORS[compressor].id
    back = upstream.load_artifact(info.path)
    assert equal_weights(model, back)
    assert back.dtypes == model.dtypes and back.qmeta == model.qmeta
    assert back.passthrough_orig_dtypes == model.passthrough_orig_dtypes
    assert int8_format.artifact_bytes(back, compressor, level) == blob  # the same bytes again


def test_bad_compressor_settings_are_refused(tmp_path):
    model = quantize(*golden_state())
    with pytest.raises(PgolfError, match="unknown compressor 'lz4'"):
        int8_format.artifact_bytes(model, compressor="lz4")
    with pytest.raises(PgolfError, match="level 0 is not in 1..9"):
        int8_format.artifact_bytes(model, compressor="bz2", level=0)
    assert not list(tmp_path.iterdir())


def test_the_container_is_plain_safetensors_inside():
    blob = int8_format.artifact_bytes(quantize(*golden_state()))
    assert blob[: len(container.MAGIC) + 1] == b"PGOLF-INT8\x01\x01"
    payload = zlib.decompress(blob[len(container.MAGIC) + 1 : -container.DIGEST_BYTES])
    assert blob[-container.DIGEST_BYTES :] == hashlib.sha256(payload).digest()
    inner = st_load(payload)
    assert inner["q/tok_emb.weight"].dtype == np.int8 and inner["s/tok_emb.weight"].dtype == np.float16
    assert inner["s/extra.cube"].shape == () and inner["s/extra.cube"].dtype == np.float32
    assert inner["p/blocks.0.attn.q_gain"].dtype == np.float32 and inner["p/extra.bias"].dtype == np.float16
    header = json.loads(payload[8 : 8 + int.from_bytes(payload[:8], "little")])
    assert list(header["__metadata__"]) == ["pgolf"]
    meta_text = header["__metadata__"]["pgolf"]
    meta = json.loads(meta_text)
    assert meta_text == json.dumps(meta, sort_keys=True, separators=(",", ":"))
    assert (meta["format"], meta["version"], meta["quant_format"]) == (
        "pgolf-int8",
        1,
        "int8_clean_per_row_v1",
    )
    assert meta["dtypes"]["tok_emb.weight"] == "bfloat16"
    assert meta["passthrough_orig_dtypes"] == {"extra.bias": "float32"}


# ------------------------------------------------------- upstream containers
def torch_dequantize(obj: dict) -> dict:
    """The upstream dequantizer, from the format's description, on a torch.load-ed object."""
    out = {}
    for name, q in obj["quantized"].items():
        s, dtype = obj["scales"][name], getattr(torch, obj["dtypes"][name])
        if s.ndim > 0:
            out[name] = (q.float() * s.float().view(q.shape[0], *([1] * (q.ndim - 1)))).to(dtype)
        else:
            out[name] = (q.float() * float(s)).to(dtype)
    for name, t in obj["passthrough"].items():
        orig = obj.get("passthrough_orig_dtypes", {}).get(name)
        out[name] = t.to(getattr(torch, orig)) if orig else t
    return out


@pytest.mark.torch
@requires_torch
def test_upstream_torch_container_round_trip(tmp_path):
    state, dtypes = baseline_like_state()
    model = quantize(state, dtypes)
    info = upstream.save_upstream_torch(tmp_path / "final_model.int8.ptz", model)
    obj = torch.load(io.BytesIO(zlib.decompress(info.path.read_bytes())), weights_only=True)
    assert set(obj) == {"__quant_format__", "quantized", "scales", "dtypes", "passthrough", "qmeta",
                        "passthrough_orig_dtypes"}  # fmt: skip
    assert obj["__quant_format__"] == "int8_clean_per_row_v1" and obj["dtypes"] == model.dtypes
    assert obj["scales"]["tok_emb.weight"].dtype == torch.float16
    assert obj["scales"]["extra.cube"].dtype == torch.float32 and obj["scales"]["extra.cube"].ndim == 0
    assert obj["passthrough"]["blocks.0.attn.q_gain"].dtype == torch.float32
    assert obj["passthrough"]["extra.bias"].dtype == torch.float16
    assert obj["passthrough"]["step"].dtype == torch.int64
    ref = torch_reference(state, dtypes)  # what upstream's quantizer puts in the same container
    assert list(obj["quantized"]) == [n for n, r in ref.items() if r[0] == "q"]
    assert list(obj["passthrough"]) == [n for n, r in ref.items() if r[0] == "pass"]
    for name, r in ref.items():
        stored = (
            (obj["passthrough"][name],) if r[0] == "pass" else (obj["quantized"][name], obj["scales"][name])
        )
        for got, expected in zip(stored, r[1:-1], strict=True):
            assert got.dtype == expected.dtype and torch.equal(got, expected), name
    ours = int8_format.dequantize_int8(model)
    for name, t in torch_dequantize(obj).items():
        assert np.array_equal(ours[name], as_numpy(t)), name
    assert equal_weights(model, upstream.load_artifact(info.path))


@pytest.mark.torch
@requires_torch
def test_a_torch_container_missing_a_key_is_one_clear_error(tmp_path):
    buffer = io.BytesIO()
    torch.save(
        {"__quant_format__": "int8_clean_per_row_v1", "quantized": {}, "scales": {}, "passthrough": {}},
        buffer,
    )
    path = tmp_path / "a.ptz"
    path.write_bytes(zlib.compress(buffer.getvalue()))
    with pytest.raises(PgolfError, match="a.ptz is damaged.*'dtypes' is missing"):
        upstream.load_artifact(path)


def test_upstream_torch_container_without_torch(tmp_path, monkeypatch):
    path = tmp_path / "final_model.int8.ptz"
    path.write_bytes(zlib.compress(b"PK\x03\x04 a torch.save zip", 9))
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    with pytest.raises(PgolfError, match=r"needs PyTorch: pip install 'pgolf\[torch\]'"):
        upstream.load_artifact(path)
    with pytest.raises(PgolfError, match="needs PyTorch"):
        upstream.save_upstream_torch(tmp_path / "out.ptz", quantize(*golden_state()))


def mlx_style_blob(model: quant.Int8Model) -> bytes:
    """What the upstream MLX script writes: a pickled dict of numpy arrays, zlib level 9."""
    obj = {
        "__quant_format__": "int8_clean_per_row_v1",
        "quantized": model.quantized,
        "scales": model.scales,
        "dtypes": model.dtypes,
        "passthrough": model.passthrough,
    }
    if model.qmeta:
        obj["qmeta"] = model.qmeta
    if model.passthrough_orig_dtypes:
        obj["passthrough_orig_dtypes"] = model.passthrough_orig_dtypes
    return zlib.compress(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), level=9)


def test_mlx_pickle_needs_explicit_consent(tmp_path):
    model = quantize(*baseline_like_state())
    path = tmp_path / "run_mlx_model.int8.ptz"
    path.write_bytes(mlx_style_blob(model))
    with pytest.raises(PgolfError, match="is a pickle.*can run code.*allow_pickle=True"):
        upstream.load_artifact(path)
    with pytest.warns(UserWarning, match="unpickling"):
        back = upstream.load_artifact(path, allow_pickle=True)
    assert equal_weights(model, back)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda obj: obj.pop("scales"), "'scales' is missing"),
        (lambda obj: obj.update(dtypes=["float32"]), "'dtypes' is not a map of names to str"),
        (lambda obj: obj["passthrough"].update(step="1234"), "step: passed-through value is not a numeric"),
        (lambda obj: obj.update(__quant_format__="int4"), "not a int8_clean_per_row_v1 object"),
    ],
)
def test_a_damaged_mlx_pickle_is_one_clear_error(tmp_path, change, reason):
    obj = pickle.loads(zlib.decompress(mlx_style_blob(quantize(*golden_state()))))
    change(obj)
    path = tmp_path / "a.ptz"
    path.write_bytes(zlib.compress(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)))
    with pytest.warns(UserWarning), pytest.raises(PgolfError, match=f"a.ptz is damaged.*{reason}"):
        upstream.load_artifact(path, allow_pickle=True)


def test_a_refused_pickle_is_never_unpickled(tmp_path):
    path = tmp_path / "evil.ptz"
    path.write_bytes(zlib.compress(pickle.dumps(RunsCode(tmp_path / "pwned"), protocol=4)))
    with pytest.raises(PgolfError, match="pickle"):
        upstream.load_artifact(path)
    assert not (tmp_path / "pwned").exists()


# --------------------------------------------------------------- bad input
BASE_META = {"format": "pgolf-int8", "version": 1, "quant_format": "int8_clean_per_row_v1",
             "dtypes": {"w": "float32"}, "passthrough_orig_dtypes": {}, "qmeta": {}}  # fmt: skip


def hand_made(tensors: dict[str, np.ndarray], meta: dict | str | None = None) -> bytes:
    """A hand-made pgolf file (uncompressed, with a matching checksum), for damage the writer would
    never produce."""
    text = meta if isinstance(meta, str) else json.dumps(BASE_META | (meta or {}))
    payload = st_save(tensors, metadata={"pgolf": text})
    return container.MAGIC + b"\x00" + payload + hashlib.sha256(payload).digest()


def without(key: str) -> str:
    return json.dumps({k: v for k, v in BASE_META.items() if k != key})


Q = np.zeros((4, 3), np.int8)
ROW_SCALES = np.ones(4, np.float16)


@pytest.mark.parametrize(
    ("blob", "reason"),
    [
        (hand_made({"q/w": Q, "s/w": ROW_SCALES}), None),  # the valid base case
        (hand_made({"q/w": Q, "s/w": ROW_SCALES}, "{not json"), "Expecting property name"),
        (hand_made({"q/w": Q, "s/w": ROW_SCALES}, {"version": 2}), "int8 format version 2"),
        (hand_made({"q/w": Q, "s/w": ROW_SCALES}, {"format": "other"}), "format 'other', not the int8"),
        (hand_made({"q/w": Q, "s/w": ROW_SCALES}, {"quant_format": "int6"}), "quant format 'int6'"),
        (hand_made({"q/w": Q, "s/w": ROW_SCALES}, {"dtypes": {}}), "unknown dtype None"),
        (hand_made({"q/w": Q, "s/w": ROW_SCALES}, {"dtypes": {"w": "int8"}}), "unknown dtype 'int8'"),
        (hand_made({"q/w": Q, "s/w": ROW_SCALES}, without("dtypes")), "'dtypes' is missing"),
        (hand_made({"q/w": Q, "s/w": ROW_SCALES}, without("qmeta")), "'qmeta' is missing"),
        (hand_made({"q/w": Q, "s/w": ROW_SCALES}, {"dtypes": ["w"]}), "'dtypes' is not a map"),
        (hand_made({"q/w": Q, "s/w": ROW_SCALES}, {"qmeta": {"w": 1}}), "'qmeta' is not a map"),
        (hand_made({"q/w": Q, "s/w": ROW_SCALES}, "[]"), "no pgolf metadata"),
        (
            hand_made({"q/w": Q, "s/w": ROW_SCALES}, "[" * 100_000 + "]" * 100_000),
            "its metadata is nested too deep",
        ),
        (
            hand_made({"q/w": Q, "s/w": ROW_SCALES}, '{"version": ' + "9" * 5_000 + "}"),
            "integer string conversion",
        ),
        (
            hand_made({"q/w": Q, "s/w": ROW_SCALES}, {"passthrough_orig_dtypes": {"w": 5}}),
            "'passthrough_orig",
        ),
        (hand_made({"q/w": Q}), "w has no scales"),
        (hand_made({"q/w": Q, "s/w": np.ones(5, np.float16)}), r"scales of shape \(5,\)"),
        (hand_made({"q/w": Q, "s/w": np.ones((4, 1), np.float16)}), r"scales of shape \(4, 1\)"),
        (hand_made({"q/w": Q.astype(np.int16), "s/w": ROW_SCALES}), "values are int16"),
        (hand_made({"q/w": Q, "s/w": ROW_SCALES, "x/w": Q}), "unexpected tensor 'x/w'"),
        (hand_made({"q/w": Q, "s/w": ROW_SCALES, "p/w": Q}), "both quantized and passed through"),
        (container.MAGIC + b"\x09" + st_save({}) + bytes(32), "unknown compressor id 9"),
        (hand_made({"q/w": Q, "s/w": ROW_SCALES})[:-1] + b"?", "does not match its checksum"),
        (hand_made({"q/w": Q, "s/w": np.full(4, np.nan, np.float16)}), "w holds NaN or infinite"),
        (container.MAGIC, "ends before its checksum"),
        (b"", "ends before the end of its stream"),
        (b"PGOLF-INT9\x00\x00", "incorrect header check"),
        (zlib.compress(b"just some text"), "unknown container"),
    ],
)
def test_damaged_artifacts_are_one_clear_error(tmp_path, blob, reason):
    path = tmp_path / "a.pgolf"
    path.write_bytes(blob)
    if reason is None:
        assert upstream.load_artifact(path).quantized["w"].shape == (4, 3)
        return
    with pytest.raises(PgolfError, match=f"artifact {re.escape(str(path))}.*{reason}") as err:
        upstream.load_artifact(path)
    assert "\n" not in str(err.value)


@pytest.mark.torch
@requires_torch
def test_a_broken_torch_zip_is_one_clear_error(tmp_path):
    path = tmp_path / "a.ptz"
    path.write_bytes(zlib.compress(b"PK\x03\x04 not really a zip"))
    with pytest.raises(PgolfError, match=f"artifact {re.escape(str(path))} is damaged"):
        upstream.load_artifact(path)


def test_missing_file_is_one_clear_error(tmp_path):
    with pytest.raises(PgolfError, match="nope.pgolf: cannot read"):
        upstream.load_artifact(tmp_path / "nope.pgolf")


@pytest.mark.parametrize("compressor", ["zlib", "none"])
def test_truncated_and_flipped_files(tmp_path, compressor):
    blob = int8_format.artifact_bytes(quantize(*golden_state()), compressor=compressor)
    path = tmp_path / "a.pgolf"
    for cut in (5, len(container.MAGIC) + 1, 100, len(blob) // 2, len(blob) - 1):
        path.write_bytes(blob[:cut])
        with pytest.raises(PgolfError, match="a.pgolf"):
            upstream.load_artifact(path)
    # The container's checksum catches a flipped byte, whatever the compressor (tests/test_fuzz.py: many more).
    for i in (len(container.MAGIC) + 5, len(blob) // 2, len(blob) - 2):
        path.write_bytes(blob[:i] + bytes([blob[i] ^ 0x10]) + blob[i + 1 :])
        with pytest.raises(PgolfError, match="a.pgolf"):
            upstream.load_artifact(path)


# ------------------------------------------------------------------ the budget
def test_size_report():
    report = quant.size_report(payload_bytes=17_178_912, model_bytes=15_815_847, code_bytes=47_642)
    assert report == {
        "payload_bytes": 17_178_912,
        "model_bytes": 15_815_847,
        "code_bytes": 47_642,
        "total_bytes": 15_863_489,
        "budget_bytes": 16_000_000,
        "headroom_bytes": 136_511,
    }
