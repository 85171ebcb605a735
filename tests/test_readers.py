"""Readers that trust nothing: devices, FIFOs and oversized files refused, decompression bounded, damaged
weights and non-finite scores refused, a checkpoint's checksum covering its metadata."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from core.artifact import container, int8_format, upstream
from core.artifact.checkpoint import save_checkpoint, tensors_digest
from core.artifact.load import (
    config_for_params,
    is_checkpoint,
    load_checkpoint,
    load_mixed_artifact,
    load_weights,
)
from core.common import compress
from core.common.errors import PgolfError
from core.config.fields import MAX_LAYERS
from core.config.presets import preset
from core.data.shards import read_shard
from core.data.tokenizer import load_tokenizer
from core.eval.plain import evaluate
from core.eval.score import load_eval_data
from core.eval.verify import require_finite, verify
from core.model.params import init_params
from tests.support.artifacts import make_checkpoint, rewrite_metadata, small_artifact
from tests.support.fuzz import run_within

# ------------------------------------------------- 3. readers that trust nothing


READERS = {
    "artifact": upstream.load_artifact,
    "mixed artifact": load_mixed_artifact,
    "checkpoint": load_checkpoint,
    "shard": read_shard,
    "tokenizer": load_tokenizer,
}


@pytest.mark.parametrize("what", READERS)
def test_a_device_or_a_fifo_is_refused_at_once(tmp_path, what):
    fifo = tmp_path / ("fifo.model" if what == "tokenizer" else "fifo")
    os.mkfifo(fifo)

    def unblock() -> None:  # the old readers waited for a writer: give them one, with nothing to say
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    for path in (Path("/dev/zero") if what != "tokenizer" else None, fifo):
        if path is None:
            continue
        _, error = run_within(5, lambda p=path: READERS[what](p), unblock)
        assert isinstance(error, PgolfError) and "not a regular file" in str(error), error
    assert not is_checkpoint(fifo) and not is_checkpoint("/dev/zero")


def test_files_beyond_the_size_limits_are_refused_before_reading(tmp_path, monkeypatch):
    path = small_artifact(tmp_path / "a.pgolf")
    monkeypatch.setattr(container, "MAX_ARTIFACT_BYTES", 1000)
    with pytest.raises(PgolfError, match=r"a.pgolf is [\d,]+ bytes, over the limit of 1,000"):
        upstream.load_artifact(path)


def test_decompression_stops_at_its_limit(monkeypatch):
    monkeypatch.setattr(compress, "MAX_OUTPUT_BYTES", 10_000)
    for name in ("zlib", "lzma", "bz2", "brotli", "zstd", "none"):
        packed = compress.compress(bytes(20_000), name)
        with pytest.raises(ValueError, match="more than 10,000 bytes"):
            compress.decompress(packed, name)


def test_a_block_index_past_what_a_config_declares_is_refused_by_name(tmp_path):
    path = small_artifact(tmp_path / "a.pgolf", **{"blocks.3.attn.q_gain": "blocks.999999999.attn.q_gain"})
    with pytest.raises(PgolfError, match="a block index up to 999999999 among 42 tensors"):
        load_weights(path, preset("tiny"))
    shapes = {f"blocks.{i}.w": (1,) for i in range(MAX_LAYERS + 1)} | {"tok_emb.weight": (8, 8)}
    with pytest.raises(PgolfError, match=f"at most {MAX_LAYERS} layers"):
        config_for_params(preset("tiny"), shapes)
    for bad in ("blocks.x.attn.q_gain", "blocks.٣.attn.q_gain", "blocks..attn"):
        with pytest.raises(PgolfError, match="layout of pgolf's GPT"):
            config_for_params(preset("tiny"), {"tok_emb.weight": (8, 8), bad: (1,)})


# ------------------------------------------------- 4. damaged weights and non-finite scores
def repacked(blob: bytes, change) -> bytes:
    """`blob` with its payload changed by change(bytearray) and compressed again, the checksum kept:
    what damage inside the payload looks like when the compressor's own checks cannot see it."""
    payload, compressor, shuffle = compress.unpack(blob[len(container.MAGIC) : -container.DIGEST_BYTES])
    payload = bytearray(payload)
    change(payload)
    packed = compress.pack(bytes(payload), compressor, shuffle=shuffle)
    return container.MAGIC + packed + blob[-container.DIGEST_BYTES :]


