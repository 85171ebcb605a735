"""Issue 14, one section per failure. Each section's tests fail on the code before its fix
(a traceback, a hang, a wrong acceptance), except the block-index test of section 3, which
guards a check that was there already, and the memory estimate's own tests."""

from __future__ import annotations

import functools
import importlib
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.artifact import container_v1, int8_format, upstream
from core.artifact import int8 as quant
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
from core.common.files import write_atomic
from core.config.fields import MAX_LAYERS, SEED_MAX
from core.config.presets import preset
from core.config.sources import load_file, resolve
from core.data.manifest import read_manifest
from core.data.shards import find_shards, read_shard
from core.data.tokenizer import load_tokenizer
from core.datasets.embedded import prepare_sotu
from core.eval.rows import evaluate
from core.eval.score import load_eval_data
from core.eval.verify import require_finite, verify
from core.model import backend as backends
from core.model.memory import DeviceMemory, check_config, check_memory, memory_estimate
from core.model.params import count_params, init_params
from core.train import loop
from core.train.loop import DIVERGENCE_AFTER_STEPS, WEIGHT_RMS_LIMIT, divergence
from core.train.rundir import RunDir
from tests.helpers import (
    BACKENDS,
    assert_one_line_error,
    cli,
    data_flags,
    make_backend,
    make_checkpoint,
    needs,
    rewrite_metadata,
    run_within,
)

H100 = DeviceMemory(80 * 2**30, "free memory of a test GPU", gpu=True)


# ------------------------------------------------- 1. seeds outside what the frameworks take
@pytest.mark.parametrize("seed", ["-1", str(2**64 + 1), str(SEED_MAX + 1)])
def test_seeds_out_of_range_are_refused_from_flags_env_and_toml(tmp_path, seed):
    toml = tmp_path / "c.toml"
    toml.write_text(f"seed = {seed}\n")
    for cfg in (
        resolve("smoke", overrides={"seed": seed}),
        resolve("smoke", environ={"SEED": seed}),
        resolve("smoke", file_path=toml, environ={}),
    ):
        with pytest.raises(PgolfError, match=f"seed must be in 0..{SEED_MAX}"):
            cfg.validate()
    assert load_file(toml)["seed"] == int(seed)


def test_a_config_file_that_never_ends_is_refused(tmp_path):
    with pytest.raises(PgolfError, match="cannot read /dev/zero: not a regular file"):
        load_file("/dev/zero")
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * 2**20)
    with pytest.raises(PgolfError, match="big.toml holds more than 1,048,576 bytes: not a config file"):
        load_file(big)


def test_the_ends_of_the_seed_range_are_accepted():
    for seed in (0, SEED_MAX):
        assert preset("smoke").replace(seed=seed).validate().seed == seed


# ------------------------------------------------- 2. configs that cannot fit any device
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_dim": 1_000_000_000}, "training needs about"),
        ({"train_batch_tokens": 1_073_741_824}, r"activations [\d,]+\.\d GiB"),
        ({"num_layers": 100_000_000}, f"num_layers must be at most {MAX_LAYERS}"),
    ],
)
def test_configs_that_cannot_fit_are_refused_before_anything_is_allocated(change, message):
    cfg = preset("baseline").replace(**change)
    with pytest.raises(PgolfError, match=message):
        cfg.validate()
        check_memory(cfg, H100)
    check_memory(cfg.replace(num_layers=9, memory_check=False), H100)  # the override


def test_the_published_configs_fit_an_80_gb_gpu_and_baseline_in_fp32_needs_more_than_16_gb():
    for name in ("baseline", "seq4096", "record_0401", "record_0427"):
        check_memory(preset(name), H100)
    with pytest.raises(PgolfError, match=r"but the test laptop is 16\.0 GiB"):
        check_memory(preset("baseline"), DeviceMemory(16 * 2**30, "test laptop", gpu=False))


@pytest.mark.parametrize("name", BACKENDS)
def test_each_backend_says_how_much_memory_its_device_has(name):
    module = importlib.import_module(f"{backends.BACKENDS[name].package}.memory")
    device = module.device_memory(preset("smoke"))
    assert device.bytes > 2**28 and device.what
    check_config(name, preset("smoke"))  # what train and bench call


