"""The command line: the main commands work, and bad input is one clear line and a non-zero exit."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from core.common.files import file_sha256
from core.config.fields import Config
from core.data.shards import find_shards
from core.runs.summary import read_metrics
from tests.support import ROOT
from tests.support.backends import BACKENDS, busy_params, make_backend, needs
from tests.support.cli import assert_one_line_error, cli, data_flags, read_until, start_cli
from tests.support.runs import fake_run


@pytest.fixture(scope="module")
def trained(sotu_dataset, tmp_path_factory):
    """One short smoke run through the CLI; its run directory."""
    out = tmp_path_factory.mktemp("runs")
    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--out-dir", str(out), "--run-id", "r",
                 *data_flags(sotu_dataset), env={"TRAIN_LOG_EVERY": "1"})  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out / "r", result.stdout


def roundtrip_bpb(stdout: str) -> float:
    return float(re.search(r"final_int8_zlib_roundtrip_exact val_loss:\S+ val_bpb:(\S+)", stdout).group(1))


@pytest.mark.slow
@needs("cuda")
def test_train_prints_the_score_and_the_budget(trained):
    run_dir, stdout = trained
    assert "final_int8_zlib_roundtrip" in stdout and "budget:16000000" in stdout
    model = int(re.search(r"^Serialized model int8\+zlib: (\d+) bytes$", stdout, re.M).group(1))
    code = int(re.search(r"^Code size: (\d+) bytes$", stdout, re.M).group(1))
    total = re.search(r"^Total submission size int8\+zlib: (\d+) bytes \(fits\)$", stdout, re.M)
    assert (
        model == (run_dir / "final_model.int8.pgolf").stat().st_size and int(total.group(1)) == model + code
    )
    assert (run_dir / "final_model.int8.pgolf").is_file()
    final = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["artifact_sha256"] == file_sha256(
        run_dir / "final_model.int8.pgolf"
    )  # what `package` checks


@needs("cuda")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow  # ~3 s
def test_eval_of_the_artifact_gives_the_training_score(sotu_dataset, trained, backend):
    run_dir, stdout = trained
    result = cli("eval", str(run_dir / "final_model.int8.pgolf"), "--backend", backend, "--preset", "smoke",
                 *data_flags(sotu_dataset))  # fmt: skip
    assert result.returncode == 0, result.stderr
    got = float(re.search(r"val_bpb:(\S+)", result.stdout).group(1))
    assert got == pytest.approx(roundtrip_bpb(stdout), abs=1e-6)


@needs("cuda")
@pytest.mark.slow  # ~12 s
def test_eval_takes_the_runs_own_config_without_a_preset(sotu_dataset, trained, tmp_path):
    """The smoke run's artifact scores as the run did with no preset named: from its run directory
    (config.json), from the artifact alone elsewhere (the settings it keeps, data paths given), and
    from its checkpoint (the checkpoint's config); a flag still wins."""
    run_dir, stdout = trained
    alone = tmp_path / "moved.pgolf"
    alone.write_bytes((run_dir / "final_model.int8.pgolf").read_bytes())
    ckpt = sorted((run_dir / "checkpoints").glob("*.safetensors"))[-1]
    for target, extra in ((run_dir, []), (alone, data_flags(sotu_dataset)), (ckpt, [])):
        result = cli("eval", str(target), "--backend", "cuda", *extra)
        assert result.returncode == 0, result.stderr
        got = float(re.search(r"val_bpb:(\S+)", result.stdout).group(1))
        last_val = [r for r in read_metrics(run_dir) if r["kind"] == "val"][-1][
            "val_bpb"
        ]  # the float weights
        assert got == pytest.approx(last_val if target == ckpt else roundtrip_bpb(stdout), abs=1e-6), target
    shorter = cli("eval", str(run_dir), "--backend", "cuda", "--val-max-tokens", "1024")
    assert re.search(r"tokens:1024 ", shorter.stdout), shorter.stdout + shorter.stderr


@needs("cuda")
@pytest.mark.slow  # ~9 s
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


RECORD_STYLE = ["--quant-format", "mixed", "--mlp-mult", "20", "--gptq-enabled", "--gptq-calibration-batches", "2",
                "--eval-stride", "16", "--compressor", "brotli", "--byte-shuffle", "2"]  # fmt: skip


@needs("cuda")
@pytest.mark.slow  # ~15 s
def test_a_record_style_run_scores_sliding_and_gptq_and_eval_and_verify_agree(sotu_dataset, tmp_path):
    """Mixed int6 with GPTQ, brotli over a byte shuffle, sliding windows: the log has both figures as
    the records print them, and eval and verify (both backends) give the run's sliding score."""
    flags = [*RECORD_STYLE, *data_flags(sotu_dataset)]
    run = cli("train", "--backend", "cuda", "--preset", "smoke", "--out-dir", str(tmp_path), "--run-id", "g",
              *flags)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert re.search(r"gptq:collected 13 Hessians from 2 batches", run.stdout)
    assert re.search(r"artifact:\S+final_model.int6.pgolf format:mixed .* gptq_tensors:4", run.stdout)
    assert re.search(r"^mlp +4 +\S+ +int6 ", run.stdout, re.M)  # the budget table
    plain = float(re.search(r"final_int6_roundtrip_exact val_loss:\S+ val_bpb:(\S+)", run.stdout).group(1))
    sliding = float(
        re.search(r"final_int6_sliding_window_exact val_loss:\S+ val_bpb:(\S+)", run.stdout).group(1)
    )
    assert sliding != plain
    artifact = str(tmp_path / "g" / "final_model.int6.pgolf")
    evaluated = cli("eval", artifact, "--backend", "cuda", "--preset", "smoke", *flags)
    assert evaluated.returncode == 0, evaluated.stderr
    got = dict(re.findall(r"eval:(\w+) tokens:\S+ val_loss:\S+ val_bpb:(\S+)", evaluated.stdout))
    assert float(got["plain"]) == pytest.approx(plain, abs=1e-6)
    assert float(got["sliding_window"]) == pytest.approx(sliding, abs=1e-6)
    verified = cli("verify", artifact, "--preset", "smoke", *flags)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "backends agree" in verified.stdout and "sliding" in verified.stdout


@pytest.mark.slow
@needs("cuda")
def test_export_writes_the_artifact_settings_given_and_reports_json(sotu_dataset, trained, tmp_path):
    run_dir, _ = trained
    ckpt = sorted((run_dir / "checkpoints").glob("*.safetensors"))[-1]
    out = tmp_path / "m.pgolf"
    result = cli("export", str(ckpt), "--out", str(out), "--quant-format", "mixed", "--embed-bits", "6",
                 "--compressor", "zstd", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["sizes"]["model_bytes"] == out.stat().st_size
    rows = {row["class"]: row for row in report["classes"]}
    assert rows["embedding"]["bits"] == "fp16"  # 65,536 values: under the floor, kept in fp16
    assert rows["total"]["params"] == sum(r["params"] for c, r in rows.items() if c != "total")
    assert 0 < rows["total"]["share"] < 0.1


@needs("cuda")
@pytest.mark.slow  # ~9 s
def test_eval_and_verify_score_a_records_int6_artifact(sotu_dataset, tmp_path):
    """An artifact in the records' own layout (torch.save of int6 values and scales, byte shuffle,
    brotli) holding a pgolf model: eval scores it in both backends, as the weights it holds score."""
    import io

    import torch

    from core.artifact.export import dequantize
    from core.artifact.load import read_artifact
    from core.artifact.rowquant import quantize_rows
    from core.common import compress
    from core.eval.plain import evaluate
    from core.eval.score import load_eval_data

    cfg = sotu_dataset.config(mlp_mult=20.0)
    w, m = {}, {}
    for name, value in busy_params(cfg).items():
        if value.ndim == 2 and value.size > 65_536:
            q, scale = quantize_rows(value, 6)
            w[f"{name}.q"], w[f"{name}.scale"] = torch.from_numpy(q), torch.from_numpy(scale)
            m[name] = {"type": "int6", "method": "clip_search"}
        else:
            w[name], m[name] = torch.from_numpy(value), "passthrough"
    buffer = io.BytesIO()
    torch.save({"w": w, "m": m}, buffer)
    path = tmp_path / "final_model.int6.ptz"
    path.write_bytes(compress.compress(compress.byte_shuffle(buffer.getvalue()), "brotli"))
    backend = make_backend("cuda", cfg)
    backend.load_params(dequantize(read_artifact(path)))
    expected = evaluate(backend, load_eval_data(cfg)).val_bpb
    flags = ["--preset", "smoke", "--mlp-mult", "20", *data_flags(sotu_dataset)]
    for name in ("cuda", "mlx"):
        result = cli("eval", str(path), "--backend", name, *flags)
        assert result.returncode == 0, result.stderr
        assert float(re.search(r"val_bpb:(\S+)", result.stdout).group(1)) == pytest.approx(expected, abs=1e-6)
    verified = cli("verify", str(path), *flags)
    assert verified.returncode == 0 and "backends agree" in verified.stdout, verified.stdout + verified.stderr


@pytest.mark.slow
def test_usage_errors_are_one_line():
    for args, message in [
        (("train", "--matrx-lr", "0.1"), "No such option: --matrx-lr"),
        (("train", "--iterations", "1e999"), "--iterations"),
        (("export",), "Missing argument"),
    ]:
        result = cli(*args)
        assert_one_line_error(result, message, "--help")
        assert result.returncode == 2


@pytest.mark.slow  # ~2 s
def test_bad_config_values_are_refused_before_any_work(tmp_path):
    for flags, message in [
        (("--logit-softcap", "inf"), "logit_softcap must be finite"),
        (("--beta2", "5"), "beta2 must be in [0, 1)"),
        (("--tied-embed-init-std", "-1"), "tied_embed_init_std must be >= 0"),
        (("--run-id", "../../x"), "run_id must be a plain folder name"),
        (("--config", str(tmp_path)), "cannot read"),
    ]:
        assert_one_line_error(cli("train", "--out-dir", str(tmp_path / "runs"), *flags), message)
    # eval checks its settings too, before it reads anything
    assert_one_line_error(
        cli("eval", "missing.pgolf", "--train-seq-len", "0"), "train_seq_len must be positive"
    )
    assert_one_line_error(
        cli("eval", "missing.pgolf", "--compile", "maybe"), "compile must be auto, on or off"
    )
    assert list(tmp_path.iterdir()) == [], "a refused command left files behind"


def test_unknown_config_key_in_a_file(tmp_path):
    (tmp_path / "run.toml").write_text("matrx_lr = 0.1\n")
    assert_one_line_error(cli("train", "--config", str(tmp_path / "run.toml")), "unknown key 'matrx_lr'")


@pytest.mark.slow  # ~2 s
def test_bad_flag_value():
    assert_one_line_error(cli("train", "--preset", "huge"), "unknown preset 'huge'")
    assert_one_line_error(cli("train", "--report-to", "tensorbord"), "unknown tracker 'tensorbord'")
    assert_one_line_error(cli("train", "--backend", "tpu"), "unknown backend 'tpu'")


@needs("cuda")
@pytest.mark.slow  # ~3 s
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
@pytest.mark.slow  # ~6 s
def test_shards_and_tokenizer_of_different_vocabularies(sotu_dataset, challenge_dir, tmp_path):
    runs = tmp_path / "runs"
    # A vocabulary flag that disagrees with the tokenizer...
    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--vocab-size", "512",
                 "--out-dir", str(runs), *data_flags(sotu_dataset))  # fmt: skip
    assert_one_line_error(result, "has 1024 pieces but vocab_size is 512")
    # ...and shards whose ids exceed the tokenizer's vocabulary.
    wide = tmp_path / "wide"
    wide.mkdir()
    from core.datasets.writers import write_shard

    write_shard(wide / "fineweb_val_000000.bin", np.arange(2000) % 2000)
    write_shard(wide / "fineweb_train_000000.bin", np.arange(2000) % 2000)
    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--data-path", str(wide), "--out-dir",
                 str(runs), "--tokenizer-path", str(challenge_dir / "fineweb_1024_bpe.model"))  # fmt: skip
    assert_one_line_error(result, "fineweb_val_000000.bin", "do not match the tokenizer vocabulary")
    assert not runs.exists(), "a refused run left a run directory behind"


