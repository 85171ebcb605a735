"""The artifact fit inside whole runs: `train` ending with the fit, and the fit under torchrun (rank 0
fits, the others wait for its settings in the process group's store, or for its failure).

Apart from tests/test_fit.py so that parallel workers (one file each) share the fit tests' time.
"""

from __future__ import annotations

import json
import re
import subprocess
from types import SimpleNamespace

import pytest

from core.common.errors import PgolfError
from core.config.fields import Config
from core.train.fitting import shared_fit
from tests.support import ROOT
from tests.support.artifacts import ARTIFACT, SHAPE
from tests.support.backends import needs, run_ranks
from tests.support.cli import cli, data_flags
from tests.torchrun_fit import CHOSEN


@needs("cuda")
@pytest.mark.slow  # two short runs and a fit
def test_train_ends_with_the_fit_and_its_config_trains_the_same_artifact(sotu_dataset, tmp_path):
    """The fit tries every compressor (pergroup too where lrzip is installed), then compresses each candidate
    with the one it picked (brotli here, at quality 11): the model is narrower than SHAPE's, for speed; the
    cap leaves it mixed bits and clips."""
    common = ["train", "--backend", "cuda", "--preset", "smoke", "--out-dir", str(tmp_path), *SHAPE, *ARTIFACT,
              "--model-dim", "32", "--mlp-mult", "4", *data_flags(sotu_dataset)]  # fmt: skip
    first = cli(*common, "--run-id", "a", env={"ARTIFACT_FIT_BYTES": "70000"})
    assert first.returncode == 0, first.stderr
    assert "fit: chosen" in first.stdout and "fit: compressor " in first.stdout
    (toml,) = (tmp_path / "a").glob("final_model.*.fit.toml")
    (artifact,) = (tmp_path / "a").glob("final_model.*.pgolf")
    total = int(
        next(line for line in first.stdout.splitlines() if line.startswith("Total submission")).split()[-3]
    )
    assert total <= 70_000
    # The config file alone (flags would override it): it holds every field.
    second = cli(
        "train", "--backend", "cuda", "--config", str(toml), "--out-dir", str(tmp_path), "--run-id", "b"
    )
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "b" / artifact.name).read_bytes() == artifact.read_bytes()


def test_one_process_gets_its_own_fit_and_a_failure_is_raised_as_it_is():
    class One:
        rank, world_size = 0, 1

        def from_rank_0(self, key, text, wait_seconds):
            return text

    cfg = Config().replace(artifact_fit_bytes=9)
    chosen = SimpleNamespace(cfg=cfg.replace(embed_bits=7, artifact_fit_bytes=0))
    assert shared_fit(One(), cfg, lambda: chosen) == (chosen.cfg, chosen)

    def fails():
        raise PgolfError("no room")

    with pytest.raises(PgolfError, match="^no room$"):
        shared_fit(One(), cfg, fails)


# PyTorch's ranks waiting past the collectives' timeout for a fit that chooses, or fails:
# test_two_ranks_train_and_score_the_fitted_artifact, test_a_fit_that_fails_on_rank_0_ends_both_ranks_with_its_line.
@pytest.mark.parametrize("mode", ["chooses", "fails"])
@needs("mlx")
@pytest.mark.slow  # two processes importing MLX
def test_the_other_rank_waits_for_a_fit(mode, tmp_path):
    """Rank 0's fit takes 1 s: rank 1 waits for its settings, or for its failure, which it ends with in one
    line; the job's collectives still work."""
    done = run_ranks("mlx", str(ROOT / "tests" / "torchrun_fit.py"), "mlx", mode, "1", "5", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = {path.name: path.read_text() for path in tmp_path.glob("rank*")}
    if mode == "fails":
        assert lines == {
            "rank0": "error: injected fit failure",
            "rank1": "error: rank 0's artifact fit failed: injected fit failure",
        }
    else:
        settings = json.loads(lines["rank1"])
        assert lines["rank0"] == lines["rank1"] and settings["fit_bytes"] == 0
        assert {k: settings[k] for k in CHOSEN} == CHOSEN


def two_ranks_train(sotu_dataset, tmp_path, *flags: str, **env: str) -> subprocess.CompletedProcess:
    """`train` of the shape above by two ranks under torchrun, fitted to 250,000 B keeping its compressor
    (fewer compressions), collectives timing out after 5 s; `env`: tests/torchrun_cli.py's settings."""
    args = [str(ROOT / "tests" / "torchrun_cli.py"), "train", "--backend", "cuda", "--preset", "smoke", "--out-dir", str(tmp_path), "--run-id", "a",
            *SHAPE, *ARTIFACT, "--artifact-fit-keep-compressor", "--iterations", "4", "--collective-timeout-seconds", "5",
            *data_flags(sotu_dataset), *flags]  # fmt: skip
    return run_ranks("cuda", *args, ARTIFACT_FIT_BYTES="250000", **env)


@needs("cuda")
@pytest.mark.slow  # ~35 s
def test_two_ranks_train_and_score_the_fitted_artifact(sotu_dataset, tmp_path):
    """Rank 0's fit takes 6 s more than it would, past the 5 s the collectives wait: rank 1 waits for its
    settings all the same."""
    done = two_ranks_train(sotu_dataset, tmp_path, TEST_FIT_SLEEP_SECONDS="6")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("fit: chosen") == 1 and "test: the fit slept 6 s first" in done.stdout  # rank 0
    total = int(next(ln for ln in done.stdout.splitlines() if ln.startswith("Total submission")).split()[-3])
    assert total <= 250_000
    # Both ranks read the artifact the fit named (int<N> where its matrices share their bits, else mixed).
    assert re.search(r"final_(mixed|int[5-8])_roundtrip val_loss", done.stdout), done.stdout[-3000:]


@needs("cuda")
@pytest.mark.slow  # ~20 s
def test_a_fit_that_fails_on_rank_0_ends_both_ranks_with_its_line(sotu_dataset, tmp_path):
    """Rank 0's fit takes 6 s more than it would, past the 5 s the collectives wait: rank 1 waits for its
    failure (had it given up first, torchrun would have stopped rank 0 before its line)."""
    done = two_ranks_train(sotu_dataset, tmp_path, "--artifact-fit-bytes", "1000", TEST_FIT_SLEEP_SECONDS="6")
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "test: the fit slept 6 s first" in output, output[-3000:]
    assert output.count("[rank0]: error: --fit-bytes 1,000: nothing fits") == 1, output[-3000:]
    # Rank 1 hears of it and leaves (torchrun may stop it first); no traceback from either rank.
    assert "[rank1]: stopped: rank 0 failed first" in output or "[rank1]: terminated" in output, output[
        -3000:
    ]
    assert "[rank0]: Traceback" not in output and "[rank1]: Traceback" not in output, output[-3000:]
