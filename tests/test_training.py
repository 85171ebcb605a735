"""The training driver end to end, with each backend, on the small real dataset."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from core.artifact.int8_format import dequantize_int8
from core.artifact.load import load_checkpoint
from core.artifact.upstream import load_artifact
from core.data.shards import find_shards, read_shard
from core.eval.plain import evaluate
from core.eval.score import load_eval_data
from core.runs.summary import read_metrics
from core.train.loop import train
from tests.support import ROOT
from tests.support.backends import (
    BACKENDS,
    NEEDS,
    SMALL_LOOPS_LANES,
    launcher,
    make_backend,
    mlx_launch,
    needs,
    run_ranks,
    torchrun_env,
)
from tests.support.cli import cli, data_flags, start_python
from tests.support.data import digest
from tests.support.runs import final_params, run


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS[:1])  # the loader is core's; one backend is enough
def test_the_coprime_loader_resumes_exactly_after_a_warmup(sotu_dataset, backend_name, tmp_path):
    common = {"iterations": 6, "train_loader": "coprime", "warmup_steps": 2}
    whole = run(sotu_dataset, backend_name, tmp_path, "whole", checkpoint_every=3, **common)
    ckpt = whole.run_dir / "checkpoints" / "step_000003.safetensors"
    state = load_checkpoint(ckpt).data_state
    assert state["loader"] == "coprime" and state["calls"] == 3 * 2  # 3 steps x 2 micro-batches
    resumed = run(sotu_dataset, backend_name, tmp_path, "resumed", resume=ckpt, **common)
    a, b = final_params(whole), final_params(resumed)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.slow  # ~4 s
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


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_compile_warmup_steps_are_undone(sotu_dataset, backend_name, tmp_path):
    plain = run(sotu_dataset, backend_name, tmp_path, "plain", iterations=3)
    warmed = run(sotu_dataset, backend_name, tmp_path, "warmed", iterations=3, warmup_steps=2)
    a, b = final_params(plain), final_params(warmed)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-6, err_msg=k)


@pytest.mark.slow
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
    from core.data.tables import byte_tables, token_bytes
    from core.data.tokenizer import load_tokenizer
    from core.eval.bpb import BPBMeter

    train_ids = np.concatenate([read_shard(f) for f in find_shards(dataset.data_path, "train")])
    val = read_shard(find_shards(dataset.data_path, "val")[0]).astype(np.int64)
    counts = np.bincount(train_ids, minlength=dataset.vocab_size) + 1.0
    logp = np.log(counts / counts.sum())
    meter = BPBMeter()
    meter.nats = float(-logp[val[1:]].sum())
    meter.count_bytes(
        token_bytes(
            val[:-1], val[1:], byte_tables(load_tokenizer(dataset.tokenizer_path), dataset.vocab_size)
        )
    )
    return meter.val_bpb


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend_name", "steps", "batch"),
    # PyTorch only: MLX's steps equal PyTorch's to 1e-4 (8-step curves, tests/test_cross_backend.py), and
    # its CPU steps are slower. 30 steps of 2,048 tokens clear both bounds below by a margin that a
    # different BLAS's round-off cannot take away, at a third of the cost of 40 steps of 4,096.
    [pytest.param("cuda", 30, 2048, marks=NEEDS["cuda"], id="cuda")],
)
def test_tiny_preset_learns_clearly_better_than_unigram(sotu_dataset, backend_name, steps, batch, tmp_path):
    result = run(
        sotu_dataset, backend_name, tmp_path, preset="tiny", iterations=steps, train_batch_tokens=batch,
        warmdown_iters=steps // 3, val_loss_every=steps, val_max_tokens=16_384,
    )  # fmt: skip
    records = [r for r in read_metrics(result.run_dir) if r["kind"] == "val"]
    start, end = records[0]["val_bpb"], result.roundtrip_val_bpb
    assert start > 3.0  # untrained: ~log2(1024) = 10 bits per token, ~4.3 bytes per token
    assert end < start - 1.0
    assert end < unigram_bpb(sotu_dataset) - 0.3  # the best context-free model scores ~2.7


# Three steps of one layer (no skip weights: an empty parameter), by one process and by two.
MATCHED = ["train", "--preset", "smoke", "--iterations", "3", "--num-layers", "1"]


def assert_two_match_one(one: Path, two: Path) -> None:
    """The two runs' last checkpoints: same tokens, gradients averaged in a different order (fp32 round-off)."""
    one = load_checkpoint(one / "checkpoints" / "step_000003.safetensors").params
    two = load_checkpoint(two / "checkpoints" / "step_000003.safetensors").params
    for k in one:
        np.testing.assert_allclose(two[k], one[k], rtol=0, atol=1e-5, err_msg=k)


