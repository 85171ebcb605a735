"""The artifact fit (core/artifact/fit.py, core/train/fitting.py, `export --fit-bytes`,
`artifact_fit_bytes`): under the cap, better than every uniform setting that fits, never over, the
same in both backends, and reproducible from the config it writes."""

from __future__ import annotations

import json
import tomllib
from types import SimpleNamespace

import numpy as np
import pytest

from core.artifact.export import artifact_blob, export_artifact, quantize_mixed_for
from core.artifact.fit import SEARCH_BITS, SEARCH_FLOORS, entropy_bytes, fit_artifact
from core.artifact.load import load_checkpoint
from core.artifact.mixed import dequantize_mixed
from core.artifact.quantized import KEEP_FLOAT_MAX_NUMEL
from core.common.errors import PgolfError
from core.config.fields import Config
from core.runs.train_script import code_bytes
from core.train.calibration import calibrate_gptq
from core.train.fitting import calibration_loss, calibration_tokens
from core.train.loop import train_loader
from tests.support.artifacts import ARTIFACT, NUMPY_CODE_BYTES, SHAPE, stand_in_loss
from tests.support.backends import busy_params, make_backend, needs
from tests.support.cli import assert_one_line_error, cli, data_flags

LZMA = ()  # in-process fits try the run's compressor alone (lzma: brotli-11 takes seconds here)


@pytest.fixture(scope="module")
def run(sotu_dataset, tmp_path_factory):
    """A short record-style run (smoke preset at the shape above), through the CLI; its checkpoint. Its fits
    keep its compressor (lzma): one compression per candidate, not pergroup's lrzip calls (test_fit_runs.py
    has a fit that tries them)."""
    out = tmp_path_factory.mktemp("runs")
    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--out-dir", str(out), "--run-id", "f",
                 *SHAPE, *ARTIFACT, "--artifact-fit-keep-compressor", *data_flags(sotu_dataset))  # fmt: skip
    assert result.returncode == 0, result.stderr
    return sorted((out / "f" / "checkpoints").glob("*.safetensors"))[-1]


def int8_bytes(ckpt, cfg: Config) -> int:
    """Artifact + code of every class at 8 bits."""
    cfg8 = cfg.replace(embed_bits=8, matrix_bits=8, gptq_enabled=False)
    return len(artifact_blob(quantize_mixed_for(ckpt.params, cfg8, ckpt.dtypes), cfg8)) + code_bytes(cfg8)


def setup(name: str, path):
    """The checkpoint, its config, GPTQ's Hessians and the calibration loss, in backend `name`."""
    ckpt = load_checkpoint(path)
    cfg = Config.from_dict(ckpt.config)
    backend = make_backend(name, cfg)
    backend.load_params(ckpt.params)
    hessians = calibrate_gptq(backend, train_loader(cfg, backend), lambda line: None)
    return ckpt, cfg, hessians, calibration_loss(backend, calibration_tokens(cfg))


@pytest.fixture(scope="module")
def fitted(run):
    """The fit at 85% of the int8 artifact's bytes, in the PyTorch backend."""
    ckpt, cfg, hessians, loss = setup("cuda", run)
    cap = int(0.85 * int8_bytes(ckpt, cfg))
    fit = fit_artifact(ckpt.params, cfg, ckpt.dtypes, cap, loss, code_bytes, hessians, compression=LZMA)
    return ckpt, cfg, hessians, loss, fit


