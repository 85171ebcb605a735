"""The small interface a framework implements so that `core.loop` can drive it.

The driver owns everything framework-neutral (data, schedules, timing,
validation, logging, checkpoints, export). A backend owns only the model, the
optimizers and the collectives, and exchanges state as numpy in the canonical
layout of `core.params`:

- parameters: `{name: float32 array}` with the names of `param_shapes`;
- optimizer state: `{"step": int64 0-d array}` (optimizer steps taken) plus, per
  parameter, `"exp_avg/<name>"` and `"exp_avg_sq/<name>"` (Adam groups) or
  `"momentum_buffer/<name>"` (Muon group), all float32.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Backend(Protocol):
    name: str  # "cuda" or "mlx": the --backend value
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
        """The optimizers' state in the canonical layout above."""

    def load_optimizer_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore what `optimizer_state` returned (possibly from the other backend)."""

    def train_step(
        self, micro_batches: list[tuple[np.ndarray, np.ndarray]], lr_mult: float, muon_momentum: float
    ) -> float:
        """One optimizer step on this rank's micro-batches (x, y int32 of shape (B, T)).

        Gradients are averaged over all micro-batches of all ranks; every base lr
        is multiplied by `lr_mult`; Muon uses `muon_momentum`. Returns this rank's
        mean training loss.
        """

    def eval_nll(self, x: np.ndarray, y: np.ndarray) -> float:
        """Sum over all tokens of the cross-entropy in nats (model in eval mode)."""

    def logits(self, x: np.ndarray) -> np.ndarray:
        """float32 logits (B, T, V) after the softcap, for parity checks."""

    def all_reduce_sum(self, values: np.ndarray) -> np.ndarray:
        """Sum a float64 vector over ranks (identity when world_size is 1); also a barrier."""

    def synchronize(self) -> None:
        """Wait for queued device work, so that wall-clock timings are honest."""

    def peak_memory_bytes(self) -> int | None:
        """Peak device memory in use so far, if the framework can tell."""

    def close(self) -> None:
        """Release process groups and other resources."""