@needs("cuda")
@pytest.mark.slow  # ~3 s
def test_a_run_directory_is_never_reused(sotu_dataset, trained):
    run_dir, _ = trained
    before = (run_dir / "metrics.jsonl").read_bytes()
    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--out-dir", str(run_dir.parent),
                 "--run-id", run_dir.name, *data_flags(sotu_dataset))  # fmt: skip
    assert_one_line_error(result, str(run_dir), "already holds a run")
    assert (run_dir / "metrics.jsonl").read_bytes() == before


@pytest.mark.slow
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
@pytest.mark.slow  # ~2 s
def test_runs_lists_the_run_and_plot_draws_it(trained, tmp_path):
    run_dir, stdout = trained
    listed = cli("runs", "--out-dir", str(run_dir.parent))
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.strip("│ ").startswith("r "))
    assert f"{roundtrip_bpb(stdout):.4f}" in row
    as_json = cli("runs", "--out-dir", str(run_dir.parent), "--json")
    (record,) = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert (record["name"], record["backend"], record["seed"], record["dataset"]) == (
        "r",
        "cuda",
        1337,
        "sotu_sp1024",
    )
    assert record["roundtrip_val_bpb"] == pytest.approx(roundtrip_bpb(stdout), abs=1e-6)
    pytest.importorskip("matplotlib")
    drawn = cli("plot", str(run_dir), "--out", str(tmp_path / "c.png"))
    assert drawn.returncode == 0, drawn.stderr
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_one_line_error(cli("plot", str(tmp_path), "--out", str(tmp_path / "d.png")), "not a run directory")
    assert_one_line_error(cli("runs", "--out-dir", str(tmp_path / "none")), "no such directory of runs")


