"""Backends for the tests: which are installed (the `needs(...)` markers), one built, busy weights, a batch,
the model switches; the frameworks' launchers of two processes; a process where they cannot be imported."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.model import backend as backends
from core.model.params import init_params
from tests.support import ROOT
from tests.support.cli import IMPORTABLE, python

requires_torch = pytest.mark.skipif(  # found, not imported: conftest sets its threads first
    importlib.util.find_spec("torch") is None, reason="torch is not installed (an independent reference here)"
)

# What a test of each backend needs: its framework's marker, and a skip when it is missing.
NEEDS = {
    name: [
        getattr(pytest.mark, info.framework),
        pytest.mark.skipif(not info.installed, reason=f"{info.framework} not installed"),
    ]
    for name, info in backends.BACKENDS.items()
}


BACKENDS = [pytest.param(name, marks=marks, id=name) for name, marks in NEEDS.items()]


def needs(name: str):
    """Decorator: the test needs this backend's framework (marked, and skipped without it)."""

    def mark(test):
        for m in NEEDS[name]:
            test = m(test)
        return test

    return mark


def make_backend(name: str, cfg):
    assert name in backends.BACKENDS, name
    return backends.create(name, cfg)


def busy_params(cfg, seed: int = 0) -> dict[str, np.ndarray]:
    """Init weights with every zero/one tensor perturbed, so every path of the model matters."""
    params = init_params(cfg)
    rng = np.random.default_rng(seed)
    for name, value in params.items():
        noise = rng.normal(0, 0.05 if value.ndim == 2 else 0.2, value.shape)
        params[name] = (value + noise).astype(np.float32)
    return params


def batch(cfg, n: int = 2, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    tokens = (
        np.random.default_rng(seed).integers(0, cfg.vocab_size, (n, cfg.train_seq_len + 1)).astype(np.int32)
    )
    return tokens[:, :-1], tokens[:, 1:]


# Depth recurrence and parallel lanes on a 5-layer smoke model: looping visits
# [0, 1, 2, 1, 2, 1, 2, 3, 4] (encoder [0, 1, 2, 1], decoder [2, 1, 2, 3, 4]), lanes from layer 3.
LOOPS_LANES = dict(num_layers=5, num_loops=2, loop_start=1, loop_end=2, parallel_start_layer=3)


# The smallest model with both, for the compile tests (compiling is slow on a CPU): looping visits
# [0, 1, 1, 2] (encoder [0, 1], decoder [1, 2]), not looping [0] | [1, 2]; lanes from layer 2.
SMALL_LOOPS_LANES = dict(num_layers=3, num_loops=1, loop_start=1, loop_end=1, parallel_start_layer=2)


# Every model switch of a block on at once (small: the numpy reference loops head by head). Not core's
# FEATURES (core/config/features.py: the optional modules a packaged script carries).
MODEL_SWITCHES = dict(
    mlp_mult=2.5, mlp_activation="leaky_relu2", rope_dims=8, ln_scale=True, xsa_last_n=2, ve_enabled=True,
    ve_dim=24, ve_layers="1,2", skip_gates_enabled=True, qk_gain_init=4.0, smear_gate_enabled=True,
    gate_window=8, attn_out_gate_enabled=True, attn_out_gate_src="q", varlen_attn_enabled=True,
    rope_precision="bfloat16",
)  # fmt: skip


# ---------------------------------------- launchers of two processes
def free_port(count: int = 1) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1 now. They are drawn below Linux's range
    for outgoing connections (32768 and up), where the kernel hands out a client's port: there an MLX
    ring's second port was once taken between this check and the ring's bind."""
    rng = random.Random()  # seeded from the system: two workers do not draw alike
    while True:
        first = rng.randrange(20_000, 32_768 - count)
        try:
            with contextlib.ExitStack() as stack:
                for port in range(first, first + count):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue


def launcher(backend_name: str, fresh_ranks: bool = False) -> list[str]:
    """Two processes on this machine. PyTorch: torchrun, its ranks forks of it with pgolf's imports done
    (tests/torchrun_forked.py; on Linux, as `python(...)`), or with `fresh_ranks` torchrun's own fresh
    interpreters; MLX: tests/mlx_ranks.py, which starts them as mlx.launch does without spinning cores
    while they run (`mlx_launch` is MLX's own)."""
    if backend_name == "cuda":
        fresh = fresh_ranks or sys.platform != "linux"
        torchrun = ["-m", "torch.distributed.run"] if fresh else [str(ROOT / "tests" / "torchrun_forked.py")]
        return [sys.executable, *torchrun, "--standalone", "--nproc_per_node=2", "--master_addr=127.0.0.1"]
    return [sys.executable, str(ROOT / "tests" / "mlx_ranks.py"), str(free_port(2)), sys.executable]


def run_ranks(
    backend_name: str, *args: str, cwd: Path | None = None, fresh_ranks: bool = False, **env: str
) -> subprocess.CompletedProcess:
    """`launcher(backend_name, fresh_ranks) ARGS` run to its end, output captured, `env` set over
    torchrun_env's; the launcher (torchrun, or tests/mlx_ranks.py) forked from the CLI server."""
    return python(
        *launcher(backend_name, fresh_ranks)[1:], *args, cwd=cwd, env=torchrun_env(**env), timeout=600
    )


def mlx_launch() -> list[str]:
    """MLX's own launcher for two processes on this machine (the one a user runs)."""
    mlx_launch = Path(sys.executable).parent / "mlx.launch"
    if not mlx_launch.exists():
        pytest.skip(f"{mlx_launch} not found")
    # The ring backend listens on two consecutive ports from --starting-port.
    return [str(mlx_launch), "-n", "2", "--backend", "ring", "--starting-port", str(free_port(2)), "--",
            sys.executable]  # fmt: skip


def torchrun_env(**extra: str) -> dict[str, str]:
    # Loopback only: gloo otherwise picks an interface from the host name, which can fail.
    return {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", **extra}


# ---------------------------------------- core/ without a framework
BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'mlx'):
            raise ImportError(f'{name} is blocked in this test')
sys.meta_path.insert(0, Block())
"""


def run_blocked(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + code],
        env=os.environ | IMPORTABLE,
        capture_output=True,
        text=True,
        timeout=120,
    )