@needs("mlx")
@pytest.mark.slow  # ~8 s
def test_two_processes_match_one_process(sotu_dataset, tmp_path):
    """MLX's own launcher, the one a user runs (elsewhere tests/mlx_ranks.py starts MLX's ranks); PyTorch's
    two ranks: test_torchrun_without_data_prepares_one_dataset_and_matches_one_process."""
    args = [*MATCHED, "--backend", "mlx", "--out-dir", str(tmp_path), *data_flags(sotu_dataset)]
    one = cli(*args, "--run-id", "one")
    two = subprocess.run([*mlx_launch(), str(ROOT / "cli.py"), *args, "--run-id", "two"], env=torchrun_env(),
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    for done in (one, two):
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "world_size:2 grad_accum_steps:1" in two.stdout
    assert_two_match_one(tmp_path / "one", tmp_path / "two")


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_the_moving_average_is_what_gets_exported(sotu_dataset, backend_name, tmp_path):
    from core.artifact.int8_format import quantize_int8
    from core.model.params import artifact_classes

    result = run(sotu_dataset, backend_name, tmp_path, ema_decay=0.5)
    ckpt = load_checkpoint(result.run_dir / "checkpoints" / "step_000004.safetensors")
    ema = {name: ckpt.optimizer[f"ema/{name}"] for name in ckpt.params}
    classes = artifact_classes(sotu_dataset.config(ema_decay=0.5))
    artifact = dequantize_int8(load_artifact(result.run_dir / "final_model.int8.pgolf"))
    from_ema = dequantize_int8(quantize_int8(ema, ckpt.dtypes, classes))
    from_live = dequantize_int8(quantize_int8(ckpt.params, ckpt.dtypes, classes))
    assert all(np.array_equal(artifact[k], from_ema[k]) for k in artifact)
    assert not all(np.array_equal(artifact[k], from_live[k]) for k in artifact)
    assert "ema val_loss:" in (result.run_dir / "train.log").read_text()


class DeviceScalar:
    """A framework's 0-d array, as core.train.loop sees it: added up lazily; each float() is a wait."""

    waits = 0

    def __init__(self, value: float):
        self.value = value

    def __add__(self, other):
        return DeviceScalar(self.value + (other.value if isinstance(other, DeviceScalar) else other))

    __radd__ = __add__

    def __float__(self) -> float:
        DeviceScalar.waits += 1
        return float(self.value)


def test_evaluation_waits_for_the_device_once(sotu_dataset):
    """The losses stay on the device until the end of the pass; the bytes are counted from the tokens."""
    from core.data.tables import token_bytes
    from core.eval.plain import evaluate
    from core.eval.score import load_eval_data

    cfg = sotu_dataset.config("smoke")
    batches = []

    class Backend:
        rank, world_size = 0, 1

        def __init__(self):
            self.cfg = cfg

        def eval_nll(self, x, y):
            batches.append((x, y, float(len(batches) + 1)))
            return DeviceScalar(batches[-1][2])

        def all_reduce_sum(self, values):
            return values

    DeviceScalar.waits = 0
    data = load_eval_data(cfg)
    meter = evaluate(Backend(), data)
    assert len(batches) > 2 and DeviceScalar.waits == 1
    assert meter.nats == sum(nll for _, _, nll in batches)
    assert meter.tokens == sum(y.size for _, y, _ in batches)
    assert meter.nbytes == sum(int(token_bytes(x, y, data.tables).sum()) for x, y, _ in batches)


@pytest.mark.slow
@needs("cuda")
def test_two_compiled_processes_with_two_micro_batches_each_under_a_cap(sotu_dataset, tmp_path):
    """DDP around the compiled model, `no_sync` on the first micro-batch, the clock agreed under a cap.

    The tiny preset with 1 of its 4 layers, compiled with aot_eager (`--compile-backend`): dynamo's graphs,
    DDP's split of them and AOT autograd as a run makes them, without inductor's code generation (two ranks
    compiling it from a cold cache took ~50 s here; its numbers are test_compiled_step_equals_eager's).
    """
    args = [
        str(ROOT / "cli.py"), "train", "--backend", "cuda", "--preset", "tiny", "--num-layers", "1", "--compile", "on",
        "--compile-backend", "aot_eager",
        "--grad-accum-steps", "4", "--iterations", "1000", "--max-wallclock-seconds", "1", "--warmup-steps", "1",
        "--val-loss-every", "0", "--val-max-tokens", "8192", "--out-dir", str(tmp_path), "--run-id", "r",
        "--data-path", str(sotu_dataset.data_path), "--tokenizer-path", str(sotu_dataset.tokenizer_path),
    ]  # fmt: skip
    done = run_ranks("cuda", *args)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "world_size:2 grad_accum_steps:2" in done.stdout
    assert "stopping_early: wallclock_cap" in done.stdout
    assert load_checkpoint(sorted((tmp_path / "r" / "checkpoints").glob("*.safetensors"))[-1]).step < 1000


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie has ended; only its parent has not read its status yet


def run_until_a_rank_fails(tmp_path, sotu_dataset, fault, **env: str):
    """Start a long two-rank run; once rank 0 has logged step 2, call `fault(pids)`; return the
    exit status, the whole output and the seconds from the fault to the end of every process."""
    args = [
        str(ROOT / "tests" / "torchrun_cli.py"), "train", "--backend", "cuda", "--preset", "smoke", "--iterations", "100000",
        "--out-dir", str(tmp_path / "runs"), "--data-path", str(sotu_dataset.data_path),
        "--tokenizer-path", str(sotu_dataset.tokenizer_path),
    ]  # fmt: skip
    process = start_python(*launcher("cuda")[1:], *args, env=torchrun_env(TEST_PID_DIR=str(tmp_path), **env),
                           merged=True, own_session=True)  # fmt: skip
    try:
        output = []
        for line in process.stdout:
            output.append(line)
            if line.startswith("step:2/"):
                break
        pids = [int((tmp_path / f"rank{rank}.pid").read_text()) for rank in (0, 1)]
        started = time.monotonic()
        fault(pids)
        # Read on through the same lines: communicate() would read the pipe underneath them and lose
        # what the line iteration above had already buffered.
        watchdog = threading.Timer(120, os.killpg, (process.pid, signal.SIGKILL))
        watchdog.start()
        try:
            output.extend(process.stdout)
            process.wait(timeout=60)
        finally:
            watchdog.cancel()
        while any(alive(pid) for pid in pids) and time.monotonic() < started + 120:
            time.sleep(0.1)
        return process.returncode, "".join(output), time.monotonic() - started
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=60)


