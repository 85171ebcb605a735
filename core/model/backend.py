"""The backends: the one registry of them, and the small interface each implements for `core.train.loop`.

The driver owns everything framework-neutral (data, schedules, timing,
validation, logging, checkpoints, export). A backend owns only the model, the
optimizers and the collectives, and exchanges state as numpy in the canonical
layout of `core.model.params`:

- parameters: `{name: float32 array}` with the names of `param_specs`;
- optimizer state: `{"step": int64 0-d array}` (optimizer steps taken) plus, per
  parameter, `"exp_avg/<name>"` and `"exp_avg_sq/<name>"` (Adam groups) or
  `"momentum_buffer/<name>"` (Muon group), and `"ema/<name>"` when `ema_decay` > 0,
  all float32.

A backend is the module `<package>.backend` of its entry in BACKENDS, with a
function `create_backend(cfg)` and `check_config(cfg)` (the config options that only it reads); its
module `<package>.memory` says how much memory its device has (`device_memory(cfg)`:
core/model/memory.py checks a run against it); its module `<package>.ttt` holds test-time training's
device side (`Backend.ttt`), which reaches the backend through the few things it names (`TTTHost`).
"""

from __future__ import annotations

import importlib
import importlib.util
import platform
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from core.common.errors import PgolfError, did_you_mean
from core.config.fields import Config


@dataclass(frozen=True)
class BackendInfo:
    name: str  # the --backend value
    package: str  # the folder holding model.py, optim.py and backend.py
    framework: str  # the module it needs installed, and the pgolf extra that installs it
    title: str  # how people call the framework

    @property
    def installed(self) -> bool:
        return importlib.util.find_spec(self.framework) is not None


BACKENDS = {
    "cuda": BackendInfo("cuda", "cuda_train", "torch", "PyTorch"),
    "mlx": BackendInfo("mlx", "mlx_train", "mlx", "MLX"),
}
ALIASES = {"torch": "cuda"}
CHOICES = ("auto", *BACKENDS, *ALIASES)


def pick(name: str) -> BackendInfo:
    """The backend a --backend value means; auto: MLX on Apple silicon when installed, else PyTorch."""
    name = ALIASES.get(name, name)
    if name in BACKENDS:
        return BACKENDS[name]
    if name != "auto":
        raise PgolfError(
            f"unknown backend {name!r}{did_you_mean(name, CHOICES)} (choose from {', '.join(CHOICES)})"
        )
    on_apple = sys.platform == "darwin" and platform.machine() == "arm64"
    order = ("mlx", "cuda") if on_apple else ("cuda", "mlx")
    for candidate in order:
        if BACKENDS[candidate].installed:
            return BACKENDS[candidate]
    raise PgolfError("no backend installed: pip install 'pgolf[torch]' or 'pgolf[mlx]'")


def installed() -> list[BackendInfo]:
    return [info for info in BACKENDS.values() if info.installed]


def backend_module(info: BackendInfo) -> Any:
    if not info.installed:
        raise PgolfError(
            f"the {info.name} backend needs {info.framework}: pip install 'pgolf[{info.framework}]'"
        )
    return importlib.import_module(f"{info.package}.backend")


def create(name: str, cfg: Config) -> Backend:
    info = pick(name)
    module = backend_module(info)
    module.check_config(cfg)
    return module.create_backend(cfg)


def text_by_sum(all_reduce_sum: Callable[[np.ndarray], np.ndarray], rank: int, text: str | None) -> str:
    """Rank 0's `text` on every rank by two sums over the ranks (its length, then its bytes as
    float64, exact): `from_rank_0` for a framework whose processes share no store."""
    data = np.frombuffer(text.encode(), np.uint8) if rank == 0 and text is not None else np.zeros(0, np.uint8)
    values = np.zeros(int(all_reduce_sum(np.array([float(data.size)]))[0]))
    values[: data.size] = data
    return bytes(all_reduce_sum(values).astype(np.uint8)).decode()


