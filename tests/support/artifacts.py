"""Artifacts for the tests: checkpoints, the int8 and mixed formats' weights and the challenge's statistics
of them, GPTQ's Hessian, lrzip (the program, and a stand-in), small artifacts, the artifact fit's run shape
and its stand-ins."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from core.artifact import container, int8_format
from core.artifact import quantized as quant
from core.artifact.checkpoint import Checkpoint, checkpoint_digest
from core.artifact.export import export_artifact
from core.artifact.quantized import FLOAT_BYTES, Int8Model, model_parts
from core.config.presets import preset
from core.model.params import init_params, storage_dtypes


# ---------------------------------------- checkpoints
def make_checkpoint() -> Checkpoint:
    cfg = preset("smoke")
    params = init_params(cfg)
    optimizer = {"step": np.array(3, dtype=np.int64)}
    optimizer.update({f"exp_avg/{k}": np.full_like(v, 0.5) for k, v in params.items()})
    return Checkpoint(
        params=params,
        optimizer=optimizer,
        config=cfg.to_dict(),
        step=3,
        train_time_ms=1234.5,
        data_state={"file_index": 0, "position": 99, "epoch": 1},
        backend="cuda",
        dtypes={k: "float32" for k in params},
    )


def rewrite_metadata(path, change, sign: bool = True) -> None:
    """Re-save a checkpoint with its JSON metadata replaced by change(metadata), with a checksum
    that matches the change when `sign` (as a writer that meant it would)."""
    blob = path.read_bytes()
    header = json.loads(blob[8 : 8 + int.from_bytes(blob[:8], "little")])
    meta = change(json.loads(header["__metadata__"]["pgolf"]))
    tensors = load_file(path)
    if sign and isinstance(meta, dict):
        meta["sha256"] = checkpoint_digest(tensors, meta)
    save_file(tensors, path, metadata={"pgolf": json.dumps(meta)})


# ---------------------------------------- weights from integer arithmetic alone
def ramp(shape: tuple[int, ...], scale: float, mult: int) -> np.ndarray:
    """Fixed weights from integer arithmetic alone: the same on every platform and numpy version."""
    k = (np.arange(int(np.prod(shape)), dtype=np.int64) * mult) % 2001 - 1000
    return (k * (scale / 1000)).astype(np.float32).reshape(shape)


# ---------------------------------------- the int8 format
# The challenge script's own rule for the tensors its int8 format keeps in fp32.
CONTROL_PATTERNS = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weight")


def quantize(state: dict[str, np.ndarray], dtypes: dict[str, str] | None = None) -> quant.Int8Model:
    """int8_format.quantize_int8 with the classes the challenge's name patterns give (control = fp32)."""
    classes = {n: "control" for n in state if any(c in n for c in CONTROL_PATTERNS)}
    return int8_format.quantize_int8(state, dtypes, classes)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def golden_state() -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Fixed weights (`ramp`) of every kind the int8 format stores."""
    state = {
        "tok_emb.weight": ramp((300, 256), 0.02, 2_654_435_761),
        "blocks.0.mlp.fc.weight": ramp((512, 160), 0.05, 40_503),
        "blocks.0.attn.q_gain": np.full(4, 1.5, np.float32),
        "extra.cube": ramp((20, 60, 60), 0.1, 97),
        "extra.bias": ramp((64,), 0.3, 13),
        "extra.step": np.array([7], np.int64),
    }
    return state, {"tok_emb.weight": "bfloat16"}


def equal_weights(a: quant.Int8Model, b: quant.Int8Model) -> bool:
    x, y = int8_format.dequantize_int8(a), int8_format.dequantize_int8(b)
    return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)


class RunsCode:
    """Unpickling this creates a directory: the harm a pickle can do."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (os.mkdir, (str(self.target),))


# ---------------------------------------- the mixed format's weights
def model_state() -> tuple[dict[str, np.ndarray], dict[str, str], dict[str, str]]:
    """(state, classes, orig_dtypes): a small model with every kind of tensor."""
    state = {
        "tok_emb.weight": ramp((300, 256), 2.0, 2_654_435_761),
        "blocks.0.attn.c_q.weight": ramp((272, 256), 1.5, 40_503),
        "blocks.0.mlp.fc.weight": ramp((264, 256), 3.0, 97),
        "blocks.0.mlp.proj.weight": ramp((256, 264), 3.0, 7919),
        "blocks.0.attn_scale": ramp((256,), 0.5, 13) + 1,
        "skip_weights": ramp((2, 40_000), 0.5, 3) + 1,  # a large control tensor: fp32 all the same
        "blocks.0.attn.q_gain": np.full(4, 1.5, np.float32),
        "extra.vector": ramp((70_000,), 2.0, 31),  # not a matrix: one scale
        "extra.small": ramp((8, 8), 0.1, 5),
        "step": np.array([7], np.int64),
    }
    classes = {
        "tok_emb.weight": "embedding",
        "blocks.0.attn.c_q.weight": "attention",
        "blocks.0.mlp.fc.weight": "mlp",
        "blocks.0.mlp.proj.weight": "mlp",
        "blocks.0.attn_scale": "control",
        "skip_weights": "control",
        "blocks.0.attn.q_gain": "control",
        "extra.vector": "other",
        "extra.small": "other",
        "step": "other",
    }
    return state, classes, {"tok_emb.weight": "bfloat16"}


