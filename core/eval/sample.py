"""Text generation: the sampling rule, written once for both backends.

A backend's `decoder()` turns token ids into the logits of the next token, keeping a
KV cache; this module picks each next token from those logits in numpy (float64),
so the same logits and seed give the same tokens whichever backend computed them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np

from core.common.errors import PgolfError


def pick_token(logits: np.ndarray, temperature: float, top_k: int, rng: np.random.Generator) -> int:
    """Greedy when temperature is 0; else a draw from softmax(logits / temperature) over the top_k
    most likely tokens (all of them when top_k is 0)."""
    z = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        return int(np.argmax(z))
    if 0 < top_k < z.size:
        z = np.where(z >= np.partition(z, -top_k)[-top_k], z, -np.inf)
    with np.errstate(over="ignore"):  # a tiny temperature: the others' -inf, exp 0 (as greedy)
        p = np.exp((z - z.max()) / temperature)
    return int(rng.choice(z.size, p=p / p.sum()))


def check_sampling(max_tokens: int, temperature: float, top_k: int) -> None:
    """The sampling settings' ranges: counts >= 0, a finite temperature >= 0 (0 = greedy)."""
    if not (max_tokens >= 0 and top_k >= 0):
        raise PgolfError(f"--max-tokens and --top-k must be >= 0, got {max_tokens} and {top_k}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise PgolfError(f"--temperature must be a finite number >= 0 (0 = greedy), got {temperature}")


def generate(
    next_logits: Callable[[np.ndarray], np.ndarray],
    prompt: list[int],
    max_tokens: int,
    temperature: float = 0.8,
    top_k: int = 50,
    seed: int = 0,
    stop_id: int | None = None,
) -> Iterator[int]:
    """The tokens that follow `prompt`, one by one, until max_tokens or `stop_id` (not yielded).
    The settings are checked at once, before the first token is asked for."""
    if not prompt:
        raise PgolfError("generation needs at least one prompt token")
    check_sampling(max_tokens, temperature, top_k)
    return _tokens(next_logits, prompt, max_tokens, temperature, top_k, seed, stop_id)


def _tokens(next_logits, prompt, max_tokens, temperature, top_k, seed, stop_id) -> Iterator[int]:
    rng = np.random.default_rng(seed)
    logits = next_logits(np.asarray(prompt, dtype=np.int32))
    for _ in range(max_tokens):
        token = pick_token(logits, temperature, top_k, rng)
        if token == stop_id:
            return
        yield token
        logits = next_logits(np.asarray([token], dtype=np.int32))
