"""bench/gpu_check.py, the acceptance check for a lent GPU, in its dry run on the CPU: every part runs at
a tiny shape (or is reported skipped where it needs a GPU), and both report files come out, so the
script is known to work before the few minutes a GPU is lent."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"


def gpu_check(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.slow  # six parts, each a process importing torch, and two training runs: ~40 s on 2 cores
@pytest.mark.torch
def test_the_dry_run_runs_every_part_and_writes_both_reports(sotu_dataset, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "out"
    done = gpu_check(
        str(out), "--dry-run", "--data-root", str(sotu_dataset.root), "--work", str(tmp_path / "w")
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "gpu_check.json").read_text())
    parts = report["parts"]
    assert list(parts) == ["env", "compile", "record", "baseline", "verify", "tests"]
    assert report["dry_run"] and all(p["status"] == "ok" for p in parts.values()), parts
    assert parts["env"]["cuda_available"] is False and parts["env"]["torch"]
    compiled = parts["compile"]
    assert compiled["graphs_at_warmup"] > 0  # the counters see dynamo's graphs ...
    assert compiled["graph_breaks"] == 0 and compiled["recompiles_after_warmup"] == 0  # ... and none after
    assert compiled["explain"]["graph_breaks"] == 0 and compiled["explain"]["graphs"] == 1
    record = parts["record"]
    assert record["ms_per_step"] > 0 and record["flops_per_token"] > 0
    assert record["attention"] == ["SDPA flash (CPU)"]  # read off the profile of a real step
    baseline = parts["baseline"]
    assert baseline["figures"]["pgolf"]["ms_per_step"] > 0 and baseline["figures"]["pgolf"]["val_bpb"] > 0
    assert baseline["challenge_skipped"] == "no --challenge-script given"
    verified = parts["verify"]
    assert verified["agree"] and "torch-cpu" in verified["scores"]
    assert parts["tests"]["collected"] > 10  # the cuda marker selects tests
    table = (out / "gpu_check.md").read_text()
    for name, part in parts.items():
        assert f"| {name} | ok |" in table and part["summary"].replace("|", "\\|") in table
    assert "===== part_baseline.log" in (out / "gpu_check.log").read_text()


@pytest.mark.slow  # three processes importing torch: ~10 s of CPU
@pytest.mark.torch
def test_a_failing_part_is_one_line_and_the_next_part_runs(tmp_path):
    """A data folder whose files are garbage: the baseline part fails with pgolf's own error line, verify
    (which needs its artifact) is skipped, both files are written, and the exit status says it failed."""
    pytest.importorskip("torch")
    data = tmp_path / "data"
    (data / "datasets" / "sotu_sp1024").mkdir(parents=True)
    (data / "datasets" / "sotu_sp1024" / "fineweb_val_000000.bin").write_bytes(b"not a shard")
    (data / "tokenizers").mkdir()
    (data / "tokenizers" / "sotu_1024_bpe.model").write_bytes(b"not a tokenizer")
    out = tmp_path / "out"
    done = gpu_check(str(out), "--dry-run", "--only", "baseline,verify", "--data-root", str(data))
    assert done.returncode == 1
    parts = json.loads((out / "gpu_check.json").read_text())["parts"]
    assert parts["baseline"]["status"] == "failed" and "error:" in parts["baseline"]["summary"]
    assert "Traceback" not in parts["baseline"]["summary"]
    assert parts["verify"] == {**parts["verify"], "status": "skipped"}
    assert "no artifact" in parts["verify"]["summary"]
    assert "| baseline | failed |" in (out / "gpu_check.md").read_text()


def test_out_of_time_parts_are_skipped_and_a_bad_part_name_is_refused(tmp_path):
    done = gpu_check(str(tmp_path / "out"), "--budget", "0", "--only", "env,tests")
    assert done.returncode == 0, done.stderr
    parts = json.loads((tmp_path / "out" / "gpu_check.json").read_text())["parts"]
    assert [p["status"] for p in parts.values()] == ["skipped", "skipped"]
    assert parts["env"]["summary"].startswith("out of time")
    for flags, message in [
        (["--only", "nope"], "error: --only: no part nope"),
        (["--challenge-script", str(tmp_path / "absent.py")], "error: --challenge-script"),
        (["--budget", "soon"], "error: argument --budget: invalid float value"),
    ]:
        bad = gpu_check(str(tmp_path / "out2"), *flags)
        assert bad.returncode == 2 and bad.stderr.startswith(message) and len(bad.stderr.splitlines()) == 1
    assert not (tmp_path / "out2").exists()


def load_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_runs_figures_are_read_off_its_log(tmp_path):
    """The lines both trainers print (pgolf prints the challenge's): the last step's step_avg, the peak
    memory and the round trip's val_bpb; a run that exits badly keeps its figures and says how it ended."""
    from argparse import Namespace

    check = load_script()
    lines = [
        "step:1/200 train_loss:6.9312 train_time:410ms step_avg:410.00ms",
        "step:200/200 train_loss:3.1234 train_time:80123ms step_avg:400.62ms",
        "peak memory allocated: 10184 MiB reserved: 10500 MiB",
        "final_int8_zlib_roundtrip_exact val_loss:2.12345678 val_bpb:1.23456789",
    ]
    args = Namespace(work=tmp_path, deadline=time.time() + 60, dry_run=False)
    for code in (0, 3):
        cmd = [sys.executable, "-c", f"print({chr(10).join(lines)!r}); raise SystemExit({code})"]
        run = check._timed_run(cmd, None, tmp_path, args, f"run{code}")
        assert (run["step"], run["ms_per_step"], run["tokens_per_step"]) == (200, 400.62, 524_288)
        assert run["peak_memory_mib"] == 10184 and run["val_bpb"] == 1.23456789
        if code:
            assert run["error"] == "exit 3: " + lines[-1]
        else:
            assert "error" not in run
    silent = check._timed_run(
        [sys.executable, "-c", "print('error: no such dataset')"], None, tmp_path, args, "x"
    )
    assert (
        silent == {**silent, "error": "no step line: error: no such dataset"} and "ms_per_step" not in silent
    )


@pytest.mark.slow
def test_a_run_past_its_deadline_is_killed_with_what_it_started(tmp_path):
    """Its whole process group goes (a compile's workers, pytest's), and its last line is kept for the
    report: how far it got."""
    from argparse import Namespace

    check = load_script()
    started_child = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print('warm-up done, child', p.pid, flush=True); time.sleep(60)"
    )
    args = Namespace(work=tmp_path, deadline=time.time() + 3)
    run = check._run([sys.executable, "-c", started_child], None, tmp_path, args, "slow")
    assert run["timed_out"] and run["returncode"] == -1 and run["seconds"] < 30
    assert check._last_line(run["tail"]).startswith("warm-up done") and check._ending(run) == "timed out"
    status = Path(f"/proc/{run['tail'][-1].split()[-1]}/status")
    time.sleep(0.5)
    if status.exists():  # not yet reaped by whoever adopted it: then it must be a zombie
        assert "State:\tZ" in status.read_text()
