"""Shared fixtures: a small real dataset built from the embedded corpus, the challenge files, a mixed-format
model, a checkpoint; and the suite made hermetic (`hermetic` below). What they are built from, and what the
tests share besides, is in tests/support/ by subject."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from core.artifact.checkpoint import Checkpoint, save_checkpoint
from core.artifact.mixed import quantize_mixed
from core.artifact.rowquant import Clip
from core.config.fields import ENV_ALIASES, field_names
from core.config.presets import PRESETS, RECORD_ENV_MARKS, preset
from tests.support.artifacts import hessian, model_state, ramp
from tests.support.data import CHALLENGE, Dataset

# Hermetic: no setting of the user's environment reaches a test or what it starts (config fields' upstream
# names, a record's marks, torchrun's ranks, pgolf's cache folder).
for name in [*(n.upper() for n in field_names()), *ENV_ALIASES, *(m for ms in RECORD_ENV_MARKS.values() for m in ms),
             "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "PGOLF_CACHE_DIR", "XDG_CACHE_HOME"]:  # fmt: skip
    os.environ.pop(name, None)

if os.environ.get("PYTEST_XDIST_WORKER"):  # one of several workers: one thread each, and for what it starts
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, "1")

# Ctrl-C is Ctrl-C in every test: a shell starts a background job with SIGINT ignored, and the processes a
# test starts would inherit that and never see the SIGINT a test sends them. A Python handler here becomes
# the default action in what this process executes (and Python's own handler in a Python child).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# A system OpenBLAS (Debian's libopenblas0-pthread) makes MLX's fp32 matmuls on a Linux CPU several times
# faster when it is preloaded (speed only: the same numbers). A library is preloaded only when a process
# starts, so the parent of the workers sets it for them and for every process a test starts, with its
# thread count (read when it loads): one, as the workers' other frameworks.
SYSTEM_OPENBLAS = Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0")
if not os.environ.get("PYTEST_XDIST_WORKER") and "LD_PRELOAD" not in os.environ and SYSTEM_OPENBLAS.is_file():
    os.environ.update(LD_PRELOAD=str(SYSTEM_OPENBLAS), OPENBLAS_NUM_THREADS="1")


@pytest.fixture(scope="session")
def sotu_dataset(tmp_path_factory) -> Dataset:
    """The embedded corpus prepared from its first 40 speeches (4 validation), vocab 1024: seconds."""
    from core.datasets.embedded import prepare_sotu

    root = tmp_path_factory.mktemp("data")
    prepare_sotu(root, vocab_size=1024, limit_docs=40)
    return Dataset(root, root / "datasets" / "sotu_sp1024", root / "tokenizers" / "sotu_1024_bpe.model", 1024)


@pytest.fixture(scope="session", autouse=True)
def hermetic(tmp_path_factory) -> Path:
    """Every test, and every process it starts, runs in a folder of its own whose data/ holds a foreign
    tokenizer (the challenge's) at each preset's tokenizer path: a test that reads the data/ of the folder
    it runs in, as the checkout's would be, instead of the dataset it was given, fails. The minified-source
    cache and PyTorch's compiled-kernel caches are this run's, not the user's: a run compiles as on a fresh
    machine, an earlier run's kernels standing in neither for its compiles nor in its timings."""
    here = tmp_path_factory.mktemp("cwd")
    for name in PRESETS:
        path = here / preset(name).tokenizer_path
        if path.is_relative_to(here / "data"):
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(CHALLENGE / "fineweb_1024_bpe.model", path)
    run = tmp_path_factory.getbasetemp()
    run = run.parent if os.environ.get("PYTEST_XDIST_WORKER") else run  # the workers of one run share it
    os.environ["PGOLF_CACHE_DIR"] = str(run / "pgolf-cache")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(run / "torchinductor")
    os.environ["TRITON_CACHE_DIR"] = str(run / "triton")
    before = Path.cwd()
    os.chdir(here)
    yield here
    os.chdir(before)


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


@pytest.fixture
def checkpoint(tmp_path):
    """A saved checkpoint of two small tensors (with their moving average) and the tiny preset's config."""
    cfg = preset("tiny").replace(ema_decay=0.5)
    params = {"w": np.ones((2, 3), np.float32)}
    ckpt = Checkpoint(params, {"ema/w": np.full((2, 3), 2, np.float32)}, cfg.to_dict(), dtypes={"w": "bf16"})
    return save_checkpoint(tmp_path / "step_000004.safetensors", ckpt)


# The files whose tests take longest, longest first (`pytest --durations=0`, summed per file, on a
# 2-core CPU): parallel workers take whole files (`--dist loadfile`) in collection order, so these
# start first and the workers end together instead of one finishing a long file alone.
LONGEST_FIRST = ("test_training.py", "test_ttt.py", "test_backends.py", "test_package.py", "test_fit.py",
                 "test_fit_runs.py", "test_gpu_check.py", "test_trajectories.py", "test_cli.py",
                 "test_cross_backend.py", "test_memory.py", "test_sweep.py", "test_files.py", "test_audit.py")  # fmt: skip


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
