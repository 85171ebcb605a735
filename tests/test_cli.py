"""The command line: the main commands work, and bad input is one clear line and a non-zero exit."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.shards import find_shards
from tests.test_backends import BACKENDS, needs

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def data_flags(dataset) -> list[str]:
    return ["--data-path", str(dataset.data_path), "--tokenizer-path", str(dataset.tokenizer_path)]


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def trained(sotu_dataset, tmp_path_factory):
    """One short smoke run through the CLI; its run directory."""
    out = tmp_path_factory.mktemp("runs")
    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--out-dir", str(out), "--run-id", "r",
                 *data_flags(sotu_dataset))  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out / "r", result.stdout


def roundtrip_bpb(stdout: str) -> float:
    return float(re.search(r"final_int8_roundtrip_exact val_loss:\S+ val_bpb:(\S+)", stdout).group(1))


@needs("cuda")
def test_train_prints_the_score_and_the_budget(trained):
    run_dir, stdout = trained
    assert "final_int8_roundtrip" in stdout and "budget:16000000 (fits)" in stdout
    assert (run_dir / "final_model.int8.pgolf").is_file()


@needs("cuda")
@pytest.mark.parametrize("backend", BACKENDS)
def test_eval_of_the_artifact_gives_the_training_score(sotu_dataset, trained, backend):
    run_dir, stdout = trained
    result = cli("eval", str(run_dir / "final_model.int8.pgolf"), "--backend", backend, "--preset", "smoke",
                 *data_flags(sotu_dataset))  # fmt: skip
    assert result.returncode == 0, result.stderr
    got = float(re.search(r"val_bpb:(\S+)", result.stdout).group(1))
    assert got == pytest.approx(roundtrip_bpb(stdout), abs=1e-6)


@needs("cuda")
def test_export_upstream_then_eval_and_verify(sotu_dataset, trained, tmp_path):
    run_dir, stdout = trained
    ckpt = sorted((run_dir / "checkpoints").glob("*.safetensors"))[-1]
    ptz = tmp_path / "final_model.int8.ptz"
    result = cli("export", str(ckpt), "--format", "upstream", "--out", str(ptz))
    assert result.returncode == 0, result.stderr
    assert "total_bytes" in result.stdout and ptz.is_file()
    evaluated = cli("eval", str(ptz), "--backend", "cuda", "--preset", "smoke", *data_flags(sotu_dataset))
    assert float(re.search(r"val_bpb:(\S+)", evaluated.stdout).group(1)) == pytest.approx(
        roundtrip_bpb(stdout), abs=1e-6
    )
    verified = cli("verify", str(ptz), "--preset", "smoke", *data_flags(sotu_dataset))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "backends agree" in verified.stdout


def test_unknown_flag_is_a_usage_error():
    result = cli("train", "--matrx-lr", "0.1")
    assert result.returncode == 2 and "No such option" in result.stderr and "Traceback" not in result.stderr


def test_unknown_config_key_in_a_file(tmp_path):
    (tmp_path / "run.toml").write_text("matrx_lr = 0.1\n")
    assert_one_line_error(cli("train", "--config", str(tmp_path / "run.toml")), "unknown key 'matrx_lr'")


def test_bad_flag_value():
    assert_one_line_error(cli("train", "--preset", "huge"), "unknown preset 'huge'")
    assert_one_line_error(cli("train", "--backend", "tpu"), "unknown backend 'tpu'")


@needs("cuda")
def test_malformed_shard(sotu_dataset, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in find_shards(sotu_dataset.data_path, "train") + find_shards(sotu_dataset.data_path, "val"):
        (broken / f.name).write_bytes(f.read_bytes())
    val = broken / "fineweb_val_000000.bin"
    val.write_bytes(val.read_bytes()[:-7])
    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--out-dir", str(tmp_path),
                 "--data-path", str(broken), "--tokenizer-path", str(sotu_dataset.tokenizer_path))  # fmt: skip
    assert_one_line_error(result, "fineweb_val_000000.bin", "header promises")


@needs("cuda")
def test_shards_and_tokenizer_of_different_vocabularies(sotu_dataset, challenge_dir, tmp_path):
    runs = tmp_path / "runs"
    # A vocabulary flag that disagrees with the tokenizer...
    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--vocab-size", "512",
                 "--out-dir", str(runs), *data_flags(sotu_dataset))  # fmt: skip
    assert_one_line_error(result, "has 1024 pieces but vocab_size is 512")
    # ...and shards whose ids exceed the tokenizer's vocabulary.
    wide = tmp_path / "wide"
    wide.mkdir()
    from core.shards import write_shard

    write_shard(wide / "fineweb_val_000000.bin", np.arange(2000) % 2000)
    write_shard(wide / "fineweb_train_000000.bin", np.arange(2000) % 2000)
    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--data-path", str(wide), "--out-dir",
                 str(runs), "--tokenizer-path", str(challenge_dir / "fineweb_1024_bpe.model"))  # fmt: skip
    assert_one_line_error(result, "fineweb_val_000000.bin", "do not match the tokenizer vocabulary")
    assert not runs.exists(), "a refused run left a run directory behind"


@needs("cuda")
def test_a_run_directory_is_never_reused(sotu_dataset, trained):
    run_dir, _ = trained
    before = (run_dir / "metrics.jsonl").read_bytes()
    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--out-dir", str(run_dir.parent),
                 "--run-id", run_dir.name, *data_flags(sotu_dataset))  # fmt: skip
    assert_one_line_error(result, str(run_dir), "already holds a run")
    assert (run_dir / "metrics.jsonl").read_bytes() == before


@needs("cuda")
def test_tampered_and_truncated_artifacts(sotu_dataset, trained, tmp_path):
    run_dir, _ = trained
    blob = (run_dir / "final_model.int8.pgolf").read_bytes()
    for name, damaged in [
        ("truncated.pgolf", blob[: len(blob) // 3]),
        ("tampered.pgolf", blob[:40] + b"\x00" * 64 + blob[104:]),
    ]:
        path = tmp_path / name
        path.write_bytes(damaged)
        result = cli("eval", str(path), "--backend", "cuda", "--preset", "smoke", *data_flags(sotu_dataset))
        assert_one_line_error(result, name)


@needs("cuda")
def test_runs_lists_the_run_and_plot_draws_it(trained, tmp_path):
    run_dir, stdout = trained
    listed = cli("runs", "--out-dir", str(run_dir.parent))
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.strip("│ ").startswith("r "))
    assert f"{roundtrip_bpb(stdout):.4f}" in row
    pytest.importorskip("matplotlib")
    drawn = cli("plot", str(run_dir), "--out", str(tmp_path / "c.png"))
    assert drawn.returncode == 0, drawn.stderr
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_one_line_error(cli("plot", str(tmp_path), "--out", str(tmp_path / "d.png")), "not a run directory")
    assert_one_line_error(cli("runs", "--out-dir", str(tmp_path / "none")), "no such directory of runs")


def test_info_and_help_work():
    assert "auto backend" in cli("info").stdout
    assert "--matrix-lr" in cli("train", "--help").stdout