@pytest.mark.slow  # ~3 s
def test_info_and_help_work():
    info = cli("info").stdout
    assert re.search(r"auto backend: (PyTorch|MLX) on ", info), info  # the framework, not the flag value
    assert "--matrix-lr" in cli("train", "--help").stdout
    for args in ((), ("data",), ("config",)):  # a bare group shows its help, once
        shown = cli(*args)
        assert shown.returncode == 0 and shown.stdout.count("Usage:") == 1, shown.stdout


@needs("cuda")
@pytest.mark.slow  # three CLI runs: ~12 s
@pytest.mark.parametrize("backend", BACKENDS)
def test_sample_continues_a_prompt_from_a_checkpoint_or_the_artifact(sotu_dataset, trained, backend):
    run_dir, _ = trained
    ckpt = sorted((run_dir / "checkpoints").glob("*.safetensors"))[-1]
    greedy = ["--prompt", "The Congress", "--max-tokens", "8", "--temperature", "0", "--backend", backend]
    from_ckpt = cli("sample", str(ckpt), *greedy)  # the checkpoint brings its config: no other flag
    assert from_ckpt.returncode == 0, from_ckpt.stderr
    assert from_ckpt.stdout.startswith("The Congress") and len(from_ckpt.stdout) > len("The Congress\n")
    artifact = run_dir / "final_model.int8.pgolf"
    from_artifact = cli("sample", str(artifact), *greedy, "--preset", "smoke", *data_flags(sotu_dataset))
    assert from_artifact.returncode == 0 and from_artifact.stdout.startswith("The Congress"), (
        from_artifact.stderr
    )
    from_run = cli("sample", str(run_dir), *greedy, "--preset", "smoke", *data_flags(sotu_dataset))
    assert from_run.stdout == from_artifact.stdout  # a run directory means its artifact


