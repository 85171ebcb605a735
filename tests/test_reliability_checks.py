"""What is written is read back, what would fail late is refused early, and a wrong pairing of
tokenizer, data and weights is refused by name: out of memory, an lrzip that corrupts, hangs or is
missing, output paths, the config check of `config show`, the tokenizer's SHA-256 in the data
manifest and in an artifact. Each test fails on the code before its check."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from core.artifact import int8
from core.artifact.export import export_artifact, read_pgolf_artifact
from core.artifact.load import load_weights, read_artifact, saved_config
from core.common import pergroup
from core.common.errors import PgolfError, memory_hint
from core.common.files import file_sha256
from core.config.presets import preset
from core.data.manifest import check_tokenizer, read_manifest
from core.eval.score import EvalData
from core.eval.ttt import evaluate_ttt
from core.model.params import init_params, storage_dtypes
from core.runs.setup import export_setup
from core.train.fitting import fit_files
from tests.conftest import CHALLENGE
from tests.helpers import (
    FAKE_LRZIP,
    LEGAL_CFG,
    ROOT,
    assert_one_line_error,
    cli,
    data_flags,
    make_backend,
    make_checkpoint,
    needs,
    unit_tables,
)

OTHER_TOKENIZER = CHALLENGE / "fineweb_1024_bpe.model"  # vocab 1024 too, but not the one of sotu_sp1024


@pytest.fixture
def fake_lrzip(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    program = folder / "lrzip"
    program.write_text(FAKE_LRZIP.format(python=sys.executable))
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LRZIP", "")
    return program


def export_smoke(path: Path, compressor: str = "zlib", tokenizer_path: str | None = None, **changes):
    """The artifact of fresh weights; with pergroup, of `tiny` ones (its embedding is big enough to be
    quantized, so that lrzip has a group to compress)."""
    cfg = preset("tiny" if compressor == "pergroup" else "smoke").replace(compressor=compressor, **changes)
    if tokenizer_path is not None:
        cfg = cfg.replace(tokenizer_path=tokenizer_path)
    return export_artifact(init_params(cfg), cfg, storage_dtypes(cfg, False), path, 0)


# ------------------------------------------------- every artifact written is read back
def test_an_artifact_whose_compressor_corrupts_it_is_not_written(fake_lrzip, tmp_path, monkeypatch):
    quant_format = "mixed"  # int6 matrices: what pergroup gives lrzip
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("FAKE_LRZIP", "corrupt")
    with pytest.raises(
        PgolfError, match=r"a\.pgolf not written: its pergroup bytes do not read back \(.*checksum"
    ):
        export_smoke(out / "a.pgolf", "pergroup", quant_format=quant_format)
    assert list(out.iterdir()) == []  # neither the file nor a temp file
    monkeypatch.setenv("FAKE_LRZIP", "")
    export_smoke(out / "a.pgolf", "pergroup", quant_format=quant_format)
    read_pgolf_artifact(out / "a.pgolf")


def test_an_artifact_the_disk_gives_back_changed_is_removed(tmp_path, monkeypatch):
    real = int8.read_file
    monkeypatch.setattr(int8, "read_file", lambda *a: real(*a)[:-1] + b"\x00")
    with pytest.raises(PgolfError, match="the file read back differs from what was written"):
        export_smoke(tmp_path / "a.pgolf")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # a CLI export: ~5 s
def test_export_through_a_corrupting_lrzip_fails_in_one_line(fake_lrzip, tmp_path):
    from core.artifact.checkpoint import save_checkpoint

    ckpt = make_checkpoint()
    ckpt.config = preset("tiny").to_dict()  # a matrix big enough to be quantized: a group for lrzip
    ckpt.params = init_params(preset("tiny"))
    ckpt.optimizer = {"step": ckpt.optimizer["step"]}
    ckpt.dtypes = {k: "float32" for k in ckpt.params}
    checkpoint = save_checkpoint(tmp_path / "c.safetensors", ckpt)
    out = tmp_path / "a.pgolf"
    result = cli("export", str(checkpoint), "--quant-format", "mixed", "--compressor", "pergroup", "--out", str(out),
                 env={"PATH": os.environ["PATH"], "FAKE_LRZIP": "corrupt"})  # fmt: skip
    assert_one_line_error(result, "not written: its pergroup bytes do not read back")
    assert not out.exists()


# ------------------------------------------------- lrzip: missing when reading, hung
def test_reading_a_pergroup_artifact_without_lrzip_says_so_not_damaged(fake_lrzip, tmp_path, monkeypatch):
    path = tmp_path / "a.pgolf"
    export_smoke(path, "pergroup", quant_format="mixed")
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    for read in (saved_config, read_artifact, read_pgolf_artifact):
        with pytest.raises(PgolfError) as caught:
            read(path)
        message = str(caught.value)
        assert f"artifact {path}: reading a pergroup artifact needs the lrzip program" in message
        assert "apt-get install lrzip" in message and "brew install lrzip" in message
        assert "damaged" not in message and "--compressor" not in message  # no other compressor reads it


def test_an_lrzip_that_never_ends_is_stopped(fake_lrzip, tmp_path, monkeypatch):
    path = tmp_path / "a.pgolf"
    export_smoke(path, "pergroup", quant_format="mixed")
    monkeypatch.setenv("FAKE_LRZIP", "hang")
    monkeypatch.setattr(pergroup, "LRZIP_TIMEOUT_S", 1.0)
    monkeypatch.setattr(pergroup, "LRZIP_MIN_BYTES_PER_S", 10**12)
    start = time.monotonic()
    with pytest.raises(PgolfError, match=r"lrzip -d did not finish within 1 s on [\d,]+ bytes: stopped"):
        read_pgolf_artifact(path)
    assert time.monotonic() - start < 10


def test_the_lrzip_time_limit_grows_with_the_data():
    assert pergroup.lrzip_timeout(0) == pergroup.LRZIP_TIMEOUT_S
    assert pergroup.lrzip_timeout(16_000_000) > 15 * 60  # a whole budget's worth at a busy machine's pace


# ------------------------------------------------- out of memory
def too_large(*args, **kwargs):
    """What PyTorch raises when an allocation fails (on the CPU: "DefaultCPUAllocator: can't allocate
    memory"), from a real allocation of 128 TiB."""
    import torch

    torch.empty(2**45, dtype=torch.float32)


@needs("cuda")
def test_out_of_memory_during_ttt_names_the_settings_to_lower(monkeypatch):
    from cuda_train.ttt import TorchTTT

    backend = make_backend("cuda", LEGAL_CFG)
    monkeypatch.setattr(TorchTTT, "score_then_adapt", too_large)
    tokens = np.random.default_rng(0).integers(3, LEGAL_CFG.vocab_size, 400).astype(np.int32)
    tokens[[0, 150, 300]] = LEGAL_CFG.bos_id
    try:
        with pytest.raises(PgolfError) as caught:
            evaluate_ttt(backend, EvalData(tokens, unit_tables(LEGAL_CFG.vocab_size)))
    finally:
        backend.close()
    message = str(caught.value)
    assert message.startswith("out of memory during test-time training (") and "\n" not in message
    assert message.endswith(
        "lower --ttt-batch-size, --ttt-lora-rank or --ttt-eval-seq-len (global phases: --global-ttt-batch-seqs)"
    )


@needs("cuda")
def test_memory_errors_and_only_they_become_one_line():
    import cli as cli_module

    try:
        too_large()
    except RuntimeError as exc:
        real = exc
    cuda = RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.10 GiB total capacity)")
    for exc in (MemoryError(), cuda, real):
        with (
            pytest.raises(PgolfError, match="out of memory during a step .*: lower --x"),
            memory_hint("a step", "--x"),
        ):
            raise exc
    with pytest.raises(RuntimeError, match="a bug"), memory_hint("a step", "--x"):
        raise RuntimeError("a bug")
    code, line = cli_module._ending(real)  # where no step names its settings
    assert code == 1 and line.startswith("error: out of memory (") and "lower" in line and "\n" not in line
    assert cli_module._ending(RuntimeError("a bug")) == (1, None)  # a traceback


