"""Run folders for the tests: `fake_run`, the one written without training; small real runs; a packaged
script run alone; sweep specs; records folders written from figures; audits."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from core.artifact.load import load_checkpoint
from core.config.fields import Config
from core.runs import sweep as sw
from core.runs.audit import Audit, Calibration, Check
from core.train import loop
from core.train.managed import train_managed
from core.train.rundir import RunDir
from tests.support import PGOLF_PACKAGES, ROOT
from tests.support.backends import make_backend
from tests.support.cli import python

# ---------------------------------------- a run folder written without training
# The least of a config.json that a run's summary reads (its model: "2x64, vocab 1024").
SMALL_MODEL = {"num_layers": 2, "model_dim": 64, "vocab_size": 1024}


def fake_run(
    path: Path,
    config: Config | dict[str, Any] | None = None,
    *,
    records: Sequence[dict[str, Any]] = (),
    curve: int = 0,
    finished: bool = True,
    artifact: int | None = None,
    log: str | None = None,
    sweep: bool = False,
    failed: str = "",
    checkpoint: bool = False,
    **final: Any,
) -> Path:
    """A run folder at `path`, written without training, as `train` leaves it (with `sweep`, as a sweep's run):

    - config.json: `config` (a Config), or SMALL_MODEL with `config`'s fields over it; with `sweep`, the
      sweep's sweep_config.json too;
    - metrics.jsonl: `records` (a start record, the data's), then `curve` steps of training (a train record
      each step, a val record each second step, 100 ms a step), then, if `finished`, the final record: the
      curve's steps and time (1 step without one), a val_loss of 5.0 and half as much val_bpb, the artifact's
      size (1,000 bytes without one) and 234 code bytes, the fields of `final` over them;
    - final_model.int8.pgolf: `artifact` zero bytes (sparse), if given; train.log: the line `log`, if given;
    - sweep_failed.txt: the sweep's `failed` line; with `checkpoint`, an empty checkpoint of step 2."""
    settings = config.to_dict() if isinstance(config, Config) else {**SMALL_MODEL, **(config or {})}
    run = RunDir(path.parent, path.name)
    run.write_config(settings)
    if sweep:
        (path / sw.CONFIG_FILE).write_text(json.dumps(settings))
    (path / "metrics.jsonl").touch()  # a run's log, begun as it starts
    for record in records:
        run.metric(record)
    for step in range(1, curve + 1):
        run.metric({"kind": "train", "step": step, "train_loss": 6.0 - step, "train_time_ms": 100.0 * step})
        if step % 2 == 0:
            run.metric(
                {"kind": "val", "step": step, "val_bpb": 3.0 - 0.1 * step, "train_time_ms": 100.0 * step}
            )
    if artifact is not None:
        with open(run.artifact("int8"), "wb") as f:  # sparse
            f.truncate(artifact)
    if finished:
        steps = final.get("steps", curve or 1)
        loss = final.get("roundtrip_val_loss", 5.0)
        size = 1000 if artifact is None else artifact
        run.metric({"kind": "final", "steps": steps, "train_time_ms": 100.0 * steps, "roundtrip_val_loss": loss,
                    "roundtrip_val_bpb": loss / 2, "artifact_bytes": size, "code_bytes": 234} | final)  # fmt: skip
    if log is not None:
        run.log_line(log)
    if failed:
        (path / sw.FAILED_FILE).write_text(failed + "\n")
    if checkpoint:
        run.checkpoint_path(2).write_bytes(b"")
    run.close()
    return path


# ---------------------------------------- small training runs
def run(
    dataset, backend_name, tmp_path, run_id="run", resume=None, preset="smoke", step_progress=None, **changes
):
    """A real run of `preset` (smoke) on `dataset`, by pgolf's train on backend `backend_name`: its result."""
    cfg = dataset.config(preset, out_dir=str(tmp_path), run_id=run_id, **changes)
    backend = make_backend(backend_name, cfg)
    try:
        return train_managed(backend, resume=resume, log=lambda line: None, step_progress=step_progress)
    finally:
        backend.close()


def final_params(result) -> dict[str, np.ndarray]:
    (ckpt,) = sorted((result.run_dir / "checkpoints").glob("*.safetensors"))[-1:]
    return load_checkpoint(ckpt).params


def train_quietly(cfg, **kwargs):
    """A real run of `cfg` on the PyTorch backend: (its result, its log's lines)."""
    lines: list[str] = []
    backend = make_backend("cuda", cfg)
    try:
        # pgolf's train where an option asks for it (resume, stop), else a packaged script's
        run = train_managed if kwargs else loop.train
        return run(backend, log=lines.append, **kwargs), lines
    finally:
        backend.close()


# ---------------------------------------- a packaged script run alone
def run_alone(text: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """A train_gpt.py of `text` run alone in an empty folder, pgolf hidden, with `env` set."""
    here = tmp_path / "alone"
    here.mkdir(parents=True)
    (here / "train_gpt.py").write_text(text)
    environ = {k: v for k, v in os.environ.items() if k not in ("DATA_PATH", "TOKENIZER_PATH")}
    return run_isolated(here, environ | env, timeout=300)


def run_isolated(here: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    """`python train_gpt.py` in the folder `here` with pgolf not importable (ISOLATED), the environment
    `env` less PYTHONPATH: forked as `cli` is (tests/support/cli.py)."""
    (here / "isolated.py").write_text(ISOLATED.format(root=str(ROOT), packages=(*PGOLF_PACKAGES, "cli")))
    env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    return python(here / "isolated.py", "train_gpt.py", cwd=here, env=env, timeout=timeout)


# Runs a script with pgolf not importable: the editable install's finder, the repository and the modules
# the process has imported (tests/cli_server.py's) dropped.
ISOLATED = """
import importlib.util, runpy, sys
for name in [m for m in sys.modules if m.split(".")[0] in {packages!r}]:
    del sys.modules[name]
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path = [p for p in sys.path if p and p != {root!r}]
assert importlib.util.find_spec("core") is None, "pgolf is importable"
runpy.run_path(sys.argv[1], run_name="__main__")
"""


# ---------------------------------------- audits of run folders
def made_audit(path: Path, leak: int | None) -> Audit:
    check = Check(checked=900, max_change=0.0 if leak is None else 0.5, leak_position=leak,
                  leak_document=None if leak is None else 4, order_changed=False)  # fmt: skip
    calibration = Calibration("training shards only", ["fineweb_train_000000.bin"], [], "x.calibration.json")
    return Audit(str(path / "final_model.int8.pgolf"), "cuda", "ttt", 2049, 7, (1026, 2049), check, calibration,
                 1000, 500, 1.5, "cpu", 1.2, f"python cli.py audit {path}")  # fmt: skip


# ---------------------------------------- sweep specs
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


# ---------------------------------------- a records folder written from figures
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