@needs("cuda")
def test_the_log_names_the_dataset_and_what_the_environment_set(trained):
    run_dir, stdout = trained
    for text in (stdout, (run_dir / "train.log").read_text()):
        assert "from the environment: train_log_every=1 (TRAIN_LOG_EVERY)" in text
        assert "dataset:sotu_sp1024 data_path:" in text
    assert json.loads((run_dir / "config.json").read_text())["dataset"] == "sotu_sp1024"


def test_config_show_prints_a_config_file_with_the_source_of_each_value(tmp_path):
    shown = cli("config", "show", "--preset", "tiny", "--seed", "7", env={"ITERATIONS": "12"})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert "seed = 7  # flag" in lines and "iterations = 12  # env ITERATIONS" in lines
    assert "model_dim = 128  # preset tiny" in lines and "matrix_lr = 0.04  # default" in lines
    (tmp_path / "shown.toml").write_text(shown.stdout)
    from core.config.presets import preset
    from core.config.sources import load_file

    assert Config.from_dict(load_file(tmp_path / "shown.toml")) == preset("tiny").replace(
        seed=7, iterations=12, dataset="sotu_sp1024"
    )


@pytest.mark.slow
def test_runs_on_a_terminal_shows_the_groups_too(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    import cli as cli_module

    for seed in (1, 2):
        fake_run(tmp_path / f"lr-seed{seed}", {"seed": seed, "run_group": "lr"}, curve=4)
    fake_run(tmp_path / "alone", curve=4)
    screen = io.StringIO()
    monkeypatch.setattr(cli_module, "console", Console(file=screen, force_terminal=True, width=160))
    cli_module.runs(out_dir=tmp_path, json_out=False, compare=None, more=None, against=None)
    shown = screen.getvalue()
    assert f"runs in {tmp_path}" in shown and "lr-seed2" in shown and "alone" in shown
    assert "groups (finished runs" in shown
    assert re.search(r"lr +│ +2 │ 1,2 ", shown), shown


@needs("cuda")
@pytest.mark.slow  # ~2 s
def test_export_refuses_to_overwrite_its_input_or_write_where_it_cannot(trained, tmp_path):
    run_dir, _ = trained
    ckpt = sorted((run_dir / "checkpoints").glob("*.safetensors"))[-1]
    before = ckpt.read_bytes()
    (tmp_path / "a_file").write_text("x")
    for out, message in [
        (ckpt, "is the checkpoint itself"),
        (tmp_path, "a folder, not a file"),
        (tmp_path / "a_file" / "x.pgolf", "cannot write"),
    ]:
        assert_one_line_error(cli("export", str(ckpt), "--out", str(out)), message)
    result = cli("export", str(ckpt), "--format", "upstream", "--compressor", "lzma")
    assert_one_line_error(result, "the upstream format is int8 + zlib only")
    result = cli("export", str(ckpt), "--model-dim", "64")
    assert_one_line_error(result, "--model-dim cannot change")
    assert ckpt.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


@needs("cuda")
@pytest.mark.slow  # ~6 s
def test_resume_is_refused_past_its_iterations_and_into_another_run(sotu_dataset, trained, tmp_path):
    run_dir, _ = trained
    ckpt = sorted((run_dir / "checkpoints").glob("*.safetensors"))[-1]  # step 4 of the smoke preset
    base = [
        "train",
        "--backend",
        "cuda",
        "--preset",
        "smoke",
        "--resume",
        str(ckpt),
        *data_flags(sotu_dataset),
    ]
    result = cli(*base, "--iterations", "2", "--out-dir", str(tmp_path))
    assert_one_line_error(result, "is at step 4, past iterations=2")
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    result = cli(*base, "--iterations", "6", "--out-dir", str(tmp_path), "--run-id", "other")
    assert_one_line_error(result, "already holds a run")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]
    assert [p.name for p in other.iterdir()] == ["config.json"]