@pytest.mark.slow  # a CLI eval: ~10 s
def test_eval_with_a_ttt_too_large_for_4_gb_is_one_line(sotu_dataset, tmp_path):
    """The reported case: LoRA adapters of rank 4096 for 64 documents under a 4 GB address space."""
    import resource

    path = tmp_path / "a.pgolf"
    cfg = sotu_dataset.config("tiny")  # the tokenizer the artifact keeps is the one it is scored with
    export_artifact(init_params(cfg), cfg, storage_dtypes(cfg, False), path, 0)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4_000_000_000, 4_000_000_000))

    result = subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), "eval", str(path), "--backend", "cuda", "--preset", "tiny",
         "--val-max-tokens", "8192", "--ttt-enabled", "--ttt-lora-rank", "4096", "--ttt-batch-size", "64",
         *data_flags(sotu_dataset)],
        capture_output=True, text=True, timeout=300, preexec_fn=limit,
    )  # fmt: skip
    assert_one_line_error(result, "error: out of memory during test-time training (", "--ttt-lora-rank")


# ------------------------------------------------- output paths, before any work
def test_export_refuses_an_output_it_cannot_write_before_reading_the_checkpoint(tmp_path):
    missing = tmp_path / "none.safetensors"  # read after the check: never reached
    for out, message in (
        (tmp_path, "a folder, not a file"),
        (tmp_path / "no" / "a.pgolf", "cannot write there: .* does not exist"),
        (Path("/proc/a.pgolf"), r"cannot write in /proc \("),
    ):
        with pytest.raises(PgolfError, match=f"--out {out}: {message}"):
            export_setup(missing, out, "pgolf", {"artifact_fit_bytes": 100_000})