# ---------------------------------------- GPTQ's Hessian
def hessian(inputs: np.ndarray) -> np.ndarray:
    """H = X^T X (float32) for inputs X of shape (..., cols): what a calibration pass sums per layer."""
    x = np.asarray(inputs, dtype=np.float32)
    x = x.reshape(-1, x.shape[-1])
    return x.T @ x


# ---------------------------------------- the lrzip program
NEEDS_LRZIP = pytest.mark.skipif(
    shutil.which("lrzip") is None, reason="the lrzip program is not installed (apt-get install lrzip)"
)


# ---------------------------------------- the artifact fit's run shape
# record_0401_tiny's artifact at a size the tests can afford: an embedding (1024 x 96) and MLP
# matrices (768 x 96) past the 65,536-value floor, GPTQ, a byte shuffle. One layer: each candidate
# the fits evaluate is quantized, compressed and scored, and a second layer would add 60% to each.
SHAPE = ["--num-layers", "1", "--model-dim", "96", "--mlp-mult", "8", "--iterations", "30",
         "--warmdown-iters", "10"]  # fmt: skip


ARTIFACT = ["--quant-format", "mixed", "--gptq-enabled", "--gptq-calibration-batches", "2",
            "--compressor", "lzma", "--byte-shuffle", "2", "--artifact-fit-tokens", "1024"]  # fmt: skip


# ---------------------------------------- a stand-in lrzip program
# A stand-in for the lrzip program: its stream header (b"LRZI", version, uint64 size) around the bytes
# as they are. FAKE_LRZIP=corrupt flips one byte when compressing; =hang never ends a decompression.
FAKE_LRZIP = """#!{python}
import os, sys, time
args = sys.argv[1:]
data = open(args[-1], "rb").read()
mode = os.environ.get("FAKE_LRZIP", "")
if "-d" in args:
    if mode == "hang":
        time.sleep(3600)
    body = data[14:]
else:
    body = bytearray(data)
    if mode == "corrupt":
        body[len(body) // 2] ^= 0x01
    body = b"LRZI\\x00\\x06" + len(data).to_bytes(8, "little") + bytes(body)
open(args[args.index("-o") + 1], "wb").write(body)
"""


# ---------------------------------------- a small int8 artifact
def small_artifact(path: Path, **renames: str) -> Path:
    """The int8 artifact of fresh `tiny` weights, some parameters renamed."""
    params = init_params(preset("tiny"))
    for old, new in renames.items():
        params[new] = params.pop(old)
    container.write_artifact(path, int8_format.artifact_bytes(int8_format.quantize_int8(params)), "zlib")
    return path


# ---------------------------------------- a smoke export
def export_smoke(path: Path, compressor: str = "zlib", tokenizer_path: str | None = None, **changes):
    """The artifact of fresh weights; with pergroup, of `tiny` ones (its embedding is big enough to be
    quantized, so that lrzip has a group to compress)."""
    cfg = preset("tiny" if compressor == "pergroup" else "smoke").replace(compressor=compressor, **changes)
    if tokenizer_path is not None:
        cfg = cfg.replace(tokenizer_path=tokenizer_path)
    return export_artifact(init_params(cfg), cfg, storage_dtypes(cfg, False), path, 0)


# ---------------------------------------- the challenge's export statistics of an int8 model (its torch script logs them)
def int8_stats(
    state: dict[str, np.ndarray], model: Int8Model, orig_dtypes: dict[str, str] | None = None
) -> dict[str, int]:
    """Counts and bytes of `model`, the int8 quantization of `state` (`orig_dtypes`: the dtype each
    weight had in the model, as given to quantize_int8): parameters, tensors (float ones quantized,
    non-float ones), the tensors' bytes in the model, and the bytes the int8 model stores."""
    orig_dtypes = orig_dtypes or {}
    arrays = {name: np.asarray(value) for name, value in state.items()}
    floats = {name for name, t in arrays.items() if np.issubdtype(t.dtype, np.floating)}
    baseline = sum(
        t.size * FLOAT_BYTES[orig_dtypes.get(name, t.dtype.name)] if name in floats else t.nbytes
        for name, t in arrays.items()
    )
    return {
        "param_count": int(sum(t.size for t in arrays.values())),
        "num_tensors": len(arrays),
        "num_float_tensors": len(model.quantized),
        "num_nonfloat_tensors": len(arrays) - len(floats),
        "baseline_tensor_bytes": int(baseline),
        "int8_payload_bytes": int(
            sum(a.nbytes for part in model_parts(model).values() for a in part.values())
        ),
    }


# ---------------------------------------- the artifact fit's stand-ins
NUMPY_CODE_BYTES = 40_000


def stand_in_loss(params):
    """The weights' squared distance to the float ones: a loss with no backend."""
    return lambda weights: float(sum(np.square(weights[n] - params[n]).sum() for n in params))