@needs("cuda")
@pytest.mark.slow  # ~20 s with the run
def test_the_fit_fits_and_beats_every_uniform_setting_that_fits(fitted, tmp_path):
    ckpt, cfg, hessians, loss, fit = fitted
    base = cfg.replace(quant_format="mixed")
    assert base.replace(embed_bits=8, matrix_bits=8) != fit.cfg  # the int8 setting does not fit
    report = export_artifact(
        ckpt.params, fit.cfg, ckpt.dtypes, tmp_path / "a.pgolf", code_bytes(fit.cfg), hessians
    )
    assert report.sizes["total_bytes"] == fit.chosen.bytes <= fit.cap
    assert (tmp_path / "a.pgolf").read_bytes() == artifact_blob(fit.model, fit.cfg)
    assert loss(dequantize_mixed(fit.model)) == fit.chosen.loss
    uniform = {}
    for bits in SEARCH_BITS:
        for gptq in (False, True):
            c = base.replace(embed_bits=bits, matrix_bits=bits, gptq_enabled=gptq)
            model = quantize_mixed_for(ckpt.params, c, ckpt.dtypes, hessians)
            if len(artifact_blob(model, c)) + code_bytes(c) <= fit.cap:
                uniform[bits, gptq] = loss(dequantize_mixed(model))
    assert uniform and (8, False) not in uniform and (16, False) not in uniform
    assert all(fit.chosen.loss < v for v in uniform.values()), (fit.chosen.loss, uniform)
    # The size model: every prediction within 10% of the bytes measured.
    assert all(abs(t.predicted_bytes - t.bytes) < 0.1 * t.bytes for t in fit.trials if t.kind != "gptq")


def test_entropy_counts_each_byte_lane():
    rng = np.random.default_rng(0)
    q = rng.integers(-3, 4, 10_000).astype(np.int8)  # 7 equally likely values: log2(7) bits each
    assert entropy_bytes([q]) == pytest.approx(10_000 * np.log2(7) / 8, rel=0.01)
    halves = np.full(1000, 1.5, np.float16)  # one value: both lanes constant
    assert entropy_bytes([halves, np.zeros(0, np.int8)]) == 0.0


@needs("cuda")
@pytest.mark.slow
def test_a_shrinking_cap_stays_under_it_until_nothing_fits_in_one_line(run, fitted, tmp_path):
    ckpt, cfg, _, loss, fit = fitted
    cap = fit.cap
    while True:  # without Hessians: no GPTQ, faster
        cap = int(cap * 0.5)
        try:
            small = fit_artifact(ckpt.params, cfg, ckpt.dtypes, cap, loss, code_bytes, compression=LZMA)
        except PgolfError as exc:
            assert "nothing fits" in str(exc) and "\n" not in str(exc)
            break
        assert small.chosen.bytes <= cap and all(t.bytes <= cap for t in small.trials if t.loss and t.fits)
    before = sorted(p.name for p in run.parent.iterdir())
    result = cli("export", str(run), "--fit-bytes", str(cap), "--backend", "cuda")
    assert_one_line_error(result, "nothing fits")
    assert sorted(p.name for p in run.parent.iterdir()) == before  # no artifact, no table, no config


