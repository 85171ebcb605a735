"""Shared fixtures: a small real dataset built from the embedded corpus, and the challenge files."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.artifact.mixed import quantize_mixed
from core.artifact.rowquant import Clip
from core.config.fields import Config
from core.config.presets import preset
from tests.helpers import hessian, model_state, ramp

CHALLENGE = Path(__file__).resolve().parent / "fixtures" / "challenge"  # the challenge's sp1024 files

if os.environ.get("PYTEST_XDIST_WORKER"):  # one of several workers: one thread each, and for what it starts
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, "1")


@dataclass(frozen=True)
class Dataset:
    root: Path
    data_path: Path
    tokenizer_path: Path
    vocab_size: int

    def config(self, name: str = "smoke", **changes) -> Config:
        """A preset pointed at this dataset."""
        return preset(name).replace(
            data_path=str(self.data_path),
            tokenizer_path=str(self.tokenizer_path),
            vocab_size=self.vocab_size,
            **changes,
        )


@pytest.fixture(scope="session")
def sotu_dataset(tmp_path_factory) -> Dataset:
    """The embedded corpus prepared from its first 40 speeches (4 validation), vocab 1024: seconds."""
    from core.datasets.embedded import prepare_sotu

    root = tmp_path_factory.mktemp("data")
    prepare_sotu(root, vocab_size=1024, limit_docs=40)
    return Dataset(root, root / "datasets" / "sotu_sp1024", root / "tokenizers" / "sotu_1024_bpe.model", 1024)


@pytest.fixture(scope="session")
def challenge_dir() -> Path:
    """The challenge's sp1024 tokenizer (fineweb_1024_bpe.model, .vocab) and export manifest.json."""
    return CHALLENGE


@pytest.fixture(scope="module")
def mixed_model():
    state, classes, dtypes = model_state()
    x = ramp((300, 256), 1.0, 65_537)
    return quantize_mixed(
        state,
        classes,
        bits={"embedding": 8, "attention": 6, "mlp": 5, "other": 7},
        clip={"embedding": Clip.percentile(0.9999), "mlp": Clip.sdclip(4.0)},
        hessians={"blocks.0.attn.c_q.weight": hessian(x)},
        orig_dtypes=dtypes,
    )


# The files whose tests take longest, longest first (`pytest --durations=0`, summed per file, on a
# 2-core CPU): parallel workers take whole files (`--dist loadfile`) in collection order, so these
# start first and the workers end together instead of one finishing a long file alone.
LONGEST_FIRST = ("test_fit_runs.py", "test_cli.py", "test_training.py", "test_fit.py", "test_ttt.py", "test_backends.py",
                 "test_package.py", "test_sweep.py", "test_cross_backend.py")  # fmt: skip


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
