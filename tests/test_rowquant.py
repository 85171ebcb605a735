"""Per-row int-N quantization and GPTQ, against the challenge records' own output (tests/golden)."""

from __future__ import annotations

import numpy as np
import pytest

from core.artifact.checks import clip_from_json
from core.artifact.gptq import gptq_quantize
from core.artifact.rowquant import (
    Clip,
    clip_range,
    dequantize_rows,
    quantize_rows,
    quantize_tensor,
    row_scales,
    squared_errors,
)
from core.common.errors import PgolfError
from tests.golden_data import goldens

try:
    import torch
except ImportError:
    torch = None
from tests.support.artifacts import hessian
from tests.support.backends import requires_torch

BITS_OF_RANGE = {31: 6, 15: 5, 63: 7, 127: 8}


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def test_clip_ranges():
    assert [clip_range(b) for b in (8, 7, 6, 5)] == [127, 63, 31, 15]
    with pytest.raises(PgolfError, match="4 bits"):
        clip_range(4)


# ------------------------------------------------------------ the record's own output
@pytest.mark.parametrize("r", [31, 15, 63, 127])
def test_search_is_the_records_quantize_int6_per_row(r):
    """Bit for bit: the values and the fp16 scales of the record's GPTQ-lite (whole-matrix search)."""
    g, _ = goldens()
    q, s = quantize_rows(g["rows/w"], BITS_OF_RANGE[r], Clip())
    assert same(q, g[f"rows/q{r}"]) and same(s, g[f"rows/s{r}"])
    assert int(np.abs(q).max()) <= r and s[3] == np.float16(1 / r)  # row 3 is all zeros


def test_a_vector_gets_one_scale_as_in_the_record():
    g, _ = goldens()
    q, s = quantize_tensor(g["rows/v"], 6)
    assert same(q, g["rows/v_q31"]) and same(s, g["rows/v_s31"])


@pytest.mark.parametrize(("r", "block"), [(31, 128), (31, 32), (15, 32)])
def test_gptq_is_the_records_gptq_quantize_weight(r, block):
    """Bit for bit, with two dead inputs, act order, one block or three (the cross-block update)."""
    g, _ = goldens()
    q, s = gptq_quantize(g["rows/w"], g["gptq/h"], BITS_OF_RANGE[r], Clip(), block_size=block)
    assert same(s, g[f"gptq/s{r}_b{block}"])
    assert same(q, g[f"gptq/q{r}_b{block}"]), (
        f"{np.count_nonzero(q != g[f'gptq/q{r}_b{block}'])} values differ"
    )
    assert not np.array_equal(q, quantize_rows(g["rows/w"], BITS_OF_RANGE[r])[0])  # GPTQ did something


def test_gptq_with_sdclip_is_the_2026_04_05_records():
    g, _ = goldens()
    if "sdclip/q63_b32" not in g:
        pytest.skip("goldens made without RECORD_0405")
    q, s = gptq_quantize(g["rows/w"], g["gptq/h"], 7, Clip.sdclip(12.85), block_size=32)
    assert same(q, g["sdclip/q63_b32"])
    # Row 3 is all zeros: its std is 0, the record's scale 0 (it divides 0 by 0 there); ours is 1/63.
    assert g["sdclip/s63_b32"][3] == 0 and s[3] == np.float16(1 / 63)
    s[3] = 0
    assert same(s, g["sdclip/s63_b32"])


