"""bench/gpu_check.py, the acceptance check for a lent GPU, in its dry run on the CPU: every part runs at
a tiny shape (or is reported skipped where it needs a GPU), and both report files come out, so the
script is known to work before the few minutes a GPU is lent."""

from __future__ import annotations

import json
import subprocess
import sys
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