@pytest.mark.slow
@needs("cuda")
def test_a_rank_that_raises_ends_every_rank_and_is_reported_once(sotu_dataset, tmp_path):
    message = "injected fault in rank 1"
    code, output, seconds = run_until_a_rank_fails(
        tmp_path, sotu_dataset, lambda pids: None,
        TEST_FAIL_RANK="1", TEST_FAIL_STEP="3", TEST_FAIL_MESSAGE=message,
    )  # fmt: skip
    assert code != 0 and seconds < 30, (code, seconds, output[-3000:])
    assert output.count(message) == 1, output[-3000:]  # its traceback, from rank 1 only
    assert "[rank0]: Traceback" not in output, output[-3000:]


@pytest.mark.slow
@needs("cuda")
def test_sigterm_to_one_rank_ends_every_rank(sotu_dataset, tmp_path):
    code, output, seconds = run_until_a_rank_fails(
        tmp_path, sotu_dataset, lambda pids: os.kill(pids[1], signal.SIGTERM)
    )
    assert code != 0 and seconds < 30, (code, seconds, output[-3000:])
    assert output.count("[rank1]: terminated") == 1, output[-3000:]
    assert "Traceback (most recent call last):\n[rank" not in output and "[rank0]: Traceback" not in output


@pytest.mark.slow
@needs("cuda")
def test_sigterm_ends_a_rank_stuck_in_a_collective(sotu_dataset, tmp_path):
    """Rank 1 hangs; rank 0 waits for it inside DDP's all-reduce, where Python cannot run its SIGTERM
    handler: the grace thread ends it 5 s after the signal, and torchrun then stops rank 1."""

    def stop_rank_0(pids):
        time.sleep(2)  # rank 0 is in step 3's all-reduce by now
        os.kill(pids[0], signal.SIGTERM)

    code, output, seconds = run_until_a_rank_fails(
        tmp_path, sotu_dataset, stop_rank_0, TEST_FAIL_RANK="1", TEST_FAIL_STEP="3", TEST_STALL_SECONDS="300"
    )
    assert code != 0 and 5 <= seconds < 30, (code, seconds, output[-3000:])
    assert "[rank0]" not in output, output[-3000:]  # it never left the all-reduce: the grace thread ended it