@pytest.mark.slow  # two CLI starts: ~6 s
def test_fit_bytes_into_a_folder_and_token_losses_into_proc_are_refused_at_once(tmp_path):
    checkpoint = tmp_path / "c.safetensors"
    from core.artifact.checkpoint import save_checkpoint

    save_checkpoint(checkpoint, make_checkpoint())
    start = time.monotonic()
    result = cli("export", str(checkpoint), "--fit-bytes", "100000", "--out", str(tmp_path))
    assert_one_line_error(result, f"--out {tmp_path}: a folder, not a file")
    result = cli("eval", str(checkpoint), "--save-token-losses", "/proc/x.npz")
    assert_one_line_error(result, "--save-token-losses /proc/x.npz: cannot write in /proc")
    assert time.monotonic() - start < 60


# ------------------------------------------------- one config check for every command
@pytest.mark.parametrize("rank", ["100000", "0"])
def test_config_show_refuses_what_train_refuses(rank):
    assert_one_line_error(
        cli("config", "show", "--preset", "smoke", "--ttt-lora-rank", rank), "ttt_lora_rank must be"
    )


# ------------------------------------------------- the tokenizer that made the data, the weights
def test_the_manifest_records_the_tokenizer_of_each_dataset(sotu_dataset):
    (entry,) = read_manifest(sotu_dataset.root)["datasets"]
    assert entry["tokenizer_sha256"] == file_sha256(sotu_dataset.tokenizer_path)


def test_a_tokenizer_that_did_not_make_the_data_is_refused_by_name(sotu_dataset, tmp_path):
    cfg = sotu_dataset.config().replace(tokenizer_path=str(OTHER_TOKENIZER))
    with pytest.raises(
        PgolfError, match=r"tokenizer \S+fineweb_1024_bpe.model did not make dataset sotu_sp1024: "
    ):
        check_tokenizer(cfg.data_path, cfg.tokenizer_path)
    from core.runs.setup import training_runs

    flags = {"data_path": str(sotu_dataset.data_path), "tokenizer_path": str(OTHER_TOKENIZER)}
    with pytest.raises(PgolfError, match="did not make dataset sotu_sp1024"):  # train: before anything runs
        training_runs("cuda", "smoke", None, flags)
    copy = tmp_path / "copy.model"  # the same file elsewhere is the same tokenizer
    shutil.copy(sotu_dataset.tokenizer_path, copy)
    check_tokenizer(sotu_dataset.data_path, copy)
    # A manifest written before the hash was recorded: nothing to check against.
    old = tmp_path / "old"
    shutil.copytree(sotu_dataset.root, old)
    manifest = read_manifest(old)
    for entry in manifest["datasets"]:
        entry.pop("tokenizer_sha256")
    (old / "manifest.json").write_text(json.dumps(manifest))
    check_tokenizer(old / "datasets" / "sotu_sp1024", OTHER_TOKENIZER)


def test_an_artifact_keeps_its_tokenizer_and_refuses_another(sotu_dataset, tmp_path):
    path = tmp_path / "a.pgolf"
    export_smoke(path, tokenizer_path=str(sotu_dataset.tokenizer_path), quant_format="mixed")
    assert read_pgolf_artifact(path).tokenizer_sha256 == file_sha256(sotu_dataset.tokenizer_path)
    load_weights(path, sotu_dataset.config())
    with pytest.raises(
        PgolfError, match=rf"artifact {path} was trained with another tokenizer than \S+fineweb_1024"
    ):
        load_weights(path, sotu_dataset.config().replace(tokenizer_path=str(OTHER_TOKENIZER)))
    old = tmp_path / "old.pgolf"  # written before artifacts kept it: read as before
    export_smoke(old, tokenizer_path=str(tmp_path / "absent.model"))
    assert read_pgolf_artifact(old).tokenizer_sha256 is None
    load_weights(old, sotu_dataset.config().replace(tokenizer_path=str(OTHER_TOKENIZER)))


@pytest.mark.slow  # a CLI eval: ~5 s
def test_eval_with_the_wrong_tokenizer_is_one_line(sotu_dataset, tmp_path):
    path = tmp_path / "a.pgolf"
    export_smoke(path)
    result = cli("eval", str(path), "--backend", "cuda", "--preset", "smoke", "--data-path",
                 str(sotu_dataset.data_path), "--tokenizer-path", str(OTHER_TOKENIZER))  # fmt: skip
    assert_one_line_error(result, "did not make dataset sotu_sp1024")


# ------------------------------------------------- a fit's files are named as documented
def test_a_fits_files_are_named_after_the_whole_artifact_name():
    artifact = Path("runs/r/final_model.int6.pgolf")
    assert fit_files(artifact) == (
        Path("runs/r/final_model.int6.pgolf.fit.json"),
        Path("runs/r/final_model.int6.pgolf.fit.toml"),
    )
