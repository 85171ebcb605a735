"""The int8 artifact: the challenge's quantization, pgolf's container, upstream containers."""

from __future__ import annotations

import contextlib
import hashlib
import io
import pickle
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core import quant
from core.config import preset
from core.errors import PgolfError
from core.params import init_params, storage_dtypes

ROOT = Path(__file__).resolve().parent.parent


def trained_like_state(seed: int = 0, cfg=None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Baseline-initialised weights with the zero projections filled in, as after training."""
    cfg = cfg or preset("smoke").replace(vocab_size=1024, model_dim=128)
    state = init_params(cfg, bf16=True)
    rng = np.random.default_rng(seed)
    for name, value in state.items():
        if not value.any():
            state[name] = rng.normal(0, 0.02, value.shape).astype(np.float32)
    state["blocks.0.attn_scale"] = rng.normal(1, 0.1, state["blocks.0.attn_scale"].shape).astype(np.float32)
    return state, storage_dtypes(cfg, bf16=True)


# ------------------------------------------------- the format against torch
torch = pytest.importorskip("torch", reason="torch is the independent reference for the int8 format")


def torch_reference(state: dict[str, np.ndarray], dtypes: dict[str, str]):
    """SPEC section 6, written directly in torch."""
    control = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weight")
    out = {}
    for name, a in state.items():
        t = torch.from_numpy(a).to(getattr(torch, dtypes.get(name, "float32")))
        if t.numel() <= 65_536:
            keep = t.float() if any(c in name for c in control) else t.to(torch.float16)
            out[name] = ("pass", keep)
            continue
        t32 = t.float()
        if t32.ndim == 2:
            clip = torch.quantile(t32.abs(), 0.9999984, dim=1)
            scale = (clip / 127.0).clamp_min(1.0 / 127.0)
            q = torch.clamp(
                torch.round(
                    torch.maximum(torch.minimum(t32, clip[:, None]), -clip[:, None]) / scale[:, None]
                ),
                -127,
                127,
            )
            s16 = scale.to(torch.float16)
            deq = (q.float() * s16.float()[:, None]).to(t.dtype)
            out[name] = ("q", q.to(torch.int8), s16, deq)
        else:
            clip = float(torch.quantile(t32.abs().flatten(), 0.9999984))
            scale = torch.tensor(clip / 127.0 if clip > 0 else 1.0)
            q = torch.clamp(torch.round(torch.clamp(t32, -clip, clip) / scale), -127, 127)
            out[name] = ("q", q.to(torch.int8), scale, (q.float() * scale).to(t.dtype))
    return out


def test_quantization_matches_the_spec_in_torch():
    state, dtypes = trained_like_state()
    rng = np.random.default_rng(3)
    state["extra.big_vector"] = rng.normal(0, 1, 70_000).astype(np.float32)
    state["extra.cube"] = rng.normal(0, 1, (40, 40, 50)).astype(np.float32)
    state["extra.zero_rows"] = np.zeros((300, 256), np.float32)
    state["extra.zero_rows"][::7] = rng.normal(0, 1, (43, 256))
    model = quant.quantize_int8(state, dtypes)
    deq = quant.dequantize_int8(model)
    for name, ref in torch_reference(state, dtypes).items():
        if ref[0] == "pass":
            assert np.array_equal(model.passthrough[name], ref[1].numpy()), name
            assert np.array_equal(
                deq[name],
                ref[1]
                .to(
                    torch.float32
                    if ref[1].dtype == torch.float32
                    else getattr(torch, dtypes.get(name, "float32"))
                )
                .float()
                .numpy(),
            ), name
        else:
            assert np.array_equal(model.quantized[name], ref[1].numpy()), name
            assert np.array_equal(np.asarray(model.scales[name]), ref[2].numpy()), name
            assert np.array_equal(deq[name], ref[3].float().numpy()), name


def test_baseline_payload_is_the_published_figure():
    cfg = preset("baseline")
    model = quant.quantize_int8(init_params(cfg, bf16=True), storage_dtypes(cfg, bf16=True))
    assert model.stats["int8_payload_bytes"] == 17_178_912
    assert model.stats["param_count"] == 17_059_912


def test_non_float_tensors_pass_through():
    model = quant.quantize_int8({"counter": np.arange(5, dtype=np.int64)})
    assert np.array_equal(quant.dequantize_int8(model)["counter"], np.arange(5))
    assert model.stats["num_nonfloat_tensors"] == 1


# ------------------------------------------------------------- the container
# The uncompressed container: independent of the zlib build, so it pins pgolf's own format.
GOLDEN_SHA256 = "e3c84e2706771d2fad88e1058d8c1f4f3431c441b0fb1eff6a89aa9135250b3a"


def small_state():
    rng = np.random.default_rng(1234)
    return {
        "tok_emb.weight": rng.normal(0, 0.02, (300, 256)).astype(np.float32),
        "blocks.0.attn.q_gain": np.full(4, 1.5, np.float32),
        "blocks.0.mlp.fc.weight": rng.normal(0, 0.05, (512, 256)).astype(np.float32),
    }, {"tok_emb.weight": "bfloat16"}


def test_golden_bytes():
    blob = quant.artifact_bytes(quant.quantize_int8(*small_state()), compressor="none")
    assert hashlib.sha256(blob).hexdigest() == GOLDEN_SHA256


def test_same_bytes_in_another_process():
    code = (
        "import hashlib, sys; sys.path[:0] = ['tests', '.']\n"
        "from test_quant import small_state; from core import quant\n"
        "print(hashlib.sha256(quant.artifact_bytes(quant.quantize_int8(*small_state()))).hexdigest())"
    )
    digests = {
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout.strip()
        for seed in ("1", "2")
    }  # fmt: skip
    assert digests == {hashlib.sha256(quant.artifact_bytes(quant.quantize_int8(*small_state()))).hexdigest()}


@pytest.mark.parametrize("compressor", sorted(quant.COMPRESSORS))
def test_round_trip_through_every_compressor(tmp_path, compressor):
    model = quant.quantize_int8(*trained_like_state())
    path = quant.save_artifact(tmp_path / "m.pgolf", model, compressor=compressor)
    back = quant.load_artifact(path)
    expected, got = quant.dequantize_int8(model), quant.dequantize_int8(back)
    assert expected.keys() == got.keys() and all(np.array_equal(expected[k], got[k]) for k in expected)


def test_the_container_is_plain_safetensors_inside(tmp_path):
    from safetensors.numpy import load

    blob = quant.artifact_bytes(quant.quantize_int8(*small_state()))
    inner = load(zlib.decompress(blob[len(quant.MAGIC) + 1 :]))
    assert inner["q/tok_emb.weight"].dtype == np.int8 and inner["s/tok_emb.weight"].dtype == np.float16
    assert inner["p/blocks.0.attn.q_gain"].dtype == np.float32


def test_upstream_torch_container_round_trip(tmp_path):
    model = quant.quantize_int8(*trained_like_state())
    path = quant.save_upstream_torch(tmp_path / "final_model.int8.ptz", model)
    obj = torch.load(io.BytesIO(zlib.decompress(path.read_bytes())), weights_only=True)
    assert (
        obj["__quant_format__"] == "int8_clean_per_row_v1" and obj["dtypes"]["tok_emb.weight"] == "bfloat16"
    )
    expected, got = quant.dequantize_int8(model), quant.dequantize_int8(quant.load_artifact(path))
    assert all(np.array_equal(expected[k], got[k]) for k in expected)


def test_mlx_pickle_needs_explicit_consent(tmp_path):
    model = quant.quantize_int8(*trained_like_state())
    obj = {
        "__quant_format__": "int8_clean_per_row_v1",
        "quantized": model.quantized,
        "scales": model.scales,
        "dtypes": model.dtypes,
        "passthrough": model.passthrough,
        "qmeta": model.qmeta,
        "passthrough_orig_dtypes": model.passthrough_orig_dtypes,
    }
    path = tmp_path / "final_model.int8.ptz"
    path.write_bytes(zlib.compress(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), 9))
    with pytest.raises(PgolfError, match="--allow-pickle"):
        quant.load_artifact(path)
    with pytest.warns(UserWarning, match="unpickling"):
        back = quant.load_artifact(path, allow_pickle=True)
    expected, got = quant.dequantize_int8(model), quant.dequantize_int8(back)
    assert all(np.array_equal(expected[k], got[k]) for k in expected)


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[: len(b) // 2],
        lambda b: b[:-1],
        lambda b: b"XXXXX" + b[5:],
        lambda b: b[:20] + bytes([b[20] ^ 0xFF]) + b[21:],
        lambda b: b"",
    ],
)
def test_damaged_artifacts_are_one_clear_error(tmp_path, damage):
    path = tmp_path / "a.pgolf"
    path.write_bytes(damage(quant.artifact_bytes(quant.quantize_int8(*small_state()))))
    with pytest.raises(PgolfError, match="a.pgolf"):
        quant.load_artifact(path)


def test_bad_metadata_and_missing_tensor(tmp_path):
    from safetensors.numpy import save

    for tensors, meta in [
        ({"q/w": np.zeros((2, 2), np.int8)}, "{not json"),
        (
            {"q/w": np.zeros((2, 2), np.int8)},
            '{"format":"pgolf-int8","version":1,"quant_format":"int8_clean_per_row_v1","dtypes":{"w":"float32"},"passthrough_orig_dtypes":{},"qmeta":{}}',
        ),
    ]:
        path = tmp_path / "bad.pgolf"
        path.write_bytes(quant.MAGIC + b"\x00" + save(tensors, metadata={"pgolf": meta}))
        with pytest.raises(PgolfError, match="bad.pgolf"):
            quant.load_artifact(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzzed_artifacts_never_crash(tmp_path, data):
    blob = bytearray(quant.artifact_bytes(quant.quantize_int8(*small_state()), compressor="none"))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    blob = blob[: data.draw(st.integers(0, len(blob)))]
    path = tmp_path / "fuzz.pgolf"
    path.write_bytes(bytes(blob))
    with contextlib.suppress(PgolfError):
        quant.dequantize_int8(quant.load_artifact(path))


def test_size_report():
    report = quant.size_report(payload_bytes=10, model_bytes=15_815_847, code_bytes=47_642)
    assert report["total_bytes"] == 15_863_489 and report["headroom_bytes"] == 136_511