@pytest.mark.slow
@needs("cuda")
def test_torchrun_without_data_prepares_one_dataset_and_matches_one_process(sotu_dataset, tmp_path):
    """Only local rank 0 builds the default dataset; it is the one the fixture builds, byte for byte; and
    the two ranks' steps on it are one process's on the fixture's. torchrun's own ranks, fresh
    interpreters, as a user's are (the other two-rank tests fork theirs: tests/torchrun_forked.py)."""
    from core.data.manifest import read_manifest

    here = tmp_path / "here"
    here.mkdir()
    args = [*MATCHED, "--backend", "cuda", "--out-dir", str(tmp_path)]
    one = cli(*args, "--run-id", "one", *data_flags(sotu_dataset))
    assert one.returncode == 0, one.stderr[-2000:]
    done = run_ranks("cuda", str(ROOT / "tests" / "torchrun_cli.py"), *args, "--run-id", "two", cwd=here,
                     fresh_ranks=True, TEST_CORPUS_DOCS="40")  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.count("No dataset yet") == 1 and "world_size:2 grad_accum_steps:1" in done.stdout
    data = here / "data"
    assert sorted(p.name for p in data.iterdir()) == ["datasets", "manifest.json", "tokenizers"]  # no staging
    assert [d["name"] for d in read_manifest(data)["datasets"]] == ["sotu_sp1024"]
    built, expected = digest(data), digest(sotu_dataset.root)  # every file's sha256, by path
    built.pop("manifest.json"), expected.pop("manifest.json")
    assert built == expected
    assert_two_match_one(tmp_path / "one", tmp_path / "two")


@needs("cuda")
def test_metrics_are_mirrored_to_tensorboard(sotu_dataset, tmp_path):
    pytest.importorskip("tensorboardX")
    from tensorboardX.proto.event_pb2 import Event

    result = run(sotu_dataset, "cuda", tmp_path, report_to="tensorboard", val_loss_every=2)
    (events,) = (result.run_dir / "tensorboard").glob("events.out.tfevents.*")
    blob, scalars = events.read_bytes(), {}
    while blob:  # TFRecord: length (8 bytes), its CRC (4), the Event, its CRC (4)
        n = int.from_bytes(blob[:8], "little")
        event = Event.FromString(blob[12 : 12 + n])
        blob = blob[16 + n :]
        for value in event.summary.value:
            if value.HasField("simple_value"):
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    records = read_metrics(result.run_dir)
    trains = [r for r in records if r["kind"] == "train"]
    assert [s for s, _ in scalars["train/train_loss"]] == [r["step"] for r in trains] == [1, 2, 3, 4]
    assert [v for _, v in scalars["train/train_loss"]] == pytest.approx([r["train_loss"] for r in trains])
    assert [s for s, _ in scalars["val/val_bpb"]] == [0, 2, 4]
    ((step, score),) = scalars["final/roundtrip_val_bpb"]
    assert step == 4 and score == pytest.approx(result.roundtrip_val_bpb, rel=1e-6)


