"""Every artifact written is read back (a compressor that corrupts, a disk that changes it), and the
lrzip program missing when reading or hung."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from pathlib import Path

import pytest

from core.artifact import container
from core.artifact.export import read_pgolf_artifact
from core.artifact.load import read_artifact, saved_config
from core.common import pergroup
from core.common.errors import PgolfError
from core.config.presets import preset
from core.model.params import init_params
from tests.support.artifacts import FAKE_LRZIP, export_smoke, make_checkpoint
from tests.support.cli import assert_one_line_error, cli


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


# ------------------------------------------------- every artifact written is read back
@pytest.mark.slow
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
    real = container.read_file
    monkeypatch.setattr(container, "read_file", lambda *a: real(*a)[:-1] + b"\x00")
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
@pytest.mark.slow
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


@pytest.mark.slow
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