# ------------------------------------------------------------------- properties
def weights(seed: int = 0, rows: int = 40, cols: int = 64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Rows whose largest |value| is above 1: below that the records' floor of 1/R sets the scale.
    w = rng.standard_t(4, (rows, cols)) * rng.uniform(0.3, 2.0, (rows, 1))
    return w.astype(np.float32)


def test_per_row_search_is_never_worse_than_the_whole_matrix_search():
    w = weights(1)
    q_m, s_m = quantize_rows(w, 5, Clip())
    q_r, s_r = quantize_rows(w, 5, Clip(per_row=True))
    err_m, err_r = squared_errors(w, q_m, s_m), squared_errors(w, q_r, s_r)
    assert (err_r <= err_m).all() and err_r.sum() < err_m.sum()
    for q in (0.999, 0.9999, 1.0):  # and each row is the best of the candidates for that row
        q_c, s_c = quantize_rows(w, 5, Clip.percentile(q))
        assert (err_r <= squared_errors(w, q_c, s_c)).all()


def test_the_records_floor_of_one_over_r():
    """Scales never go below 1/R (the records'): rows whose clip is under 1 get coarser steps."""
    w = weights(8) * np.float32(0.01)
    q, s = quantize_rows(w, 6, Clip())
    assert same(s, np.full(len(w), 1 / 31, np.float16)) and int(np.abs(q).max()) < 31


def test_percentile_one_is_the_row_maximum():
    w = weights(2)
    q, s = quantize_rows(w, 6, Clip.percentile(1.0))
    assert same(s, np.maximum(np.abs(w).max(axis=1) / np.float32(31), np.float32(1 / 31)).astype(np.float16))
    assert (np.abs(q).max(axis=1) >= 30).all()  # the largest value lands at (or next to) the edge
    back = dequantize_rows(q, s)
    assert (
        np.abs(back - w) <= s.astype(np.float32)[:, None] * 0.501
    ).all()  # no clipping: at most half a step


@requires_torch
@pytest.mark.torch
@pytest.mark.parametrize("bits", [8, 6, 5])
def test_quantiles_and_sdclip_scales_match_torch(bits):
    """torch.quantile for the percentile clip; torch.std (Bessel) for SDClip; the same fp16 scales."""
    w = weights(3, 50, 300)
    r = clip_range(bits)
    t = torch.from_numpy(w)
    for q in (0.999, 0.9995, 0.99999):
        expected = (torch.quantile(t.abs(), q, dim=1) / r).clamp_min(1.0 / r).half().numpy()
        assert same(row_scales(w, bits, q), expected)
    for k in (3.0, 12.85, 20.0):
        expected = (k * t.std(dim=1) / r).clamp_min(1e-10).half()
        q, s = quantize_rows(w, bits, Clip.sdclip(k))
        assert same(s, expected.numpy())
        assert same(q, torch.clamp(torch.round(t / expected.float()[:, None]), -r, r).to(torch.int8).numpy())


def test_sdclip_clips_at_k_standard_deviations():
    w = weights(4)
    q, _ = quantize_rows(w, 6, Clip.sdclip(2.0))
    sd = w.std(axis=1, ddof=1, keepdims=True)
    assert (np.abs(q[np.abs(w) < 1.9 * sd]) < 31).all() and (np.abs(q[np.abs(w) > 2.0 * sd]) == 31).all()
    zero = np.zeros((2, 8), np.float32)  # std 0: the record's scale would be 0; here 1/R
    assert same(quantize_rows(zero, 6, Clip.sdclip(3.0))[1], np.full(2, 1 / 31, np.float16))


def test_clip_descriptions_round_trip_and_bad_ones_are_refused():
    for clip in (Clip(), Clip(per_row=True), Clip.percentile(0.9999), Clip.sdclip(12.85)):
        assert clip_from_json(clip.to_json()) == clip
    assert Clip.sdclip(3.0).to_json() == {"kind": "sdclip", "k": 3.0}
    with pytest.raises(PgolfError, match="sdclip"):
        Clip.sdclip(-1)
    for bad, match in [
        ({"kind": "median"}, "clip method 'median'"),
        ({"kind": "percentile", "q": 1.5}, r"quantile 1.5 is not in \(0, 1\]"),
        ({"kind": "search", "candidates": []}, "no candidate"),
        ({"kind": "sdclip", "k": -1}, "sdclip"),
    ]:
        with pytest.raises(ValueError, match=match):
            clip_from_json(bad)
    with pytest.raises(ValueError, match="not a clip description"):
        clip_from_json({"kind": "sdclip", "sigma": 3})


def test_bad_inputs_are_refused():
    with pytest.raises(PgolfError, match="float32 matrix"):
        quantize_rows(np.zeros((4, 4)), 6)
    with pytest.raises(PgolfError, match="NaN"):
        quantize_rows(np.full((2, 2), np.nan, np.float32), 6)
    with pytest.raises(PgolfError, match=r"Hessian of shape \(3, 3\)"):
        gptq_quantize(weights(), np.eye(3, dtype=np.float32))
    with pytest.raises(PgolfError, match="block size 0"):
        gptq_quantize(weights(), np.eye(64, dtype=np.float32), block_size=0)


def test_gptq_lowers_the_output_error_it_targets():
    """GPTQ trades plain weight error for error in the layer's outputs, X (W - Q)^T."""
    rng = np.random.default_rng(5)
    w = weights(5, 32, 96)
    x = (rng.normal(0, 1, (400, 96)) @ rng.normal(0, 0.4, (96, 96))).astype(np.float32)  # correlated inputs
    h = hessian(x)
    assert np.allclose(h, x.T @ x) and h.dtype == np.float32
    for clip in (Clip(), Clip(per_row=True), Clip.sdclip(4.0)):
        q_g, s_g = gptq_quantize(w, h, 5, clip, block_size=32)
        q_r, s_r = quantize_rows(w, 5, clip)
        out = [np.linalg.norm(x @ (w - dequantize_rows(q, s)).T) for q, s in ((q_g, s_g), (q_r, s_r))]
        assert out[0] < 0.8 * out[1]
        assert int(np.abs(q_g).max()) <= 15


def test_gptq_falls_back_when_the_hessian_is_not_positive_definite():
    w = weights(6, 8, 16)
    h = -np.eye(16, dtype=np.float32) * 5  # damping cannot rescue it
    q, s = gptq_quantize(w, h, 6)
    assert same(q, quantize_rows(w, 6)[0]) and same(s, quantize_rows(w, 6)[1])


def test_gptq_dead_inputs_give_zero_columns():
    rng = np.random.default_rng(7)
    w = weights(7, 16, 24)
    x = rng.normal(0, 1, (100, 24)).astype(np.float32)
    x[:, [2, 9]] = 0
    q, _ = gptq_quantize(w, hessian(x), 6)
    assert (q[:, [2, 9]] == 0).all() and (q[:, [0, 1]] != 0).any()