@needs("cuda")
@pytest.mark.slow  # ~3 s
def test_resume_refuses_optimizer_state_of_the_wrong_shape(sotu_dataset, trained, tmp_path):
    from core.artifact.checkpoint import save_checkpoint
    from core.artifact.load import load_checkpoint

    run_dir, _ = trained
    ckpt = load_checkpoint(sorted((run_dir / "checkpoints").glob("*.safetensors"))[-1])
    ckpt.optimizer["momentum_buffer/blocks.0.attn.c_q.weight"] = np.zeros((3, 3), np.float32)
    path = save_checkpoint(tmp_path / "bad.safetensors", ckpt)
    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--resume", str(path), "--iterations", "6",
                 "--out-dir", str(tmp_path / "runs"), *data_flags(sotu_dataset))  # fmt: skip
    assert_one_line_error(result, "momentum_buffer/blocks.0.attn.c_q.weight is shape (3, 3)")
    assert not (tmp_path / "runs").exists()


@needs("cuda")
@pytest.mark.slow  # ~3 s
def test_boolean_fields_can_be_switched_off(sotu_dataset, tmp_path):
    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--iterations", "1", "--no-tie-embeddings",
                 "--out-dir", str(tmp_path), "--run-id", "untied", *data_flags(sotu_dataset))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "untied" / "config.json").read_text())["tie_embeddings"] is False