def test_weights_changed_inside_the_payload_are_refused(tmp_path):
    path = small_artifact(tmp_path / "a.pgolf")
    blob = path.read_bytes()

    def flip_last_byte(payload: bytearray) -> None:  # a byte of the last tensor's data
        payload[-1] ^= 0x01

    path.write_bytes(repacked(blob, flip_last_byte))
    with pytest.raises(PgolfError, match="does not match its checksum"):
        upstream.load_artifact(path)


def test_a_nan_scale_is_refused_when_read(tmp_path):
    model = int8_format.quantize_int8(init_params(preset("tiny")))
    name = next(iter(model.scales))
    model.scales[name] = np.full_like(model.scales[name], np.nan)
    container.write_artifact(tmp_path / "nan.pgolf", int8_format.artifact_bytes(model), "zlib")
    with pytest.raises(PgolfError, match=f"{re.escape(name)} holds NaN or infinite values"):
        upstream.load_artifact(tmp_path / "nan.pgolf")


class NanBackend:
    """Just enough of a backend for `evaluate` and `verify`: every loss is NaN."""

    name, device, rank, world_size = "nan", "cpu", 0, 1

    def __init__(self, cfg):
        self.cfg = cfg

    def load_params(self, params):
        pass

    def eval_nll(self, x, y):
        return float("nan")

    def logits(self, x):
        return np.zeros((*x.shape, self.cfg.vocab_size), np.float32)

    def all_reduce_sum(self, values):
        return values

    def close(self, failed=False):
        return None


def test_a_score_that_is_not_finite_is_an_error_in_eval_and_verify(sotu_dataset):
    cfg = sotu_dataset.config()
    data = load_eval_data(cfg)
    with pytest.raises(PgolfError, match=r"eval of x: the score is not finite \(val_loss nan"):
        require_finite(evaluate(NanBackend(cfg), data), "eval of x")
    with pytest.raises(PgolfError, match="the nan backend's plain score: the score is not finite"):
        verify({}, cfg, data, {"nan": NanBackend})


# ------------------------------------------------- 5. the checkpoint's checksum covers its metadata
@pytest.mark.parametrize(
    "change",
    [
        lambda m: {**m, "step": m["step"] + 1},
        lambda m: {**m, "train_time_ms": 0.0},
        lambda m: {**m, "data_state": {**m["data_state"], "position": 0}},
        lambda m: {**m, "config": {**m["config"], "matrix_lr": 1.0}},
        lambda m: {**m, "version": 1},
    ],
)
def test_changed_metadata_is_refused(tmp_path, change):
    path = save_checkpoint(tmp_path / "c.safetensors", make_checkpoint())
    rewrite_metadata(path, change, sign=False)
    with pytest.raises(PgolfError, match="does not match its checksum"):
        load_checkpoint(path)


def test_a_checkpoint_without_its_checksum_is_refused(tmp_path):
    path = save_checkpoint(tmp_path / "c.safetensors", make_checkpoint())
    rewrite_metadata(path, lambda m: {k: v for k, v in m.items() if k != "sha256"}, sign=False)
    with pytest.raises(PgolfError, match="has no checksum"):
        load_checkpoint(path)


def test_a_version_1_checkpoint_loads_with_a_warning(tmp_path):
    ckpt = make_checkpoint()
    path = save_checkpoint(tmp_path / "c.safetensors", ckpt)
    tensors = {f"param/{k}": v for k, v in ckpt.params.items()} | {
        f"opt/{k}": v for k, v in ckpt.optimizer.items()
    }
    rewrite_metadata(path, lambda m: {**m, "version": 1, "sha256": tensors_digest(tensors)}, sign=False)
    with pytest.warns(UserWarning, match="only its tensors are checked"):
        assert load_checkpoint(path).step == ckpt.step


def test_non_finite_weights_in_a_checkpoint_are_refused(tmp_path):
    ckpt = make_checkpoint()
    ckpt.params["skip_weights"][0, 0] = np.inf
    path = save_checkpoint(tmp_path / "c.safetensors", ckpt)
    with pytest.raises(PgolfError, match="skip_weights holds NaN or infinite values"):
        load_checkpoint(path)
