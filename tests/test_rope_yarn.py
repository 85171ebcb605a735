"""RoPE's tables (core/model/walk.py): ROPE_YARN, a larger base for inputs longer than train_seq_len, and
rope_precision, the tables a model held in bf16 makes.

pgolf's tables are a function of the config and the input's length; record 2026-04-27 keeps the
table of the longest length it has seen, and its goldens (tests/golden/make_record_yarn.py) are each
a fresh object's first call, where the two agree.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from core.common.errors import PgolfError
from core.config.presets import preset
from tests.golden_data import GOLDEN, read_golden, record_config
from tests.reference import reference_logits
from tests.support.backends import BACKENDS, busy_params, make_backend, needs

RECORD_YARN = GOLDEN / "record_yarn.safetensors"
# The smoke model with partial RoPE, trained on 16-token rows: a 40-token input is longer.
YARN = dict(rope_dims=8, rope_yarn=True, train_seq_len=16, train_batch_tokens=512)


def as_numpy(a) -> np.ndarray:
    return a.detach().cpu().numpy() if hasattr(a, "detach") else np.array(a)


def tokens(cfg, length: int, seed: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, (2, length)).astype(np.int32)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_tables_are_the_records(backend_name):
    """Every table case of the golden: rope_dims 0 (all 16) and 8, yarn on and off, lengths below, at
    and above the training length (32)."""
    meta, g = read_golden(RECORD_YARN, "table/")
    meta = json.loads(meta["cases"])
    s = meta["table_settings"]
    walks = {}
    for name, case in meta["tables"].items():
        setting = (case["rope_dims"], case["yarn"])
        if setting not in walks:
            cfg = preset("smoke").replace(
                model_dim=4 * s["head_dim"], num_heads=4, num_kv_heads=2, rope_base=s["rope_base"],
                train_seq_len=s["train_seq_len"], rope_dims=setting[0], rope_yarn=setting[1],
            ).validate()  # fmt: skip
            walks[setting] = make_backend(backend_name, cfg).model.walk
        cos, sin = (as_numpy(t) for t in walks[setting].rope_tables(case["length"]))
        np.testing.assert_allclose(cos, g[f"{name}/cos"], rtol=0, atol=2e-6, err_msg=name)
        np.testing.assert_allclose(sin, g[f"{name}/sin"], rtol=0, atol=2e-6, err_msg=name)
    # The golden has teeth: past the training length, YaRN's tables are not the plain ones.
    assert np.abs(g["r8_yarn_80/cos"] - g["r8_plain_80/cos"]).max() > 1e-2
    assert np.array_equal(g["r8_yarn_32/cos"], g["r8_plain_32/cos"])


@pytest.fixture(scope="module")
def yarn_golden():
    meta, g = read_golden(RECORD_YARN, "")
    cfg = record_config(json.loads(meta["cases"])["env"])
    params = {k.removeprefix("param/"): v for k, v in g.items() if k.startswith("param/")}
    return cfg, params, g


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_longer_input_is_the_records(yarn_golden, backend_name):
    """The record's GPT with ROPE_YARN=1, ROPE_DIMS=8 (loops and lanes on) on 80 tokens where it trained
    on 32: logits and loss; with yarn off the same weights give the record's plain logits, and a
    24-token input is not scaled."""
    cfg, params, g = yarn_golden
    assert cfg.rope_yarn and cfg.rope_dims == 8 and cfg.train_seq_len == 32
    x, y = g["x"], g["y"]
    backend = make_backend(backend_name, cfg)
    backend.load_params(params)
    backend.set_looping(True)
    np.testing.assert_allclose(backend.logits(x), g["logits_yarn"], rtol=0, atol=2e-5)
    assert float(backend.eval_nll(x, y)) / y.size == pytest.approx(float(g["loss_yarn"]), rel=1e-5)
    np.testing.assert_allclose(backend.logits(x[:, :24]), g["logits_short"], rtol=0, atol=2e-5)
    plain = make_backend(backend_name, cfg.replace(rope_yarn=False))
    plain.load_params(params)
    plain.set_looping(True)
    np.testing.assert_allclose(plain.logits(x), g["logits_plain"], rtol=0, atol=2e-5)
    assert np.abs(g["logits_yarn"] - g["logits_plain"]).max() > 1e-2


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_forward_matches_the_reference(backend_name):
    """Longer than the training length (scaled) and not (unchanged), against the numpy reference."""
    cfg = preset("smoke").replace(**YARN).validate()
    params = busy_params(cfg)
    backend = make_backend(backend_name, cfg)
    backend.load_params(params)
    for length in (12, 40):
        x = tokens(cfg, length)
        expected = reference_logits(params, cfg, x, looping=False)
        np.testing.assert_allclose(backend.logits(x), expected, rtol=0, atol=1e-4, err_msg=f"{length=}")
    plain = reference_logits(params, cfg.replace(rope_yarn=False), tokens(cfg, 40), looping=False)
    assert np.abs(plain - reference_logits(params, cfg, tokens(cfg, 40), looping=False)).max() > 1e-3


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_tables_depend_on_the_length_alone(backend_name):
    """The same length gives the same table whatever was asked before (the record's cache does not)."""
    cfg = preset("smoke").replace(**YARN).validate()
    walk = make_backend(backend_name, cfg).model.walk
    first = as_numpy(walk.rope_tables(24)[0])
    as_numpy(walk.rope_tables(200)[0])
    assert np.array_equal(as_numpy(walk.rope_tables(24)[0]), first)
    # The training length's table is the plain one: what the model keeps and cuts for short inputs.
    plain = make_backend(backend_name, cfg.replace(rope_yarn=False)).model.walk
    assert np.array_equal(as_numpy(walk.rope_tables(16)[0]), as_numpy(plain.rope_tables(16)[0]))


@needs("cuda")
@needs("mlx")
@pytest.mark.parametrize(
    "layers", [dict(), dict(num_loops=1, loop_start=0, loop_end=0, parallel_start_layer=1)]
)
def test_both_backends_give_the_same_logits(layers):
    cfg = preset("smoke").replace(**YARN, **layers).validate()
    params = busy_params(cfg, seed=3)
    x = tokens(cfg, 48, seed=4)
    out = []
    for name in ("cuda", "mlx"):
        backend = make_backend(name, cfg)
        backend.load_params(params)
        backend.set_looping(bool(layers))
        out.append(backend.logits(x))
    np.testing.assert_allclose(out[1], out[0], rtol=0, atol=2e-5)


def test_two_rotated_dims_are_refused():
    with pytest.raises(PgolfError, match="rope_yarn needs more than 2 rotated dims"):
        preset("smoke").replace(rope_yarn=True, rope_dims=2).validate()
    preset("smoke").replace(rope_yarn=True, rope_dims=4).validate()


# ------------------------------------------------------- rope_precision: tables as a bf16 model makes them
def bf16_model_tables(length: int, rope_dims: int, base: float, positions_bf16: bool) -> tuple:
    """The tables of a torch Rotary whose inv_freq buffer was cast to bf16 (as Module.bfloat16() does):
    positions in bf16 too (positions_bf16, the 2026-04-01 record's arange in the buffer's dtype), else fp32."""
    torch = pytest.importorskip("torch")
    inv_freq = (1.0 / base ** (torch.arange(0, rope_dims, 2, dtype=torch.float32) / rope_dims)).bfloat16()
    if not positions_bf16:
        inv_freq = inv_freq.float()
    angles = torch.outer(torch.arange(length, dtype=inv_freq.dtype), inv_freq)
    return angles.cos().float().numpy(), angles.sin().float().numpy()


def long_rows(length: int, **settings):
    """The smoke model with partial RoPE, trained on rows of `length` tokens."""
    rows = dict(train_seq_len=length, train_batch_tokens=2 * length, val_batch_size=2 * length)
    return preset("smoke").replace(rope_dims=8, **rows, **settings).validate()


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("precision", ["bf16_inv_freq", "bfloat16"])
def test_rope_precision_makes_a_bf16_models_tables(backend_name, precision):
    """At 600 positions (past 256, where bf16 positions fall on even numbers): the tables of a torch
    Rotary with a bf16 buffer; rescaled tables (rope_yarn, longer input) stay float32."""
    cfg = long_rows(600, rope_precision=precision)
    walk = make_backend(backend_name, cfg).model.walk
    cos, sin = (as_numpy(t) for t in walk.rope_tables(600))
    want_cos, want_sin = bf16_model_tables(600, 8, cfg.rope_base, precision == "bfloat16")
    np.testing.assert_allclose(cos, want_cos, rtol=0, atol=1e-6)
    np.testing.assert_allclose(sin, want_sin, rtol=0, atol=1e-6)
    fp32 = make_backend(backend_name, cfg.replace(rope_precision="float32")).model.walk
    assert np.abs(cos - as_numpy(fp32.rope_tables(600)[0])).max() > 1e-3
    if precision == "bfloat16":
        assert np.array_equal(cos[257], cos[256]) and not np.array_equal(cos[255], cos[256])
    yarn = long_rows(300, rope_precision=precision, rope_yarn=True)
    longer = make_backend(backend_name, yarn).model.walk.rope_tables(600)
    plain = make_backend(backend_name, yarn.replace(rope_precision="float32")).model.walk.rope_tables(600)
    assert np.array_equal(as_numpy(longer[0]), as_numpy(plain[0]))


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_rope_precision_forward_matches_the_reference(backend_name):
    """The forward with bf16 RoPE tables at 300 tokens against the numpy reference's."""
    cfg = long_rows(300, rope_precision="bfloat16")
    params = busy_params(cfg)
    backend = make_backend(backend_name, cfg)
    backend.load_params(params)
    x = tokens(cfg, 300)
    np.testing.assert_allclose(backend.logits(x), reference_logits(params, cfg, x), rtol=0, atol=1e-4)