class Backend(Protocol):
    name: str  # "cuda" or "mlx": the --backend value
    cfg: Config  # the run's one config; the loop reads it from here
    rank: int  # this process's rank (0 when not distributed)
    world_size: int  # number of processes training together
    device: str  # human-readable device, e.g. "cuda:0 (NVIDIA H100 80GB HBM3)" or "cpu"
    bf16: bool  # whether matmuls run in bfloat16 (the embedding is then stored in bf16)
    peak_flops: float | None  # dense bf16/fp32 peak of the device in FLOP/s for MFU; None if unknown

    def load_params(self, params: dict[str, np.ndarray]) -> None:
        """Copy canonical float32 arrays into the model (cast to each parameter's dtype)."""

    def params(self) -> dict[str, np.ndarray]:
        """The model's parameters as canonical float32 numpy arrays."""

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """The optimizers' state (and the weights' moving average) in the canonical layout above."""

    def load_optimizer_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore what `optimizer_state` returned (possibly from the other backend)."""

    def train_step(
        self,
        micro_batches: list[tuple[np.ndarray, np.ndarray]],
        lr_mult: float,
        muon_momentum: float,
        muon_wd_mult: float = 1.0,
    ) -> Any:
        """One optimizer step on this rank's micro-batches (x, y int32 of shape (B, T)).

        Gradients are averaged over all micro-batches of all ranks; every base lr
        is multiplied by `lr_mult`; Muon uses `muon_momentum`, and its weight decay times
        `muon_wd_mult`; the moving average
        of the weights follows. Returns this rank's mean training loss as a 0-d
        array of the framework, left on the device (`float()` it to wait for it).
        """

    def set_looping(self, active: bool) -> None:
        """Run the looped layer layout (depth recurrence, `num_loops` > 0) from now on, or not.

        A new backend starts looped when num_loops > 0, the state a trained model is
        scored in; the training loop sets it from the schedule. The flag reaches the
        compiled step and evaluation as an argument, so flipping it takes effect under
        compilation (one more graph, built once). Without num_loops it changes nothing.
        """

    def eval_nll(self, x: np.ndarray, y: np.ndarray) -> Any:
        """Sum over all tokens of the cross-entropy in nats (model in eval mode).

        A 0-d array of the framework, left on the device and not waited for, in float64 where
        the device has it: the caller adds these up with `+` and calls `float()` once at the
        end, so that an evaluation pass waits for the device once, not once per batch.
        """

    def token_losses(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Cross-entropy in nats of every token (B, T), float32 on the host (eval mode): what
        sliding-window evaluation scores a window's last tokens with."""

    def segments_every(self, length: int) -> AbstractContextManager[None]:
        """While active, document-masked attention cuts each document every `length` tokens from its start
        (instead of every max_doc_len): record 2026-04-27's evaluation batches (core.model.walk)."""

    def input_hessians(self, batches: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
        """GPTQ's calibration on this rank: for each linear layer's weight (by parameter name), the
        sum over `batches` of X^T X, X (tokens, in_features) its inputs in fp32. The output head's
        input is the final hidden state, named by the head's weight (`tok_emb.weight` when tied).
        A looped layer adds each visit's inputs."""

    def logits(self, x: np.ndarray) -> np.ndarray:
        """float32 logits (B, T, V) after the softcap, for parity checks."""

    def decoder(self) -> Callable[[np.ndarray], np.ndarray]:
        """A new generation: a function that takes the next token ids (1-D int32; the prompt first,
        then one at a time) and returns the float32 logits after the last of them. Keys and values of
        the ids it has seen are kept between calls (a KV cache), so each call costs its own tokens."""

    def ttt(self) -> TTT:
        """Test-time training's device side (`TTT` below), made afresh for each evaluation that trains at
        test time (core/eval/ttt.py). Its class lives in `<package>.ttt`."""

    def counter_add(self, key: str, amount: int) -> int:
        """Add `amount` to the counter `key` shared by the ranks (from 0) and return its new value: how the
        ranks share out work as they get free (one process: a plain counter)."""

    def all_reduce_sum(self, values: np.ndarray) -> np.ndarray:
        """Sum a float64 vector over ranks (identity when world_size is 1); also a barrier."""

    def from_rank_0(self, key: str, text: str | None, wait_seconds: float) -> str:
        """The `text` rank 0 gives under `key` (the other ranks give None), on every rank. The others
        wait for it up to `wait_seconds`, however long the collectives' timeout: rank 0 may work alone
        for many minutes first (the artifact fit). A key is given once per job."""

    def synchronize(self) -> None:
        """Wait for queued device work, so that wall-clock timings are honest."""

    def peak_memory_bytes(self) -> int | None:
        """Peak device memory in use so far, if the framework can tell."""

    def close(self, failed: bool = False) -> int | None:
        """Release process groups and other resources.

        After a success every rank leaves together. After a failure (`failed`: an exception is
        ending the command) this rank waits for no other, as they may be gone or stuck in a
        collective, and returns the rank whose failure came first in the job when it can tell
        (this one or another), so that the error of that rank alone is shown; the process is
        then expected to end at once, which is what makes the other ranks' collectives fail.
        """


class TTT(Protocol):
    """What test-time training (core/eval/ttt.py) asks of a backend's device, for one
    evaluation (`Backend.ttt`): LoRA adapters (core/model/lora.py) on this rank's documents, and SGD on
    the backend model's own weights (the global phases, the full mode), its momentum kept here."""

    def new_adapters(self, a: dict[str, np.ndarray]) -> Any:
        """Adapters for a batch of documents: A from `a` (float32, the shapes of `adapter_shapes`), B zero,
        and their optimizer (`ttt_optimizer`) fresh. An opaque handle for the calls below."""

    def restart_adapters(self, adapters: Any, a: dict[str, np.ndarray] | None = None) -> None:
        """The same adapters for the next batch: B back to zero, A set to `a` or kept; optimizer fresh."""

    def score_then_adapt(
        self,
        adapters: Any,
        x: np.ndarray,
        y: np.ndarray,
        train_rows: np.ndarray,
        train_from: int,
        train_len: int,
    ) -> np.ndarray:
        """The per-token losses (B, T) float32 of x, y with the adapters as they are, which is what is
        scored; then, if any of `train_rows` (B bools) is set, `ttt_grad_steps` optimizer steps on the sum
        over those rows of each one's mean loss at positions [train_from, train_from + train_len)."""

    def sgd_reset(self, momentum: float, frozen: tuple[str, ...] = ()) -> None:
        """Start training the weights themselves: SGD with `momentum` (its buffers at zero) on every
        parameter whose name starts with none of `frozen`."""

    def sgd_step(
        self, x: np.ndarray, y: np.ndarray, lr: float, total_tokens: int, clip: float, doc_mask: bool = True
    ) -> None:
        """One SGD step at `lr` on the summed loss of every rank's x, y (this rank's may be empty) over
        `total_tokens`, the gradient's norm clipped to `clip` (0: not clipped). The forward is the
        model's own, segmented as train_step's (varlen_attn_enabled); `doc_mask` off: plain causal."""