def test_the_estimate_by_part():
    cfg = preset("tiny")
    parts = memory_estimate(cfg, bf16=False)
    assert parts["params"] == 8 * count_params(cfg)
    assert parts["total"] == parts["params"] + parts["optimizer"] + parts["activations"]
    # Activations grow with the tokens of one forward, halve (all but the logits) in bf16,
    # and stop at a micro-batch however large a sub-batch may be.
    micro = cfg.train_batch_tokens // cfg.grad_accum_steps
    half = memory_estimate(cfg, bf16=False, forward_tokens=micro // 2)["activations"]
    assert 2 * half == parts["activations"]
    assert memory_estimate(cfg, bf16=False, forward_tokens=10 * micro) == parts
    logits = micro * 3 * cfg.vocab_size * 4
    assert memory_estimate(cfg, bf16=True)["activations"] - logits == (parts["activations"] - logits) // 2


# ------------------------------------------------- 3. readers that trust nothing
def small_artifact(path: Path, **renames: str) -> Path:
    """The int8 artifact of fresh `tiny` weights, some parameters renamed."""
    params = init_params(preset("tiny"))
    for old, new in renames.items():
        params[new] = params.pop(old)
    quant.write_artifact(path, int8_format.artifact_bytes(int8_format.quantize_int8(params)), "zlib")
    return path


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
    monkeypatch.setattr(quant, "MAX_ARTIFACT_BYTES", 1000)
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
    payload, compressor, shuffle = compress.unpack(blob[len(quant.MAGIC) : -quant.DIGEST_BYTES])
    payload = bytearray(payload)
    change(payload)
    packed = compress.pack(bytes(payload), compressor, shuffle=shuffle)
    return quant.MAGIC + packed + blob[-quant.DIGEST_BYTES :]


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
    quant.write_artifact(tmp_path / "nan.pgolf", int8_format.artifact_bytes(model), "zlib")
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


# ------------------------------------------------- 7. divergence the softcap hides
def test_divergence_rules():
    cfg = preset("smoke")  # vocab 1024: uniform loss ln(1024) = 6.93
    calm = {"w": np.full(10, 0.03, np.float32)}
    after = DIVERGENCE_AFTER_STEPS
    assert divergence(cfg, after, 3.0, lambda: calm) is None
    assert divergence(cfg, after - 1, 7.5, lambda: calm) is None  # early steps may sit at ln(vocab)
    assert "above 6.9315" in divergence(cfg, after, 7.5, lambda: calm)
    assert "train_loss is nan" in divergence(cfg, 1, float("nan"), lambda: calm)
    exploded = {"w": np.full(10, 2 * WEIGHT_RMS_LIMIT, np.float32)}
    assert "the weights' RMS is 2e+03" in divergence(cfg, 1, 3.0, lambda: exploded)


@needs("cuda")
def test_a_huge_learning_rate_stops_the_run(sotu_dataset, tmp_path):
    """Muon at lr 1e6: the loss sits at ln(vocab) (the softcap keeps it finite) while the weights
    explode; the old check let the run train on and fail only when quantizing them."""
    cfg = sotu_dataset.config(out_dir=str(tmp_path), run_id="r", iterations=8, matrix_lr=1e6)
    backend = make_backend("cuda", cfg)
    try:
        with pytest.raises(
            PgolfError, match=r"training diverged: the weights' RMS is [\d.e+]+ .* at step 1;"
        ):
            loop.train(backend, log=lambda line: None)
    finally:
        backend.close()


# ------------------------------------------------- 8. data prepare, interrupted anywhere
class Interrupt(BaseException):
    """Stands for a kill at one file operation."""


@pytest.mark.slow  # ~4 s
def test_an_interrupted_prepare_always_leaves_a_listed_dataset_whole(tmp_path, monkeypatch):
    """An interruption at each file operation of a second `data prepare` in turn (and of a first
    one): every dataset the manifest lists is present with its shards, and the next prepare works."""
    prepare = functools.partial(prepare_sotu, vocab_size=512, limit_docs=20)
    prepare(tmp_path / "old")
    counted = {"n": 0, "at": -1}

    def interrupting(real):
        def operation(*args, **kwargs):
            counted["n"] += 1
            if counted["n"] == counted["at"]:
                raise Interrupt
            return real(*args, **kwargs)

        return operation

    for name in ("replace", "rename", "symlink"):
        monkeypatch.setattr(os, name, interrupting(getattr(os, name)))
    for root in (tmp_path / "old", tmp_path / "new"):
        at = 1
        while True:
            counted.update(n=0, at=at)
            try:
                prepare(root)
                break
            except Interrupt:
                pass
            for dataset in read_manifest(root)["datasets"]:
                folder = root / dataset["path"]
                assert [len(read_shard(f)) > 0 for s in ("val", "train") for f in find_shards(folder, s)]
            at += 1
        assert at > 5  # the tokenizer, the shards, the link and the manifest were each cut short
        counted["at"] = -1
        prepare(root)
        assert len(list((root / "datasets").iterdir())) == 2  # the link and the one folder it names


# ------------------------------------------------- 9. temp files, fsync, and naming what failed
def test_a_killed_writers_temp_files_are_removed_by_the_next_write(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f".a.bin.pgolf-{int(dead.stdout)}-x1y2.tmp"
    live = tmp_path / f".b.bin.pgolf-{os.getpid()}-x1y2.tmp"  # a writer still at work
    other = tmp_path / ".notes.tmp"  # not pgolf's
    for path in (stale, live, other):
        path.write_bytes(b"half")
    write_atomic(tmp_path / "c.bin", b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["c.bin", live.name, other.name])


def test_writes_are_synced_to_disk_before_and_after_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src, dst):
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    save_checkpoint(tmp_path / "c.safetensors", make_checkpoint())
    small_artifact(tmp_path / "a.pgolf")
    assert events == ["fsync file", "rename", "fsync folder"] * 2


def test_unreadable_folders_and_tokenizers_are_named_as_such(sotu_dataset, tmp_path, monkeypatch):
    real_listdir, real_open = os.listdir, os.open

    def denied(path, *args):
        if str(path) in (str(sotu_dataset.data_path), str(sotu_dataset.tokenizer_path)):
            raise PermissionError(13, "Permission denied", str(path))
        return (real_listdir if not args else real_open)(path, *args)

    monkeypatch.setattr(os, "listdir", denied)
    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(PgolfError, match=r"dataset folder .*sotu_sp1024: cannot read \(Permission denied\)"):
        find_shards(sotu_dataset.data_path, "train")
    with pytest.raises(
        PgolfError, match=r"tokenizer .*sotu_1024_bpe.model: cannot read \(Permission denied\)"
    ):
        load_tokenizer(sotu_dataset.tokenizer_path)


def test_a_full_disk_while_logging_names_the_file(tmp_path):
    run = RunDir(tmp_path, "r")
    for name in ("metrics.jsonl", "train.log"):
        (run.path / name).symlink_to("/dev/full")  # every write there fails with ENOSPC
    with pytest.raises(PgolfError, match=r"cannot write .*metrics.jsonl: No space left on device"):
        run.metric({"kind": "train"})
    with pytest.raises(PgolfError, match=r"cannot write .*train.log: No space left on device"):
        run.log_line("step:1")


# ------------------------------------------------- 1, 2 and 3 through the command line
@pytest.mark.slow  # ~4 s
def test_the_reported_commands_end_with_one_line(tmp_path):
    checks = [
        (["train", "--seed", "-1"], "seed must be in 0..4294967295"),
        (["train", "--model-dim", "1000000000"], "training needs about"),
        (["eval", "/dev/zero"], "not a regular file"),
    ]
    for args, fragment in checks:
        assert_one_line_error(cli(*args, "--backend", "cuda", "--data-path", str(tmp_path)), fragment)


@pytest.mark.slow  # ~5 s: a CLI eval
def test_an_artifact_without_a_checksum_is_scored_with_a_one_line_warning(sotu_dataset, tmp_path):
    blob = int8_format.artifact_bytes(int8_format.quantize_int8(init_params(preset("smoke"))))
    old = tmp_path / "old.pgolf"
    old.write_bytes(container_v1.MAGIC_V1 + blob[len(quant.MAGIC) : -quant.DIGEST_BYTES])
    done = cli("eval", str(old), "--backend", "cuda", "--preset", "smoke", *data_flags(sotu_dataset))
    assert done.returncode == 0 and "val_bpb:" in done.stdout, done.stderr
    assert done.stderr.splitlines() == [
        f"warning: {old} was written before pgolf's containers carried a checksum: damage to it cannot be "
        "detected (export it again to add one)"
    ]
