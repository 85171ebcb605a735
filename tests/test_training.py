"""The training driver end to end, with each backend, on the small real dataset."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.checkpoint import load_checkpoint
from core.loop import evaluate, load_eval_data, train
from core.quant import dequantize_int8, load_artifact
from core.runs import read_metrics
from core.shards import find_shards, read_shard
from tests.test_backends import BACKENDS, NEEDS, SMALL_LOOPS_LANES, make_backend

ROOT = Path(__file__).resolve().parent.parent


def run(
    dataset, backend_name, tmp_path, run_id="run", resume=None, preset="smoke", step_progress=None, **changes
):
    cfg = dataset.config(preset, out_dir=str(tmp_path), run_id=run_id, **changes)
    backend = make_backend(backend_name, cfg)
    try:
        return train(backend, resume=resume, log=lambda line: None, step_progress=step_progress)
    finally:
        backend.close()


def final_params(result) -> dict[str, np.ndarray]:
    (ckpt,) = sorted((result.run_dir / "checkpoints").glob("*.safetensors"))[-1:]
    return load_checkpoint(ckpt).params


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_run_writes_logs_checkpoint_and_a_scored_artifact(sotu_dataset, backend_name, tmp_path):
    steps = []
    result = run(
        sotu_dataset, backend_name, tmp_path, val_loss_every=2, step_progress=lambda *a: steps.append(a)
    )
    assert steps == [(1, 4), (2, 4), (3, 4), (4, 4), (4, 4)]  # each step, then "training is over"
    records = read_metrics(result.run_dir)
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4]
    assert [r["step"] for r in records if r["kind"] == "val"] == [0, 2, 4]
    (final,) = [r for r in records if r["kind"] == "final"]
    assert final["roundtrip_val_bpb"] == pytest.approx(result.roundtrip_val_bpb)
    assert (result.run_dir / "config.json").exists() and (result.run_dir / "train.log").exists()
    assert result.artifact_bytes == (result.run_dir / "final_model.int8.pgolf").stat().st_size > 0
    # int8 costs a little, not a lot.
    assert abs(result.roundtrip_val_bpb - result.val_bpb) < 0.02
    ckpt = load_checkpoint(result.run_dir / "checkpoints" / "step_000004.safetensors")
    assert ckpt.step == 4 and ckpt.backend == backend_name
    artifact = dequantize_int8(load_artifact(result.run_dir / "final_model.int8.pgolf"))
    assert artifact.keys() == ckpt.params.keys()


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_resuming_from_a_checkpoint_reproduces_the_uninterrupted_run(sotu_dataset, backend_name, tmp_path):
    whole = run(sotu_dataset, backend_name, tmp_path, "whole", iterations=6, checkpoint_every=3)
    resumed = run(
        sotu_dataset, backend_name, tmp_path, "resumed", iterations=6,
        resume=whole.run_dir / "checkpoints" / "step_000003.safetensors",
    )  # fmt: skip
    a, b = final_params(whole), final_params(resumed)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-6, err_msg=k)
    assert resumed.roundtrip_val_bpb == pytest.approx(whole.roundtrip_val_bpb, abs=1e-6)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_depth_recurrence_switches_on_schedule_resumes_and_is_scored_looped(
    sotu_dataset, backend_name, tmp_path
):
    """Looping from half of 6 steps: warmed up in both layouts, on at step 3, off again in a run
    resumed at step 2 (a new backend starts looped; the driver recomputes the state from the step),
    and the final score is that of the looped model."""
    changes = dict(
        SMALL_LOOPS_LANES, iterations=6, checkpoint_every=2, val_loss_every=2, enable_looping_at=0.5,
        warmup_steps=1,
    )  # fmt: skip
    whole = run(sotu_dataset, backend_name, tmp_path, "whole", **changes)
    log = (whole.run_dir / "train.log").read_text()
    assert "warmup_step:1/1" in log and "loop_warmup_step:1/1" in log
    assert log.count("layer_loop:enabled") == 1 and "layer_loop:enabled step:3 " in log
    checkpoint = whole.run_dir / "checkpoints" / "step_000002.safetensors"
    resumed = run(sotu_dataset, backend_name, tmp_path, "resumed", resume=checkpoint, **changes)
    a, b = final_params(whole), final_params(resumed)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-6, err_msg=k)
    vals = [
        {r["step"]: r["val_loss"] for r in read_metrics(result.run_dir) if r["kind"] == "val"}
        for result in (whole, resumed)
    ]
    assert vals[1] == pytest.approx({k: v for k, v in vals[0].items() if k >= 2}, abs=1e-6)

    cfg = sotu_dataset.config(**changes)
    backend = make_backend(backend_name, cfg)
    data = load_eval_data(cfg)

    def score(params, looping):
        backend.load_params(params)
        backend.set_looping(looping)
        return evaluate(backend, data)

    for step, looping in ((2, False), (4, True)):  # validations before the step's switch decision
        params = load_checkpoint(whole.run_dir / "checkpoints" / f"step_00000{step}.safetensors").params
        assert score(params, looping).val_loss == pytest.approx(vals[0][step], abs=1e-6), step
    final = dequantize_int8(load_artifact(whole.run_dir / "final_model.int8.pgolf"))
    for looping in (True, False):
        matches = score(final, looping).val_bpb == pytest.approx(whole.roundtrip_val_bpb, abs=1e-6)
        assert matches == looping


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_compile_warmup_steps_are_undone(sotu_dataset, backend_name, tmp_path):
    plain = run(sotu_dataset, backend_name, tmp_path, "plain", iterations=3)
    warmed = run(sotu_dataset, backend_name, tmp_path, "warmed", iterations=3, warmup_steps=2)
    a, b = final_params(plain), final_params(warmed)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("backend_name", BACKENDS[:1])  # the driver's clock; one backend is enough
def test_wallclock_cap_stops_early(sotu_dataset, backend_name, tmp_path):
    steps = []
    result = run(
        sotu_dataset, backend_name, tmp_path, iterations=100_000, max_wallclock_seconds=1.0, train_log_every=0,
        step_progress=lambda *a: steps.append(a),
    )  # fmt: skip
    assert 1 <= result.steps < 100_000
    # The expected total is where the cap will stop the run at the current pace, not 100,000.
    assert all(done <= total < 100_000 for done, total in steps) and steps[-1] == (result.steps, result.steps)
    log = (result.run_dir / "train.log").read_text()
    assert "stopping_early: wallclock_cap" in log and result.train_time_ms >= 1000.0


def unigram_bpb(dataset) -> float:
    """BPB of the best context-free model: training-set token frequencies scored on validation."""
    from core.bpb import BPBMeter
    from core.tokenizer import byte_tables, load_tokenizer

    train_ids = np.concatenate([read_shard(f) for f in find_shards(dataset.data_path, "train")])
    val = read_shard(find_shards(dataset.data_path, "val")[0]).astype(np.int64)
    counts = np.bincount(train_ids, minlength=dataset.vocab_size) + 1.0
    logp = np.log(counts / counts.sum())
    meter = BPBMeter(byte_tables(load_tokenizer(dataset.tokenizer_path), dataset.vocab_size))
    meter.add(-logp[val[1:]].sum(), val[:-1], val[1:])
    return meter.val_bpb


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend_name", "steps", "batch"),
    [  # MLX on a CPU is slower: fewer tokens
        pytest.param("cuda", 120, 8192, marks=NEEDS["cuda"], id="cuda"),
        pytest.param("mlx", 60, 4096, marks=NEEDS["mlx"], id="mlx"),
    ],
)
def test_tiny_preset_learns_clearly_better_than_unigram(sotu_dataset, backend_name, steps, batch, tmp_path):
    result = run(
        sotu_dataset, backend_name, tmp_path, preset="tiny", iterations=steps, train_batch_tokens=batch,
        warmdown_iters=steps // 3, val_loss_every=steps, val_max_tokens=32_768,
    )  # fmt: skip
    records = [r for r in read_metrics(result.run_dir) if r["kind"] == "val"]
    start, end = records[0]["val_bpb"], result.roundtrip_val_bpb
    assert start > 3.0  # untrained: ~log2(1024) = 10 bits per token, ~4.3 bytes per token
    assert end < start - 1.0
    assert end < unigram_bpb(sotu_dataset) - 0.3  # the best context-free model scores ~2.7


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launcher(backend_name: str) -> list[str]:
    """The framework's own launcher for two processes on this machine."""
    if backend_name == "cuda":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                "--master_addr=127.0.0.1"]  # fmt: skip
    mlx_launch = Path(sys.executable).parent / "mlx.launch"
    if not mlx_launch.exists():
        pytest.skip(f"{mlx_launch} not found")
    # The ring backend listens on two consecutive ports from --starting-port.
    return [str(mlx_launch), "-n", "2", "--backend", "ring", "--starting-port", str(free_port()), "--",
            sys.executable]  # fmt: skip


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_two_processes_match_one_process(sotu_dataset, backend_name, tmp_path):
    args = [
        "cli.py", "train", "--backend", backend_name, "--preset", "smoke", "--out-dir", str(tmp_path),
        "--data-path", str(sotu_dataset.data_path), "--tokenizer-path", str(sotu_dataset.tokenizer_path),
        "--iterations", "3",
    ]  # fmt: skip
    # Loopback only: gloo otherwise picks an interface from the host name, which can fail.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    outputs = {}
    for run_id, command in (("one", [sys.executable]), ("two", launcher(backend_name))):
        done = subprocess.run(
            [*command, *args, "--run-id", run_id],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        outputs[run_id] = done.stdout
    assert "world_size:2 grad_accum_steps:1" in outputs["two"]
    one = load_checkpoint(tmp_path / "one" / "checkpoints" / "step_000003.safetensors").params
    two = load_checkpoint(tmp_path / "two" / "checkpoints" / "step_000003.safetensors").params
    for k in one:  # same tokens, gradients averaged in a different order: fp32 round-off only
        np.testing.assert_allclose(two[k], one[k], rtol=0, atol=1e-5, err_msg=k)