def start_training(dataset, out: Path, *flags: str):
    """A smoke run that would go on for long, started in the background; its output is read line by line."""
    return start_cli("train", "--backend", "cuda", "--preset", "smoke", "--iterations", "100000", "--out-dir",
                     str(out), "--run-id", "r", *data_flags(dataset), *flags)  # fmt: skip


@needs("cuda")
@pytest.mark.parametrize(("sig", "code", "message"), [(signal.SIGINT, 130, "interrupted"),
                                                       (signal.SIGTERM, 143, "terminated")])  # fmt: skip
@pytest.mark.slow  # ~3 s
def test_interrupted_training_says_so_and_leaves_no_temp_files(sotu_dataset, tmp_path, sig, code, message):
    # Checkpoints every step, so that the signal is likely to land during a write.
    process = start_training(sotu_dataset, tmp_path, "--checkpoint-every", "1")
    read_until(process, "step:3/")
    process.send_signal(sig)
    stdout, stderr = process.communicate(timeout=60)
    import cli as cli_module

    assert process.returncode == code, stderr
    assert stderr.split() == [*cli_module.HOLDING_NOTICE.split(), message], stderr  # the notice, then the end
    assert list(tmp_path.rglob("*.tmp")) == []
    assert "stopped at step" in stdout


@needs("cuda")
@pytest.mark.slow  # four CLI runs: ~14 s
def test_ctrl_c_writes_a_checkpoint_and_the_run_goes_on_from_its_directory(sotu_dataset, tmp_path):
    process = start_training(sotu_dataset, tmp_path, "--checkpoint-every", "0")
    read_until(process, "step:2/")
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130 and stderr.strip().endswith("\ninterrupted"), stderr
    run = tmp_path / "r"
    stopped = re.search(r"stopped at step (\d+): checkpoint (\S+);", stdout)
    assert (
        stopped
        and Path(stopped.group(2)) == run / "checkpoints" / f"step_{int(stopped.group(1)):06d}.safetensors"
    )
    assert Path(stopped.group(2)).is_file()
    step = int(stopped.group(1))
    # No preset, data or run flags: all of it comes from the checkpoint; only the length changes.
    result = cli("train", "--backend", "cuda", "--resume", str(run), "--iterations", str(step + 2))
    assert result.returncode == 0, result.stderr
    assert f"resumed:{stopped.group(2)} step:{step}" in result.stdout
    assert f"run_dir:{run}" in result.stdout and (run / "final_model.int8.pgolf").is_file()
    assert json.loads((run / "config.json").read_text())["iterations"] == step + 2
    # What the run computes cannot change: refused by name before any work.
    for flags, name in [(("--matrix-lr", "0.5"), "matrix_lr"), (("--preset", "tiny"), "num_layers")]:
        refused = cli("train", "--backend", "cuda", "--resume", str(run), "--iterations", "50", *flags)
        assert_one_line_error(refused, "cannot change when resuming", f"{name} (the checkpoint has")
    assert_one_line_error(cli("train", "--resume", str(tmp_path)), "no checkpoint in")


