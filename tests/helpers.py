"""Helpers the test modules share."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from core.artifact import container, int8_format
from core.artifact import quantized as quant
from core.artifact.checkpoint import Checkpoint, checkpoint_digest
from core.artifact.export import export_artifact
from core.artifact.load import (
    load_checkpoint,
)
from core.artifact.quantized import FLOAT_BYTES, Int8Model, model_parts
from core.config.fields import Config
from core.config.presets import preset
from core.data.tables import ByteTables
from core.model import backend as backends
from core.model.params import init_params, storage_dtypes
from core.runs import sweep as sw
from core.runs.audit import (
    Audit,
    Calibration,
    Check,
)
from core.train import loop
from core.train.managed import train_managed
from core.train.rundir import RunDir

ROOT = Path(__file__).resolve().parent.parent  # the checkout
CHALLENGE = ROOT / "tests" / "fixtures" / "challenge"  # the challenge's sp1024 tokenizer and manifest
# A process started in the folder the suite runs in (conftest.py: hermetic), not the checkout, imports pgolf by this.
IMPORTABLE = {"PYTHONPATH": str(ROOT)}
requires_torch = pytest.mark.skipif(  # found, not imported: conftest sets its threads first
    importlib.util.find_spec("torch") is None, reason="torch is not installed (an independent reference here)"
)


# ---------------------------------------- backends: which are installed, one built, busy weights, a batch, feature sets
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


# Every block feature on at once (small: the numpy reference loops head by head).
FEATURES = dict(
    mlp_mult=2.5, mlp_activation="leaky_relu2", rope_dims=8, ln_scale=True, xsa_last_n=2, ve_enabled=True,
    ve_dim=24, ve_layers="1,2", skip_gates_enabled=True, qk_gain_init=4.0, smear_gate_enabled=True,
    gate_window=8, attn_out_gate_enabled=True, attn_out_gate_src="q", varlen_attn_enabled=True,
    rope_precision="bfloat16",
)  # fmt: skip


# ---------------------------------------- the CLI in a process of its own, its one-line errors


class CLIServer:
    """tests/cli_server.py, started on first use: it forks each `cli.py` command from a process that has
    imported PyTorch and the rest already (one or two seconds less of CPU a command)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.lines: queue.Queue[str] = queue.Queue()

    def run(
        self, args: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "cli_server.py")], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True,
                env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
            )  # fmt: skip
            self.lines = queue.Queue()
            threading.Thread(target=self._read, args=(self.process.stdout, self.lines), daemon=True).start()
        folder = Path(os.environ["PGOLF_CACHE_DIR"]).parent / "cli-output" / str(os.getpid())
        folder.mkdir(parents=True, exist_ok=True)
        out, err = folder / "stdout", folder / "stderr"
        request = {"args": args, "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err)}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        pid = int(self._line("pid", 60))
        try:
            code = int(self._line("exit", timeout))
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            self._line("exit", 60)
            raise
        return subprocess.CompletedProcess(
            ["cli.py", *args], code, out.read_text(errors="replace"), err.read_text(errors="replace")
        )

    @staticmethod
    def _read(stream, lines: queue.Queue) -> None:
        for line in stream:
            lines.put(line)
        lines.put("")  # the server ended

    def _line(self, word: str, timeout: float) -> str:
        """The value of the server's next line, `WORD <value>`; TimeoutExpired after `timeout` s."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise subprocess.TimeoutExpired(f"cli.py ({word})", timeout) from None
        head, _, value = line.strip().partition(" ")
        if head != word:
            raise RuntimeError(f"cli_server ended or said {line!r} instead of {word} <value>")
        return value


CLI_SERVER = CLIServer()


def cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python cli.py ARGS` in a process of its own, its output captured: what subprocess.run gives. On Linux
    forked from CLI_SERVER; elsewhere started afresh (macOS's system frameworks, which PyTorch loads, are not
    safe to use in a forked process)."""
    env = {**os.environ, **(env or {})}
    if sys.platform == "linux":
        return CLI_SERVER.run(list(args), cwd or Path.cwd(), env, timeout=300)
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip


def data_flags(dataset) -> list[str]:
    return ["--data-path", str(dataset.data_path), "--tokenizer-path", str(dataset.tokenizer_path)]


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def cli_after(setup: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python cli.py ARGS` in a fresh process that first runs the Python lines `setup` (which replace a
    hook, e.g. to stop the process at one step): the command's own signal handling and exit status."""
    code = f"import sys\n{setup}\nsys.argv = ['cli.py', *{list(args)!r}]\nimport cli\ncli.main()\n"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=os.environ | IMPORTABLE)  # fmt: skip


def read_until(process: subprocess.Popen, prefix: str) -> list[str]:
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return lines
    raise AssertionError(f"no line starting {prefix!r} in {''.join(lines)}{process.stderr.read()}")


# ---------------------------------------- small training runs, launchers of two processes
def run(
    dataset, backend_name, tmp_path, run_id="run", resume=None, preset="smoke", step_progress=None, **changes
):
    cfg = dataset.config(preset, out_dir=str(tmp_path), run_id=run_id, **changes)
    backend = make_backend(backend_name, cfg)
    try:
        return train_managed(backend, resume=resume, log=lambda line: None, step_progress=step_progress)
    finally:
        backend.close()


def final_params(result) -> dict[str, np.ndarray]:
    (ckpt,) = sorted((result.run_dir / "checkpoints").glob("*.safetensors"))[-1:]
    return load_checkpoint(ckpt).params


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launcher(backend_name: str) -> list[str]:
    """The framework's own launcher for two processes on this machine."""
    if backend_name == "cuda":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                "--master_addr=127.0.0.1"]  # fmt: skip
    mlx_launch = Path(sys.executable).parent / "mlx.launch"
    if not mlx_launch.exists():
        pytest.skip(f"{mlx_launch} not found")
    # The ring backend listens on two consecutive ports from --starting-port.
    return [str(mlx_launch), "-n", "2", "--backend", "ring", "--starting-port", str(free_port()), "--",
            sys.executable]  # fmt: skip


def torchrun_env(**extra: str) -> dict[str, str]:
    # Loopback only: gloo otherwise picks an interface from the host name, which can fail.
    return {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", **extra}


# ---------------------------------------- test-time training's legal setting and stand-ins
LEGAL_CFG = preset("smoke").replace(
    ttt_enabled=True, ttt_lora_rank=4, ttt_lora_alpha=8.0, ttt_lora_lr=0.01, ttt_chunk_size=8,
    ttt_eval_seq_len=24, ttt_batch_size=3, ttt_grad_steps=2, phased_ttt_prefix_docs=4,
    phased_ttt_num_phases=1, global_ttt_lr=0.05, global_ttt_chunk_tokens=32, global_ttt_batch_seqs=2,
    eval_seq_len=16,
)  # fmt: skip


def stream(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lengths = (5, 40, 17, 3, 60, 25, 9, 33)
    return np.concatenate([np.concatenate([[1], rng.integers(2, 1024, size=n)]) for n in lengths]).astype(
        np.int32
    )


def unit_tables(vocab: int) -> ByteTables:
    return ByteTables(np.ones(vocab, np.int16), np.zeros(vocab, bool), np.zeros(vocab, bool))


class AdaptsFirst:
    """A backend's `TTT` whose adapters train on a chunk before it is scored."""

    def __init__(self, ttt):
        self.inner = ttt

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def score_then_adapt(self, adapters, x, y, train_rows, train_from, train_len):
        self.inner.score_then_adapt(adapters, x, y, train_rows | True, train_from, train_len)
        return self.inner.score_then_adapt(adapters, x, y, train_rows, train_from, train_len)


# ---------------------------------------- checkpoints
def make_checkpoint() -> Checkpoint:
    cfg = preset("smoke")
    params = init_params(cfg)
    optimizer = {"step": np.array(3, dtype=np.int64)}
    optimizer.update({f"exp_avg/{k}": np.full_like(v, 0.5) for k, v in params.items()})
    return Checkpoint(
        params=params,
        optimizer=optimizer,
        config=cfg.to_dict(),
        step=3,
        train_time_ms=1234.5,
        data_state={"file_index": 0, "position": 99, "epoch": 1},
        backend="cuda",
        dtypes={k: "float32" for k in params},
    )


def rewrite_metadata(path, change, sign: bool = True) -> None:
    """Re-save a checkpoint with its JSON metadata replaced by change(metadata), with a checksum
    that matches the change when `sign` (as a writer that meant it would)."""
    from safetensors.numpy import load_file, save_file

    blob = path.read_bytes()
    header = json.loads(blob[8 : 8 + int.from_bytes(blob[:8], "little")])
    meta = change(json.loads(header["__metadata__"]["pgolf"]))
    tensors = load_file(path)
    if sign and isinstance(meta, dict):
        meta["sha256"] = checkpoint_digest(tensors, meta)
    save_file(tensors, path, metadata={"pgolf": json.dumps(meta)})


# ---------------------------------------- fuzzing: hypothesis settings, hangs
FUZZ_EXAMPLES = int(os.environ.get("PGOLF_FUZZ_EXAMPLES", "60"))


HANG_SECONDS = 20.0


FUZZ = settings(
    max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def run_within(seconds: float, fn, unblock=None) -> tuple[object, BaseException | None]:
    """(fn()'s result, None) or (None, what it raised), failing the test when fn takes longer than
    `seconds` (a hang, or a read that never ends); `unblock()` is then called to free it."""
    outcome: dict = {}

    def call() -> None:
        try:
            outcome["done"] = (fn(), None)
        except BaseException as exc:  # handed to the test's thread
            outcome["done"] = (None, exc)

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive() and unblock is not None:
        unblock()
    assert "done" in outcome, f"still running after {seconds} s"
    return outcome["done"]


# ---------------------------------------- the int8 format
# The challenge script's own rule for the tensors its int8 format keeps in fp32.
CONTROL_PATTERNS = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weight")


def quantize(state: dict[str, np.ndarray], dtypes: dict[str, str] | None = None) -> quant.Int8Model:
    """int8_format.quantize_int8 with the classes the challenge's name patterns give (control = fp32)."""
    classes = {n: "control" for n in state if any(c in n for c in CONTROL_PATTERNS)}
    return int8_format.quantize_int8(state, dtypes, classes)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def golden_state() -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Fixed weights from integer arithmetic alone: the same on every platform and numpy version."""

    def ramp(shape: tuple[int, ...], scale: float, mult: int) -> np.ndarray:
        k = (np.arange(int(np.prod(shape)), dtype=np.int64) * mult) % 2001 - 1000
        return (k * (scale / 1000)).astype(np.float32).reshape(shape)

    state = {
        "tok_emb.weight": ramp((300, 256), 0.02, 2_654_435_761),
        "blocks.0.mlp.fc.weight": ramp((512, 160), 0.05, 40_503),
        "blocks.0.attn.q_gain": np.full(4, 1.5, np.float32),
        "extra.cube": ramp((20, 60, 60), 0.1, 97),
        "extra.bias": ramp((64,), 0.3, 13),
        "extra.step": np.array([7], np.int64),
    }
    return state, {"tok_emb.weight": "bfloat16"}


def equal_weights(a: quant.Int8Model, b: quant.Int8Model) -> bool:
    x, y = int8_format.dequantize_int8(a), int8_format.dequantize_int8(b)
    return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)


class RunsCode:
    """Unpickling this creates a directory: the harm a pickle can do."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (os.mkdir, (str(self.target),))


# ---------------------------------------- the mixed format's weights
def ramp(shape: tuple[int, ...], scale: float, mult: int) -> np.ndarray:
    """Fixed weights from integer arithmetic alone: the same on every platform."""
    k = (np.arange(int(np.prod(shape)), dtype=np.int64) * mult) % 2001 - 1000
    return (k * (scale / 1000)).astype(np.float32).reshape(shape)


def model_state() -> tuple[dict[str, np.ndarray], dict[str, str], dict[str, str]]:
    """(state, classes, orig_dtypes): a small model with every kind of tensor."""
    state = {
        "tok_emb.weight": ramp((300, 256), 2.0, 2_654_435_761),
        "blocks.0.attn.c_q.weight": ramp((272, 256), 1.5, 40_503),
        "blocks.0.mlp.fc.weight": ramp((264, 256), 3.0, 97),
        "blocks.0.mlp.proj.weight": ramp((256, 264), 3.0, 7919),
        "blocks.0.attn_scale": ramp((256,), 0.5, 13) + 1,
        "skip_weights": ramp((2, 40_000), 0.5, 3) + 1,  # a large control tensor: fp32 all the same
        "blocks.0.attn.q_gain": np.full(4, 1.5, np.float32),
        "extra.vector": ramp((70_000,), 2.0, 31),  # not a matrix: one scale
        "extra.small": ramp((8, 8), 0.1, 5),
        "step": np.array([7], np.int64),
    }
    classes = {
        "tok_emb.weight": "embedding",
        "blocks.0.attn.c_q.weight": "attention",
        "blocks.0.mlp.fc.weight": "mlp",
        "blocks.0.mlp.proj.weight": "mlp",
        "blocks.0.attn_scale": "control",
        "skip_weights": "control",
        "blocks.0.attn.q_gain": "control",
        "extra.vector": "other",
        "extra.small": "other",
        "step": "other",
    }
    return state, classes, {"tok_emb.weight": "bfloat16"}


# ---------------------------------------- GPTQ's Hessian
def hessian(inputs: np.ndarray) -> np.ndarray:
    """H = X^T X (float32) for inputs X of shape (..., cols): what a calibration pass sums per layer."""
    x = np.asarray(inputs, dtype=np.float32)
    x = x.reshape(-1, x.shape[-1])
    return x.T @ x


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


# ---------------------------------------- the lrzip program
NEEDS_LRZIP = pytest.mark.skipif(
    shutil.which("lrzip") is None, reason="the lrzip program is not installed (apt-get install lrzip)"
)


# ---------------------------------------- the artifact fit's run shape
# record_0401_tiny's artifact at a size the tests can afford: an embedding (1024 x 96) and MLP
# matrices (768 x 96) past the 65,536-value floor, GPTQ, a byte shuffle. One layer: each candidate
# the fits evaluate is quantized, compressed and scored, and a second layer would add 60% to each.
SHAPE = ["--num-layers", "1", "--model-dim", "96", "--mlp-mult", "8", "--iterations", "30",
         "--warmdown-iters", "10"]  # fmt: skip


ARTIFACT = ["--quant-format", "mixed", "--gptq-enabled", "--gptq-calibration-batches", "2",
            "--compressor", "lzma", "--byte-shuffle", "2", "--artifact-fit-tokens", "1024"]  # fmt: skip


# ---------------------------------------- run folders
def make_run(root, name, steps=4, finished=True, **config):
    run = RunDir(root, name)
    run.write_config({"num_layers": 2, "model_dim": 64, "vocab_size": 1024, **config})
    for step in range(1, steps + 1):
        run.metric({"kind": "train", "step": step, "train_loss": 6.0 - step, "train_time_ms": 100.0 * step})
        if step % 2 == 0:
            run.metric(
                {"kind": "val", "step": step, "val_bpb": 3.0 - 0.1 * step, "train_time_ms": 100.0 * step}
            )
    if finished:
        run.metric(
            {"kind": "final", "steps": steps, "train_time_ms": 100.0 * steps, "roundtrip_val_bpb": 2.5,
             "artifact_bytes": 1000, "code_bytes": 234}
        )  # fmt: skip
    return run.path


# ---------------------------------------- dataset folders
def digest(root):
    """sha256 of every file by path, a dataset's shards under the name of its link (not of its version)."""
    return {
        re.sub(r"^datasets/\.(.+)-\d+/", r"datasets/\1/", p.relative_to(root).as_posix()): hashlib.sha256(
            p.read_bytes()
        ).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# ---------------------------------------- a stand-in lrzip program
# A stand-in for the lrzip program: its stream header (b"LRZI", version, uint64 size) around the bytes
# as they are. FAKE_LRZIP=corrupt flips one byte when compressing; =hang never ends a decompression.
FAKE_LRZIP = """#!{python}
import os, sys, time
args = sys.argv[1:]
data = open(args[-1], "rb").read()
mode = os.environ.get("FAKE_LRZIP", "")
if "-d" in args:
    if mode == "hang":
        time.sleep(3600)
    body = data[14:]
else:
    body = bytearray(data)
    if mode == "corrupt":
        body[len(body) // 2] ^= 0x01
    body = b"LRZI\\x00\\x06" + len(data).to_bytes(8, "little") + bytes(body)
open(args[args.index("-o") + 1], "wb").write(body)
"""


# ---------------------------------------- a small int8 artifact
def small_artifact(path: Path, **renames: str) -> Path:
    """The int8 artifact of fresh `tiny` weights, some parameters renamed."""
    params = init_params(preset("tiny"))
    for old, new in renames.items():
        params[new] = params.pop(old)
    container.write_artifact(path, int8_format.artifact_bytes(int8_format.quantize_int8(params)), "zlib")
    return path


# ---------------------------------------- a smoke export
def export_smoke(path: Path, compressor: str = "zlib", tokenizer_path: str | None = None, **changes):
    """The artifact of fresh weights; with pergroup, of `tiny` ones (its embedding is big enough to be
    quantized, so that lrzip has a group to compress)."""
    cfg = preset("tiny" if compressor == "pergroup" else "smoke").replace(compressor=compressor, **changes)
    if tokenizer_path is not None:
        cfg = cfg.replace(tokenizer_path=tokenizer_path)
    return export_artifact(init_params(cfg), cfg, storage_dtypes(cfg, False), path, 0)


# ---------------------------------------- a training run, its log kept
def train_quietly(cfg, **kwargs):
    lines: list[str] = []
    backend = make_backend("cuda", cfg)
    try:
        # pgolf's train where an option asks for it (resume, stop), else a packaged script's
        run = train_managed if kwargs else loop.train
        return run(backend, log=lines.append, **kwargs), lines
    finally:
        backend.close()


# ---------------------------------------- the challenge's export statistics of an int8 model (its torch script logs them)
def int8_stats(
    state: dict[str, np.ndarray], model: Int8Model, orig_dtypes: dict[str, str] | None = None
) -> dict[str, int]:
    """Counts and bytes of `model`, the int8 quantization of `state` (`orig_dtypes`: the dtype each
    weight had in the model, as given to quantize_int8): parameters, tensors (float ones quantized,
    non-float ones), the tensors' bytes in the model, and the bytes the int8 model stores."""
    orig_dtypes = orig_dtypes or {}
    arrays = {name: np.asarray(value) for name, value in state.items()}
    floats = {name for name, t in arrays.items() if np.issubdtype(t.dtype, np.floating)}
    baseline = sum(
        t.size * FLOAT_BYTES[orig_dtypes.get(name, t.dtype.name)] if name in floats else t.nbytes
        for name, t in arrays.items()
    )
    return {
        "param_count": int(sum(t.size for t in arrays.values())),
        "num_tensors": len(arrays),
        "num_float_tensors": len(model.quantized),
        "num_nonfloat_tensors": len(arrays) - len(floats),
        "baseline_tensor_bytes": int(baseline),
        "int8_payload_bytes": int(
            sum(a.nbytes for part in model_parts(model).values() for a in part.values())
        ),
    }


# ---------------------------------------- the artifact fit's stand-ins
NUMPY_CODE_BYTES = 40_000


def stand_in_loss(params):
    """The weights' squared distance to the float ones: a loss with no backend."""
    return lambda weights: float(sum(np.square(weights[n] - params[n]).sum() for n in params))


# ---------------------------------------- a packaged script run alone
def run_alone(text: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """A train_gpt.py of `text` run alone in an empty folder, pgolf hidden, with `env` set."""
    here = tmp_path / "alone"
    here.mkdir(parents=True)
    (here / "train_gpt.py").write_text(text)
    (here / "isolated.py").write_text(ISOLATED.format(root=str(ROOT)))
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATA_PATH", "TOKENIZER_PATH")}
    return subprocess.run([sys.executable, "isolated.py", "train_gpt.py"], cwd=here, env=environ | env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def assert_one_line(result: subprocess.CompletedProcess, *names: str) -> None:
    """Exit 1 with one `error:` line naming `names`, no traceback (the encoded blob is 40 KB), no cli.py."""
    assert result.returncode == 1, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "cli.py" not in lines[0] and len(lines[0]) < 400
    assert all(name in lines[0] for name in names), lines[0]
    assert "step:" not in result.stdout


# ---------------------------------------- audits of run folders
def fake_run(folder: Path, seed: int) -> Path:
    """A finished run's files, as `package` reads them (no weights: the audit below is given)."""

    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(Config(seed=seed).to_dict()))
    record = {"kind": "final", "steps": 1, "train_time_ms": 1.0, "roundtrip_val_loss": 2.0,
              "roundtrip_val_bpb": 1.0, "artifact_bytes": 10, "code_bytes": 5}  # fmt: skip
    (folder / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    (folder / "train.log").write_text("log\n")
    (folder / "final_model.int8.pgolf").write_bytes(b"0123456789")  # the 10 bytes its final record says
    return folder


def made_audit(path: Path, leak: int | None) -> Audit:
    check = Check(checked=900, max_change=0.0 if leak is None else 0.5, leak_position=leak,
                  leak_document=None if leak is None else 4, order_changed=False)  # fmt: skip
    calibration = Calibration("training shards only", ["fineweb_train_000000.bin"], [], "x.calibration.json")
    return Audit(str(path / "final_model.int8.pgolf"), "cuda", "ttt", 2049, 7, (1026, 2049), check, calibration,
                 1000, 500, 1.5, "cpu", 1.2, f"python cli.py audit {path}")  # fmt: skip


# ---------------------------------------- a packaged script's isolation
# Runs a script with pgolf not importable: the editable install's finder and the repository dropped.
ISOLATED = """
import importlib.util, runpy, sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path = [p for p in sys.path if p and p != {root!r}]
assert importlib.util.find_spec("core") is None, "pgolf is importable"
runpy.run_path(sys.argv[1], run_name="__main__")
"""


# ---------------------------------------- sweep specs and their runs
def write_spec(tmp_path, text: str, name: str = "s.toml"):
    path = tmp_path / name
    path.write_text(f'out_dir = "{tmp_path / "runs"}"\n' + text)
    return path


VARIANTS = """
name = "abl"
preset = "smoke"
seeds = [1, 2, 3]
[base]
iterations = 3
[[variants]]
name = "lr_low"
matrix_lr = 0.02
[[variants]]
name = "wide"
mlp_mult = 3.0
"""


def fake_sweep_run(
    run: sw.PlannedRun, loss: float | None, failed: str = "", checkpoint: bool = False
) -> None:
    """A run folder as the sweep leaves it: finished with `loss` (its val_bpb is loss / 2), or not."""
    folder = RunDir(run.path.parent, run.run_id)
    (run.path / sw.CONFIG_FILE).write_text(json.dumps(run.cfg.to_dict()))
    folder.write_config(run.cfg.to_dict())
    for step in (1, 2, 3):
        folder.metric({"kind": "val", "step": step, "train_time_ms": 10.0 * step, "val_bpb": 4.0 - step / 10})
    if loss is not None:
        folder.metric({"kind": "final", "steps": 3, "train_time_ms": 30.0, "roundtrip_val_bpb": loss / 2,
                       "roundtrip_val_loss": loss, "artifact_bytes": 10, "code_bytes": 10})  # fmt: skip
    if failed:
        (run.path / sw.FAILED_FILE).write_text(failed + "\n")
    if checkpoint:
        (run.path / "checkpoints" / "step_000002.safetensors").write_bytes(b"")
    folder.close()


# ---------------------------------------- a record folder written from figures
SEEDS = {"42": (2.5252358, 1.0974384, 15_915_268), "1337": (2.5264105, 1.0979497, 15_905_460),
         "2025": (2.5269013, 1.0981628, 15_927_782)}  # fmt: skip


def write_folder(path: Path, seeds: dict = SEEDS) -> Path:
    path.mkdir(parents=True)
    (path / "README.md").write_text("# A record\n")
    (path / "train_gpt.py").write_text("print('train')\n")
    mean = sum(v[1] for v in seeds.values()) / len(seeds)
    submission = {
        "author": "A. Golfer", "github_id": "ag", "name": "test", "date": "2026-04-01", "track": "10min_16mb",
        "val_loss": round(sum(v[0] for v in seeds.values()) / len(seeds), 5), "val_bpb": round(mean, 5),
        "seeds": [int(s) for s in seeds],
        "seed_results": {s: {"val_loss": round(v[0], 5), "val_bpb": round(v[1], 5), "artifact_bytes": v[2]}
                         for s, v in seeds.items()},
        "bytes_total": max(v[2] for v in seeds.values()), "bytes_code": 68_206,
    }  # fmt: skip
    (path / "submission.json").write_text(json.dumps(submission, indent=2))
    for seed, (loss, bpb, total) in seeds.items():
        (path / f"train_seed{seed}.log").write_text(log_text(seed, loss, bpb, total))
    return path


# ---------------------------------------- a record folder's log
def log_text(seed: str, loss: float, bpb: float, total: int, code: int = 68_206) -> str:
    """A log as the records write it: the script's source first, step validations, the sizes, the scores."""
    return "\n".join([
        'log0(f"final_int6_sliding_window val_loss:{val_loss:.8f} val_bpb:{val_bpb:.8f}")',  # source, not a figure
        "    seed = int(os.environ.get('SEED', 1337))",
        f"seed: {seed}",
        "0/20000 val_loss: 8.3187 val_bpb: 3.6152",
        "5967/20000 val_loss: 2.5434 val_bpb: 1.1053",
        "pre-quantization post-ema val_loss:2.54059689 val_bpb:1.10411414 eval_time:1741ms",
        f"Serialized model int6+brotli: {total - code} bytes",
        f"Total submission size int6+brotli: {total} bytes",
        f"final_int6_roundtrip val_loss:{loss + 0.04:.8f} val_bpb:{bpb + 0.018:.8f} eval_time:5122ms",
        f"final_int6_sliding_window stride:64 val_loss:{loss:.8f} val_bpb:{bpb:.8f} eval_time:65493ms",
        "",
    ])  # fmt: skip
