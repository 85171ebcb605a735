"""The PyTorch backend's forward outside training: the logits of whole sequences (parity checks:
`cli.py verify` and the tests) and KV-cached decoding (`cli.py sample`). TorchBackend's `logits` and
`decoder` (core/model/backend.py documents them) import this module when called, so the package of
a training run leaves it out."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from cuda_train.backend import TorchBackend


@torch.inference_mode()
def logits(backend: TorchBackend, x: np.ndarray) -> np.ndarray:
    """float32 logits (B, T, V) of token ids `x` (B, T), after the softcap."""
    backend.model.eval()
    with backend.autocast:
        return backend.model.logits(backend._to_device(x), backend.looping).float().cpu().numpy()


def decoder(backend: TorchBackend) -> Callable[[np.ndarray], np.ndarray]:
    """A new generation: the next ids in, the logits after the last of them out; the keys and values
    of the ids seen are kept between calls."""
    model, cache = backend.model, {}

    @torch.inference_mode()
    def next_logits(ids: np.ndarray) -> np.ndarray:
        model.eval()
        with backend.autocast:
            out = model.logits(backend._to_device(ids[None]), backend.looping, cache)
        return out[0, -1].float().cpu().numpy()

    return next_logits
