"""Fuzzing what a user types: config files (TOML and JSON: nesting, keys given twice, values of every
type) and the sampler's flags. Every outcome is a valid config (or tokens), or one PgolfError line;
never another exception, never a hang. Same budget as tests/test_fuzz.py:

    PGOLF_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest tests/test_fuzz.py tests/test_fuzz_config.py
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from core.common.errors import PgolfError
from core.config.fields import field_names
from core.config.sources import resolve_sources
from core.eval.sample import generate
from tests.support.fuzz import FUZZ, HANG_SECONDS, run_within

FIELDS = sorted(field_names())
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
KEYS = st.sampled_from(FIELDS) | st.text(min_size=1, max_size=12)


def toml_value(value) -> str:
    """A TOML spelling of a JSON-like value (TOML has no null: it becomes a bare word, a syntax error)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else ("inf" if value > 0 else "-inf")
            if math.isinf(value)
            else repr(value)
        )
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


@st.composite
def config_files(draw) -> tuple[str, str]:
    """(file name, text): a table of fields and other keys, maybe a key twice, maybe deep brackets."""
    pairs = draw(st.lists(st.tuples(KEYS, VALUES), max_size=6))
    if pairs and draw(st.booleans()):
        pairs.append((pairs[0][0], draw(VALUES)))  # a key given twice
    if draw(st.booleans()):
        text = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs) + "}"
        name = "run.json"
    else:
        text = "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in pairs)
        name = "run.toml"
    depth = draw(st.sampled_from([0, 10, 1000, 100_000]))  # brackets a parser may or may not survive
    if depth:
        text = (
            "[" * depth + text if draw(st.booleans()) else text + f"{json.dumps(FIELDS[0])} = " + "[" * depth
        )
    return name, text


@FUZZ
@given(case=config_files())
def test_config_files(tmp_path, case):
    name, text = case
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", errors="surrogatepass")

    def read():
        cfg, _ = resolve_sources("smoke", path, {}, environ={})
        return cfg.validate()

    _, error = run_within(HANG_SECONDS, read)
    if error is not None:
        assert isinstance(error, PgolfError), repr(error)
        assert "\n" not in str(error) and str(error)


@FUZZ
@given(
    max_tokens=st.integers(-5, 2**40),
    temperature=st.floats(allow_nan=True, allow_infinity=True),
    top_k=st.integers(-(2**40), 2**40),
    seed=st.integers(0, 2**32 - 1),
)
def test_sampler_flags(max_tokens, temperature, top_k, seed):
    logits = np.linspace(-3.0, 3.0, 16)

    def draw():
        return list(
            itertools.islice(generate(lambda ids: logits, [1], max_tokens, temperature, top_k, seed), 4)
        )

    tokens, error = run_within(HANG_SECONDS, draw)
    if error is not None:
        assert isinstance(error, PgolfError), repr(error)
        assert max_tokens < 0 or top_k < 0 or not (math.isfinite(temperature) and temperature >= 0)
    else:
        assert all(0 <= t < 16 for t in tokens) and len(tokens) == min(max_tokens, 4)