@needs("cuda")
@pytest.mark.slow
def test_export_fit_writes_the_table_and_a_config_that_makes_the_same_artifact(run, fitted, tmp_path):
    cap = fitted[4].cap
    out = tmp_path / "fit.pgolf"
    result = cli("export", str(run), "--fit-bytes", str(cap), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "artifact fit" in result.stdout and "calibration loss" in result.stdout
    table = json.loads(out.with_name(out.name + ".fit.json").read_text())
    assert table["cap"] == cap and table["trials"][table["chosen"]]["bytes"] <= cap
    settings = tomllib.loads(out.with_name(out.name + ".fit.toml").read_text())
    total = out.stat().st_size + code_bytes(Config.from_dict(settings))
    assert total == table["trials"][table["chosen"]]["bytes"]
    assert settings["artifact_fit_bytes"] == 0 and settings["quant_format"] == "mixed"
    assert (settings["compressor"], settings["byte_shuffle"]) == ("lzma", 2)  # the run's, kept
    again = tmp_path / "again.pgolf"
    result = cli(
        "export", str(run), "--config", str(out.with_name(out.name + ".fit.toml")), "--out", str(again)
    )
    assert result.returncode == 0, result.stderr
    assert again.read_bytes() == out.read_bytes()


@needs("cuda")
@needs("mlx")
@pytest.mark.slow
def test_both_backends_choose_alike_and_write_the_same_bytes(run, fitted):
    ckpt, cfg, hessians, _, fit = fitted
    loss = setup("mlx", run)[3]  # GPTQ's input: PyTorch's Hessians (the same within 1e-4)
    other = fit_artifact(ckpt.params, cfg, ckpt.dtypes, fit.cap, loss, code_bytes, hessians, compression=LZMA)
    assert [t.changes for t in other.trials] == [t.changes for t in fit.trials]
    assert other.cfg == fit.cfg
    assert artifact_blob(other.model, other.cfg) == artifact_blob(fit.model, fit.cfg)
    for a, b in zip(other.trials, fit.trials, strict=True):
        assert a.loss == pytest.approx(b.loss, rel=1e-5, abs=1e-6) if a.loss is not None else b.loss is None


@pytest.fixture(scope="module")
def numpy_fit():
    """A fit of the embeddings (an untied head among them) and the MLP, scored by a stand-in loss (the
    weights' squared distance to the float ones): fast, and no backend needed. Floors held at the
    records' 65,536 (the tests below are of the classes' bits and of LQER; the floors have theirs)."""
    from core.config.presets import preset
    from core.model.params import storage_dtypes

    cfg = preset("smoke").replace(model_dim=96, mlp_mult=8.0, tie_embeddings=False, compressor="zlib")
    params, dtypes = busy_params(cfg), storage_dtypes(cfg, False)

    def loss(weights):
        return float(sum(np.square(weights[n] - params[n]).sum() for n in params))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("core.artifact.fit.SEARCH_FLOORS", (KEEP_FLOAT_MAX_NUMEL,))
        fit = fit_artifact(params, cfg, dtypes, 380_000, loss, lambda c: NUMPY_CODE_BYTES, compression=())
    return params, dtypes, loss, fit


@pytest.mark.slow  # ~12 s
def test_every_class_is_searched_with_a_numpy_loss(numpy_fit):
    _, _, _, fit = numpy_fit
    assert {"embed_bits", "mlp_bits"} <= {k for t in fit.trials for k in t.changes}
    assert fit.chosen.bytes <= 380_000 and fit.chosen.loss == min(t.loss for t in fit.trials if t.fits)
    assert any(t.kind == "refine" for t in fit.trials)


@pytest.mark.slow
def test_lqer_top_k_and_rank_are_chosen_where_the_default_does_worse(numpy_fit):
    """Under this cap LQER at its default (top 3 matrices, rank 4) does not fit or scores higher than
    the setting the fit chose among those its models priced."""
    params, dtypes, loss, fit = numpy_fit
    tried = {(t.changes["lqer_top_k"], t.changes["lqer_rank"]) for t in fit.trials if t.kind == "lqer"}
    assert len(tried) >= 2
    default = fit.cfg.replace(lqer_top_k=Config().lqer_top_k, lqer_rank=Config().lqer_rank)
    assert fit.cfg.lqer_enabled and fit.cfg != default
    assert json.loads(json.dumps(fit.to_json()))["settings"]["lqer_top_k"] == fit.cfg.lqer_top_k
    model = quantize_mixed_for(params, default, dtypes)
    over = len(artifact_blob(model, default)) + NUMPY_CODE_BYTES > fit.cap
    assert over or loss(dequantize_mixed(model)) > fit.chosen.loss
    chosen = quantize_mixed_for(params, fit.cfg, dtypes)  # the trial's model made on its own rounding
    assert artifact_blob(chosen, fit.cfg) == artifact_blob(fit.model, fit.cfg)


def uniform_settings(params, dtypes, cfg: Config, cap: int, loss) -> dict[tuple[int, int], float]:
    """(bits, floor) -> the loss of every class at those bits and that floor, where it fits in `cap`."""
    out = {}
    for bits in SEARCH_BITS[:-1]:
        for floor in SEARCH_FLOORS:
            c = cfg.replace(quant_format="mixed", embed_bits=bits, matrix_bits=bits, other_bits=bits,
                            **dict.fromkeys(FLOOR_FIELDS, floor))  # fmt: skip
            model = quantize_mixed_for(params, c, dtypes)
            if len(artifact_blob(model, c)) + NUMPY_CODE_BYTES <= cap:
                out[bits, floor] = loss(dequantize_mixed(model))
    return out


FLOOR_FIELDS = ("embed_passthrough_numel", "attn_passthrough_numel", "mlp_passthrough_numel",
                "other_passthrough_numel")  # fmt: skip


@pytest.mark.slow
def test_a_small_model_is_fitted_by_quantizing_tensors_under_the_records_floor():
    """The smoke preset's tensors all hold at most 65,536 values: at the records' floor every one stays
    in fp16, and at 85% of that artifact's bytes nothing at that floor fits. The fit lowers floors, fits,
    and beats every uniform setting (every class at one bits and one floor) that fits."""
    from core.config.presets import preset
    from core.model.params import storage_dtypes

    cfg = preset("smoke").replace(compressor="zlib")
    params, dtypes = busy_params(cfg), storage_dtypes(cfg, False)
    loss = stand_in_loss(params)
    records = cfg.replace(quant_format="mixed", embed_bits=5, matrix_bits=5)  # the smallest at 65,536
    kept = quantize_mixed_for(params, records, dtypes)
    assert not kept.quantized  # nothing over the floor
    cap = int(0.85 * (len(artifact_blob(kept, records)) + NUMPY_CODE_BYTES))
    fit = fit_artifact(params, cfg, dtypes, cap, loss, lambda c: NUMPY_CODE_BYTES, compression=())
    assert fit.chosen.bytes <= cap
    assert min(getattr(fit.cfg, f) for f in FLOOR_FIELDS) < KEEP_FLOAT_MAX_NUMEL
    again = quantize_mixed_for(params, fit.cfg, dtypes)  # the chosen config makes the chosen artifact
    assert len(artifact_blob(again, fit.cfg)) + NUMPY_CODE_BYTES == fit.chosen.bytes
    assert loss(dequantize_mixed(again)) == pytest.approx(fit.chosen.loss, rel=1e-6)
    uniform = uniform_settings(params, dtypes, cfg, cap, loss)
    assert uniform and not any(floor == KEEP_FLOAT_MAX_NUMEL for _, floor in uniform)
    assert all(fit.chosen.loss < v for v in uniform.values()), (fit.chosen.loss, uniform)
    json.loads(json.dumps(fit.to_json()))  # the table says the floors it chose
    assert {f: getattr(fit.cfg, f) for f in FLOOR_FIELDS} == {
        f: fit.to_json()["settings"][f] for f in FLOOR_FIELDS
    }


@pytest.mark.slow  # two fits: ~10 s of CPU
def test_a_records_shaped_model_keeps_its_floor_unless_the_fit_finds_better(monkeypatch):
    """An embedding over the records' floor, the matrices under it, a cap the records' int8 artifact
    fits: the fit with the floors to choose is at least as good as the fit at the records' floor alone,
    and moves a floor only for a lower loss."""
    import core.artifact.fit as fit_module
    from core.config.presets import preset
    from core.model.params import storage_dtypes

    cfg = preset("smoke").replace(vocab_size=2048, compressor="zlib")
    params, dtypes = busy_params(cfg), storage_dtypes(cfg, False)
    loss = stand_in_loss(params)
    cap = int8_bytes(SimpleNamespace(params=params, dtypes=dtypes), cfg) - code_bytes(cfg) + NUMPY_CODE_BYTES

    def fitted():
        return fit_artifact(params, cfg, dtypes, cap, loss, lambda c: NUMPY_CODE_BYTES, compression=())

    free = fitted()
    monkeypatch.setattr(fit_module, "SEARCH_FLOORS", (KEEP_FLOAT_MAX_NUMEL,))
    records = fitted()
    assert all(getattr(records.cfg, f) == KEEP_FLOAT_MAX_NUMEL for f in FLOOR_FIELDS)
    assert free.chosen.bytes <= cap and free.chosen.loss <= records.chosen.loss
    if any(getattr(free.cfg, f) != KEEP_FLOAT_MAX_NUMEL for f in FLOOR_FIELDS):
        assert free.chosen.loss < records.chosen.loss
