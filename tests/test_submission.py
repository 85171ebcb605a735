"""What a submission must satisfy, checked: the byte cap (train's exit status 3, package's refusal, the
packaged script's own), the evaluation time, the records folder's files and fields, the data each seed
trained on, the fit's margin."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from core.common.errors import PgolfError
from core.config.fields import BUDGET_BYTES, Config
from core.config.presets import preset
from core.runs.package import write_record
from core.runs.summary import hardware, summarize
from core.runs.train_script import requirements
from tests.support.backends import needs
from tests.support.cli import assert_one_line_error, cli, data_flags
from tests.support.runs import fake_run, run_isolated

SMALL_CAP = 10_000  # a smoke model's artifact alone is ~230 KB: over it


@pytest.fixture(scope="module")
def over_cap(sotu_dataset, tmp_path_factory):
    """A smoke run (4 steps) under a 10,000-byte cap, and an evaluation limit it passes: (run, result)."""
    out = tmp_path_factory.mktemp("runs")
    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--budget-bytes", str(SMALL_CAP),
                 "--max-eval-seconds", "0.001", "--out-dir", str(out), "--run-id", "over", "--seed", "3",
                 *data_flags(sotu_dataset))  # fmt: skip
    return out / "over", result


@pytest.mark.slow
@needs("cuda")
def test_a_run_over_the_cap_ends_with_exit_status_3_and_one_last_line(over_cap):
    run, result = over_cap
    assert result.returncode == 3, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    total = summarize(run).total_bytes
    assert last == (
        f"error: artifact + code are {total:,} bytes, {total - SMALL_CAP:,} over the {SMALL_CAP:,}-byte cap: "
        f"not submittable ({run})"
    )
    assert "Traceback" not in result.stderr
    # The run is whole: scored, its artifact written, `runs` marks it.
    summary = summarize(run)
    assert summary.finished and summary.over_budget and summary.budget_bytes == SMALL_CAP
    listed = cli("runs", "--out-dir", str(run.parent))
    assert listed.returncode == 0 and f"{total:,} OVER" in listed.stdout


@needs("cuda")
def test_a_run_records_its_evaluation_times_and_warns_past_the_limit(over_cap):
    run, result = over_cap
    summary = summarize(run)
    assert set(summary.eval_phase_s) == {"roundtrip"} and summary.eval_phase_s["roundtrip"] > 0
    assert summary.eval_phase_s["roundtrip"] <= summary.eval_time_s  # the total reads the artifact too
    assert re.search(r"^warning: evaluation at \d+s, past --max-eval-seconds 0.001$", result.stdout, re.M)
    assert summary.hardware == "CPU" or summary.hardware.startswith("1x")
    (row,) = [
        json.loads(line) for line in cli("runs", "--json", "--out-dir", str(run.parent)).stdout.splitlines()
    ]
    assert row["eval_time_s"] == summary.eval_time_s and row["eval_phase_s"] == summary.eval_phase_s


@needs("cuda")
def test_a_run_records_the_data_it_trained_on(over_cap, sotu_dataset):
    import hashlib

    run, _ = over_cap
    data = summarize(run).data
    train = sorted(Path(sotu_dataset.data_path).glob("fineweb_train_*.bin"))
    listing = "".join(f"{p.name} {p.stat().st_size}\n" for p in train)
    assert data["train_shards"] == len(train) > 0
    assert data["train_shards_sha256"] == hashlib.sha256(listing.encode()).hexdigest()
    tokenizer = hashlib.sha256(Path(sotu_dataset.tokenizer_path).read_bytes()).hexdigest()
    assert data["tokenizer_sha256"] == tokenizer and len(data["val_sha256"]) == 64 and data["val_shards"] >= 1
    assert summarize(run).train_tokens == 4 * preset("smoke").train_batch_tokens
    assert f"train_shards_sha256:{data['train_shards_sha256']}" in (run / "train.log").read_text()


@pytest.mark.slow
@needs("cuda")
def test_package_refuses_a_seed_over_the_cap_in_one_line(over_cap, tmp_path):
    run, _ = over_cap
    result = cli("package", str(run), "--name", "Over", "--out", str(tmp_path / "rec"))
    assert_one_line_error(result, "package: seed 3", "over the 10,000-byte cap", "cannot be submitted")
    assert not (tmp_path / "rec").exists()


@needs("cuda")
def test_export_refuses_a_fit_margin_that_leaves_no_cap(over_cap):
    run, _ = over_cap
    (checkpoint,) = (run / "checkpoints").glob("*.safetensors")
    result = cli("export", str(checkpoint), "--fit-bytes", "1000", "--fit-margin", "1000")
    assert_one_line_error(result, "artifact_fit_margin=1,000 leaves nothing of artifact_fit_bytes=1,000")


@pytest.mark.slow  # a process importing torch and training 4 steps: ~20 s on 2 loaded cores
@needs("cuda")
def test_a_packaged_script_over_the_cap_says_so_last_and_exits_3(over_cap, sotu_dataset, tmp_path):
    run, _ = over_cap
    cfg = Config.from_dict(json.loads((run / "config.json").read_text()))
    from core.runs.train_script import script

    (tmp_path / "train_gpt.py").write_text(script(cfg))
    data = {"DATA_PATH": str(sotu_dataset.data_path), "TOKENIZER_PATH": str(sotu_dataset.tokenizer_path)}
    alone = run_isolated(tmp_path, dict(os.environ) | data)
    assert alone.returncode == 3, alone.stderr[-2000:]
    last = alone.stderr.strip().splitlines()[-1]
    assert last.startswith("error: artifact + code are ") and "over the 10,000-byte cap" in last


# ---------------------------------------------------------------- package, over runs written by hand
# A seed's run as `train` writes it (fake_run's arguments): where it trained, on what data, its figures.
STARTED = {"kind": "start", "step": 0, "backend": "cuda", "device": "cpu", "world_size": 1}
DATA = {"kind": "data", "train_shards": 2, "train_shards_sha256": "a" * 64, "val_shards": 1, "val_sha256": "b" * 64,
        "tokenizer_sha256": "c" * 64}  # fmt: skip
SEED_RUN = dict(records=[STARTED, DATA], artifact=900_000, log="log", steps=4, train_time_ms=1500.0,
                roundtrip_val_loss=5.0, roundtrip_val_bpb=2.9, code_bytes=33_000, roundtrip_eval_s=12.0,
                eval_time_s=12.5)  # fmt: skip


def smoke(root: Path, seed: int) -> Config:
    return preset("smoke").replace(seed=seed, data_path=str(root / "no_data"))  # no data pgolf made


@pytest.mark.slow
def test_the_records_folder_has_the_records_fields_and_requirements(tmp_path):
    runs = [
        fake_run(tmp_path / "a", smoke(tmp_path, 1), **SEED_RUN),
        fake_run(
            tmp_path / "b",
            smoke(tmp_path, 2),
            **(SEED_RUN | dict(artifact=905_000, roundtrip_eval_s=13.5, eval_time_s=14.0)),
        ),
    ]
    said: list[str] = []
    out, size = write_record(runs, tmp_path / "rec", "Two", "A. Golfer", "ag", "Blurb.", log=said.append)
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md", "requirements.txt", "submission.json", "train_gpt.py", "train_seed1.log", "train_seed2.log",
    ]  # fmt: skip
    sub = json.loads((out / "submission.json").read_text())
    assert list(sub)[:12] == ["author", "github_id", "name", "blurb", "date", "track", "val_loss", "val_bpb",
                              "val_bpb_std", "seeds", "seed_results", "bytes_total"]  # fmt: skip
    assert sub["track"] == "10min_16mb" and sub["hardware"] == "CPU" and sub["bytes_code"] == size
    assert sub["seed_results"]["2"] == {  # its own code bytes, as its run counted them (fake_run's 33,000)
        "val_loss": 5.0, "val_bpb": 2.9, "artifact_bytes": 905_000, "bytes_code": 33_000, "bytes_total": 938_000,
        "eval_time_s": 14.0, "eval_phases_s": {"roundtrip": 13.5}, "steps": 4, "train_time_s": 1.5,
        "train_tokens": 4 * preset("smoke").train_batch_tokens, "hardware": "CPU",
    }  # fmt: skip
    assert sub["bytes_total"] == 938_000 and sub["data"]["train_shards_sha256"] == "a" * 64
    assert said == [
        f"seed 1: artifact 900,000 + code {size:,} = {900_000 + size:,} bytes, headroom "
        f"{BUDGET_BYTES - 900_000 - size:,}; evaluation 12.5 s on CPU",
        f"seed 2: artifact 905,000 + code {size:,} = {905_000 + size:,} bytes, headroom "
        f"{BUDGET_BYTES - 905_000 - size:,}; evaluation 14.0 s on CPU",
    ]
    readme = (out / "README.md").read_text()
    assert "| 2 | 5.00000 | 2.90000 | 4 | 1.5 s | 14.0 s | CPU | 905,000 |" in readme
    assert (out / "requirements.txt").read_text() == requirements(preset("smoke"))


@pytest.mark.slow
def test_requirements_pin_what_the_bundle_imports_and_nothing_else():
    import importlib.metadata

    pins = requirements(preset("tiny")).splitlines()
    names = [line.split("==")[0] for line in pins]
    assert names == [
        "brotli",
        "numpy",
        "safetensors",
        "sentencepiece",
        "torch",
    ]  # not typer, rich, pytest, ...
    version = importlib.metadata.version("numpy").split("+")[0]
    assert f"numpy=={version}" in pins and all("+" not in line for line in pins)
    # A compressor or kernel reached by name through importlib is listed when the config uses it.
    assert any(
        line.startswith("zstandard==")
        for line in requirements(preset("tiny").replace(compressor="zstd")).splitlines()
    )
    record = requirements(preset("record_0427"))
    assert "flash_attn_interface" in record and "lrzip" in record


def test_package_refuses_a_seed_over_the_cap_before_its_audit(tmp_path):
    runs = [
        fake_run(tmp_path / "a", smoke(tmp_path, 1), **SEED_RUN),
        fake_run(
            tmp_path / "b",
            smoke(tmp_path, 2),
            **(SEED_RUN | dict(artifact=BUDGET_BYTES - 100, code_bytes=40_000)),
        ),
    ]

    def audit(run):
        raise AssertionError("audited")

    # Its log counted 40,000 code bytes, more than the packaged script: the larger is held to the cap.
    message = rf"seed 2 \(.*b\) is 16,039,900 bytes \(artifact {BUDGET_BYTES - 100:,} \+ code 40,000\), 39,900 over the 16,000,000-byte cap: it cannot be submitted$"
    with pytest.raises(PgolfError, match=message):
        write_record(runs, tmp_path / "rec", "x", audit=audit)
    assert not (tmp_path / "rec").exists()


@pytest.mark.slow
def test_package_refuses_a_slow_evaluation_on_the_tracks_hardware_only(tmp_path):
    h100 = STARTED | {"device": "cuda:0 (NVIDIA H100 80GB HBM3)", "world_size": 8}
    took = dict(roundtrip_eval_s=639.5, eval_time_s=640.0)
    slow = fake_run(tmp_path / "slow", smoke(tmp_path, 1), **(SEED_RUN | took | dict(records=[h100, DATA])))
    with pytest.raises(
        PgolfError,
        match=r"seed 1 .* took 640.0 s to evaluate on 8xNVIDIA H100 80GB HBM3, past the track's 600 s",
    ):
        write_record([slow], tmp_path / "rec", "x")
    out, _ = write_record([slow], tmp_path / "rec2", "x", track="non_record_16mb")  # no time limit there
    assert json.loads((out / "submission.json").read_text())["track"] == "non_record_16mb"
    elsewhere = fake_run(
        tmp_path / "cpu", smoke(tmp_path, 1), **(SEED_RUN | took)
    )  # a CPU's time says nothing of an H100's
    write_record([elsewhere], tmp_path / "rec3", "x")
    with pytest.raises(PgolfError, match=r"unknown track 'short' \(choose 10min_16mb or non_record_16mb\)"):
        write_record([elsewhere], tmp_path / "rec4", "x", track="short")


def test_package_refuses_seeds_trained_on_different_data(tmp_path):
    other_data = DATA | {"train_shards_sha256": "d" * 64}
    runs = [
        fake_run(tmp_path / "a", smoke(tmp_path, 1), **SEED_RUN),
        fake_run(tmp_path / "b", smoke(tmp_path, 2), **(SEED_RUN | dict(records=[STARTED, other_data]))),
    ]
    with pytest.raises(
        PgolfError,
        match=r"seed 2 \(.*\) trained on other data than seed 1: train_shards_sha256 d{16} vs a{16}$",
    ):
        write_record(runs, tmp_path / "rec", "x")
    assert not (tmp_path / "rec").exists()


def test_hardware_is_the_gpus_name_and_count_or_cpu():
    assert (
        hardware({"device": "cuda:0 (NVIDIA H100 80GB HBM3)", "world_size": 8}) == "8xNVIDIA H100 80GB HBM3"
    )
    assert hardware({"device": "gpu (Apple M2 Max)", "world_size": 1}) == "1xApple M2 Max"
    assert (hardware({"device": "cpu", "world_size": 1}), hardware({"device": "cpu", "world_size": 2})) == (
        "CPU", "CPU (2 processes)",
    )  # fmt: skip
    assert hardware({}) == "?"


def test_the_cap_can_be_lowered_but_not_raised():
    assert Config(budget_bytes=1000).validate().budget_bytes == 1000
    with pytest.raises(PgolfError, match="budget_bytes must be at most 16000000"):
        Config(budget_bytes=BUDGET_BYTES + 1).validate()


def test_the_fit_aims_its_margin_under_the_cap():
    from core.artifact.fit import fit_cap

    assert fit_cap(Config(artifact_fit_bytes=16_000_000, artifact_fit_margin=12_000)) == 15_988_000
    with pytest.raises(PgolfError, match="--fit-margin must be below --fit-bytes"):
        fit_cap(Config(artifact_fit_bytes=5, artifact_fit_margin=5))


def test_with_seeds_the_other_seeds_still_run_and_the_status_is_3_at_the_end(monkeypatch, capsys):
    """`train --seeds`: a seed over the cap says so, the next seeds run, the last over-cap line ends it."""
    import cli as cli_module
    from core.common.errors import OverBudget
    from core.runs import setup

    configs = [Config(seed=seed) for seed in (1, 2, 3)]
    monkeypatch.setattr(setup, "training_runs", lambda *args: (configs, None, []))
    trained = []

    def train_one(backend, cfg, resume, notes):
        trained.append(cfg.seed)
        if cfg.seed in (1, 2):
            raise OverBudget(f"seed {cfg.seed} over")

    monkeypatch.setattr(cli_module, "_train_one", train_one)
    with pytest.raises(OverBudget, match="seed 2 over") as caught:
        cli_module.train(backend="cuda", preset="smoke", config=None, resume=None, seeds="1,2,3")
    assert trained == [1, 2, 3] and caught.value.status == 3
    assert "error: seed 1 over" in capsys.readouterr().err
