"""Generation: the sampling rule, the KV-cache decode path of each backend, and both backends alike."""

from __future__ import annotations

import numpy as np
import pytest

from core.common.errors import PgolfError
from core.config.presets import preset
from core.eval.sample import generate, pick_token
from tests.support.backends import BACKENDS, LOOPS_LANES, MODEL_SWITCHES, busy_params, make_backend, needs

MODELS = {"plain": {}, "features": dict(MODEL_SWITCHES, num_layers=3), "loops_lanes": LOOPS_LANES}


def test_the_sampling_rule():
    logits = np.array([0.1, 3.0, 2.0, -1.0])
    rng = np.random.default_rng(0)
    assert pick_token(logits, 0.0, 0, rng) == 1  # greedy
    assert pick_token(logits, 1.0, 1, rng) == 1  # top-1 is greedy at any temperature
    draws = [pick_token(logits, 1.0, 2, rng) for _ in range(200)]
    assert set(draws) == {1, 2}  # only the two likeliest, both drawn
    same = [pick_token(logits, 1.0, 0, np.random.default_rng(5)) for _ in range(3)]
    assert len(set(same)) == 1  # the seed decides
    for bad in (-1.0, float("nan"), float("inf"), -float("inf")):
        with pytest.raises(PgolfError, match="--temperature must be a finite number >= 0"):
            generate(
                lambda ids: logits, [1], 3, temperature=bad
            )  # refused at the call, not at the first token
    for count in ({"max_tokens": -1}, {"top_k": -2}):
        with pytest.raises(PgolfError, match="must be >= 0"):
            generate(lambda ids: logits, [1], **{"max_tokens": 3, **count})


def test_generation_stops_at_the_stop_token():
    fed = []

    def next_logits(ids):
        fed.append(ids.tolist())
        return np.eye(4)[min(len(fed), 3)]  # 1, then 2, then 3

    assert list(generate(next_logits, [0, 0], 10, temperature=0, stop_id=3)) == [1, 2]
    assert fed == [[0, 0], [1], [2]]  # the prompt once, then one token at a time


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_cached_decoding_gives_the_logits_of_the_whole_sequence(backend_name, model):
    cfg = preset("smoke").replace(**MODELS[model])
    backend = make_backend(backend_name, cfg)
    backend.load_params(busy_params(cfg))
    tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, 12).astype(np.int32)
    tokens[[2, 5, 8]] = cfg.bos_id  # document starts: in the prompt, and in the first decoded step
    full = backend.logits(tokens[None])[0]  # (T, V), no cache
    step = backend.decoder()
    got = [step(tokens[:5])]  # a prompt of 5, then one token at a time
    got += [step(tokens[i : i + 1]) for i in range(5, len(tokens))]
    np.testing.assert_allclose(np.stack(got), full[4:], atol=1e-4)


@needs("cuda")
@needs("mlx")
@pytest.mark.parametrize("model", ["plain", "features"])
def test_greedy_decoding_gives_the_same_tokens_in_both_backends(model):
    cfg = preset("smoke").replace(**MODELS[model])
    params = busy_params(cfg, seed=4)
    out = {}
    for name in ("cuda", "mlx"):
        backend = make_backend(name, cfg)
        backend.load_params(params)
        out[name] = list(generate(backend.decoder(), [1, 5, 9], 24, temperature=0))
    assert len(out["cuda"]) == 24 and out["cuda"] == out["mlx"]
