"""LQER in the mixed format: which matrices get a correction, what it buys, and that the file keeps it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from core.artifact import lqer
from core.artifact.container import write_artifact
from core.artifact.load import load_mixed_artifact
from core.artifact.mixed import dequantize_mixed, mixed_artifact_bytes, quantize_mixed
from core.common.errors import PgolfError
from core.config.presets import preset

SETTINGS = lqer.LqerSettings(rank=4, top_k=2, factor_bits=4, asym=True, group=64)


def state() -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Three matrices over the 65,536-value floor, of growing spread (so growing int6 error; rows'
    scales are at least 1/31, the records' floor, so the spreads are above 1), one small."""
    rng = np.random.default_rng(0)
    weights = {f"m{i}": (rng.standard_normal((256, 320)) * (i + 1)).astype(np.float32) for i in range(3)}
    weights["small"] = rng.standard_normal((8, 8)).astype(np.float32)
    return weights, {"m0": "mlp", "m1": "mlp", "m2": "attention", "small": "other"}


def test_the_largest_errors_get_a_correction_that_lowers_them():
    weights, classes = state()
    plain = quantize_mixed(weights, classes, {"mlp": 6, "attention": 6})
    fixed = quantize_mixed(weights, classes, {"mlp": 6, "attention": 6}, lqer=SETTINGS)
    assert sorted(fixed.lqer) == ["m1", "m2"]  # the top 2 by error norm: the widest spreads
    assert {fixed.info[n]["lqer"] for n in fixed.lqer} == {"asym"}  # B is 4 x 320: groups of 64 fit
    before, after = dequantize_mixed(plain), dequantize_mixed(fixed)
    for name in ("m1", "m2"):
        err_before = np.linalg.norm(weights[name] - before[name])
        err_after = np.linalg.norm(weights[name] - after[name])
        assert err_after < err_before
    np.testing.assert_array_equal(after["m0"], before["m0"])  # not chosen: unchanged


def test_symmetric_packing_where_groups_do_not_fit():
    weights = {"odd": np.random.default_rng(1).standard_normal((300, 301)).astype(np.float32)}
    model = quantize_mixed(
        weights, {"odd": "mlp"}, lqer=lqer.LqerSettings(rank=3, top_k=1, asym=True, group=64)
    )
    assert model.info["odd"]["lqer"] == "sym"  # 3 x 301 values: not a multiple of 64
    assert model.lqer["odd"]["qA"].shape == (300, 3) and model.lqer["odd"]["sB"].shape == (3,)


@pytest.mark.slow
def test_corrections_survive_the_file_and_a_damaged_one_is_refused(tmp_path):
    weights, classes = state()
    model = quantize_mixed(weights, classes, {"mlp": 6, "attention": 6}, lqer=SETTINGS)
    path = tmp_path / "a.pgolf"
    write_artifact(path, mixed_artifact_bytes(model), "brotli")
    back = load_mixed_artifact(path)
    for name, want in dequantize_mixed(model).items():
        np.testing.assert_array_equal(dequantize_mixed(back)[name], want)
    back.lqer["m1"]["qB"] = back.lqer["m1"]["qB"][:, :-1]  # factors that no longer make the matrix
    bad = tmp_path / "bad.pgolf"
    write_artifact(bad, mixed_artifact_bytes(back), "brotli")
    with pytest.raises(PgolfError, match="m1: LQER factors .* do not make a"):
        load_mixed_artifact(bad)


def test_the_config_asks_for_it_in_the_mixed_format_only():
    cfg = preset("smoke").replace(quant_format="mixed", lqer_enabled=True, lqer_top_k=5).validate()
    from core.artifact.export import lqer_settings

    assert lqer_settings(cfg) == lqer.LqerSettings(4, 5, 4, True, 64)
    assert lqer_settings(cfg.replace(lqer_enabled=False)) is None
    with pytest.raises(PgolfError, match="lqer_enabled needs quant_format=mixed"):
        preset("smoke").replace(lqer_enabled=True).validate()
    assert json.loads(json.dumps(cfg.to_dict()))["lqer_top_k"] == 5