def test_an_unknown_or_missing_tracker_is_refused_by_name(monkeypatch):
    from core.common.errors import PgolfError
    from core.train import report

    with pytest.raises(PgolfError, match="unknown tracker 'tensorbord' \\(did you mean 'tensorboard'\\?\\)"):
        report.report_targets("tensorbord")
    monkeypatch.setitem(
        report.TRACKERS, "tensorboard", ("json", "")
    )  # installed or not, it is not the one missing
    monkeypatch.setitem(report.TRACKERS, "wandb", ("no_such_module_here", "pip install wandb"))
    with pytest.raises(
        PgolfError, match="report_to wandb needs the no_such_module_here package: pip install wandb"
    ):
        report.report_targets("tensorboard, wandb")
    assert report.report_targets("") == []


@needs("cuda")
def test_timed_checkpoints_replace_each_other(sotu_dataset, tmp_path, monkeypatch):
    from core.train import loop, managed

    clock = iter(range(0, 10**9, 61))  # perf_counter in seconds: each reading a minute after the one before
    monkeypatch.setattr(loop.time, "perf_counter", lambda: float(next(clock)))
    written = []
    monkeypatch.setattr(
        managed, "save_checkpoint", lambda path, ckpt: written.append(path) or path.write_bytes(b"x")
    )
    result = run(sotu_dataset, "cuda", tmp_path, iterations=8, checkpoint_minutes=1.0, checkpoint_every=5)
    steps = [int(p.stem.removeprefix("step_")) for p in written]
    timed = [s for s in steps if s not in (5, 8)]
    assert len(timed) >= 2 and steps[-1] == 8 and 5 in steps  # the clock ran fast: several timed ones
    kept = sorted(
        int(p.stem.removeprefix("step_")) for p in (result.run_dir / "checkpoints").glob("*.safetensors")
    )
    assert kept == sorted({5, timed[-1], 8})  # each timed checkpoint replaced the one before


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_packaged_runs_training_writes_no_checkpoint_and_checks_the_weights_after_the_last_step(
    sotu_dataset, backend_name, tmp_path, monkeypatch
):
    """`Training` alone (what a packaged train_gpt.py runs) writes no checkpoint, whatever checkpoint_every
    and checkpoint_minutes say; after the last step it still stops a run whose weights passed the limit,
    before the export, with the one line pgolf's `train` gives there."""
    from core.common.errors import PgolfError
    from core.train import loop

    def plain_run(run_id: str, **changes):
        cfg = sotu_dataset.config(
            "smoke", out_dir=str(tmp_path), run_id=run_id, iterations=3, checkpoint_every=1,
            checkpoint_minutes=1e-9, **changes,
        )  # fmt: skip
        backend = make_backend(backend_name, cfg)
        try:
            return train(backend, log=lambda line: None)
        finally:
            backend.close()

    result = plain_run("plain")
    assert result.steps == 3 and (result.run_dir / "final_model.int8.pgolf").is_file()
    assert not list(result.run_dir.rglob("*.safetensors"))
    # No training log line and no validation before the end: the weights are checked there alone.
    monkeypatch.setattr(loop, "WEIGHT_RMS_LIMIT", 1e-6)
    with pytest.raises(
        PgolfError,
        match=r"^training diverged: the weights' RMS is \S+ at step 3 \(the limit is 1e-06\); no checkpoint written;",
    ):
        plain_run("diverged", train_log_every=0, val_loss_every=0)
    assert not list((tmp_path / "diverged").glob("final_model.*"))