def _handlers_installed(pid: int, timeout: float = 60.0) -> None:
    """Wait until cli.py has installed its signal handlers, seen as SIGTERM caught (Python itself catches
    SIGINT from its start, SIGTERM only when told to); where /proc is missing, wait 0.15 s instead."""
    status = Path(f"/proc/{pid}/status")
    if not status.exists():
        time.sleep(0.15)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        caught = re.search(r"^SigCgt:\s*([0-9a-f]+)$", status.read_text(), re.M)
        if caught and int(caught.group(1), 16) & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.002)
    raise AssertionError(f"cli.py did not install its signal handlers within {timeout} s")


def test_a_signal_during_start_up_ends_quietly():
    # The imports take a few tenths of a second; a signal among them still gets its one line. (Timed from
    # the handlers' installation, not the process's start: on a loaded machine, or beside other test
    # workers, the interpreter's own start may take longer than the delay.)
    for delay in (0.0, 0.15):
        process = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "info"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
        # (the default disposition: a test command run as a background job ignores SIGINT, and the child
        # would inherit that)
        _handlers_installed(process.pid)
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)  # `info` takes seconds: it was still starting
        assert (process.returncode, stderr.strip()) == (130, "interrupted"), stderr


def test_a_closed_pipe_ends_quietly(tmp_path):
    process = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), "train", "--help"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    process.stdout.readline()
    process.stdout.close()  # as `| head -1` does
    stderr = process.stderr.read()
    assert process.wait(timeout=60) == 141 and stderr == b"", stderr


def test_live_progress_draws_a_bar_per_task_on_a_terminal_only(monkeypatch):
    import io

    from rich.console import Console

    import cli as cli_module

    screen = io.StringIO()
    monkeypatch.setattr(cli_module, "console", Console(file=screen, force_terminal=True, width=100))
    with cli_module.LiveProgress() as live:
        training = live.tracker("training")
        training(1, 4)
        assert list(live.tasks) == ["training"]
        training(4, 4)
        assert live.tasks == {}  # a finished bar goes away
    assert "training" in screen.getvalue()
    monkeypatch.setattr(cli_module, "console", Console(file=io.StringIO(), force_terminal=False))
    assert cli_module.LiveProgress().tracker("training") is None  # piped: plain log lines only
    assert cli_module.LiveProgress(enabled=False).tracker("training") is None


def test_a_second_signal_during_training_is_not_held():
    import cli as cli_module

    signals = cli_module.Signals()
    with pytest.raises(KeyboardInterrupt):
        signals.handle(signal.SIGINT, None)  # outside training: at once
    with signals.held() as stop:
        assert stop() is None
        signals.handle(signal.SIGTERM, None)  # held for the loop, which checkpoints, then raises it
        assert isinstance(stop(), cli_module.Terminated)
        with pytest.raises(KeyboardInterrupt):
            signals.handle(signal.SIGINT, None)  # the second one: at once


EXITS = """
import atexit, sys, threading, time
sys.path.insert(0, {root!r})
from cli import exit_now
def late():
    time.sleep(0.3)
    print("the thread's line", flush=True)
threading.Thread(target=late).start()
atexit.register(lambda: print("atexit's line"))
print("buffered", end="")
exit_now({code!r})
"""


@pytest.mark.slow  # a process importing cli.py each: ~1.4 s
@pytest.mark.parametrize("code, status", [(None, 0), (3, 3), ("error: a text", 1)])
def test_exit_now_ends_as_the_interpreter_would(code, status):
    """Non-daemon threads finish, atexit's functions run, buffered output is written, the status is
    SystemExit's (a text printed to stderr, status 1)."""
    done = subprocess.run([sys.executable, "-c", EXITS.format(root=str(ROOT), code=code)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == status
    assert done.stdout == "buffered" + "the thread's line\n" + "atexit's line\n"
    assert done.stderr == ("" if status != 1 else "error: a text\n")
