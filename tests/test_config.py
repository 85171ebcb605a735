"""Config: presets, validation, TOML, upstream environment names, flags, dict round trip."""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from core.artifact import container, int8_format
from core.artifact.export import scoring_config
from core.artifact.load import config_for_params, saved_config
from core.common.errors import PgolfError
from core.config.fields import (
    ATTENTION_GATES,
    SCORING_FIELDS,
    Check,
    Config,
    field_names,
    from_env,
)
from core.config.presets import PRESETS, preset
from core.config.sources import (
    EXPORT_FIELDS,
    RESUMABLE_FIELDS,
    SECTIONS,
    load_file,
    parse_overrides,
    resolve,
    resolve_sources,
)
from core.model.params import artifact_classes, param_shapes, storage_dtypes
from tests.reference import reference_logits
from tests.support.backends import LOOPS_LANES, MODEL_SWITCHES, busy_params
from tests.support.fuzz import run_within


def test_baseline_defaults_match_the_upstream_scripts():
    cfg = preset("baseline")
    assert (cfg.vocab_size, cfg.num_layers, cfg.model_dim, cfg.num_heads, cfg.num_kv_heads) == (
        1024,
        9,
        512,
        8,
        4,
    )
    assert (cfg.train_seq_len, cfg.train_batch_tokens, cfg.iterations) == (1024, 524_288, 20_000)
    assert (cfg.warmdown_iters, cfg.warmup_steps, cfg.max_wallclock_seconds, cfg.seed) == (
        1200,
        20,
        600.0,
        1337,
    )
    assert (cfg.matrix_lr, cfg.scalar_lr, cfg.tied_embed_lr) == (0.04, 0.04, 0.05)
    assert (cfg.muon_momentum, cfg.muon_momentum_warmup_start, cfg.muon_momentum_warmup_steps) == (
        0.95,
        0.85,
        500,
    )
    assert (cfg.beta1, cfg.beta2, cfg.adam_eps, cfg.logit_softcap, cfg.qk_gain_init) == (
        0.9,
        0.95,
        1e-8,
        30.0,
        1.5,
    )


def test_seq4096_preset_is_the_published_record_config():
    cfg = preset("seq4096")
    assert (cfg.train_seq_len, cfg.train_batch_tokens, cfg.warmdown_iters) == (4096, 393_216, 3000)
    assert (cfg.muon_momentum, cfg.muon_momentum_warmup_start, cfg.muon_momentum_warmup_steps) == (
        0.99,
        0.92,
        1500,
    )
    assert (cfg.tied_embed_lr, cfg.matrix_lr, cfg.scalar_lr) == (0.030, 0.020, 0.020)
    assert cfg.model_dim == 512 and cfg.num_layers == 9


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_valid(name):
    preset(name).validate(world_size=1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_heads": 3}, "must divide model_dim"),
        ({"num_kv_heads": 3}, "must divide num_heads"),
        ({"model_dim": 36, "num_heads": 4, "num_kv_heads": 2}, "must be even for RoPE"),
        ({"train_batch_tokens": 1000}, "must be a multiple"),
        ({"grad_accum_steps": 0}, "grad_accum_steps must be positive"),
        ({"compute_dtype": "fp8"}, "compute_dtype"),
        ({"iterations": -1}, "iterations must be >= 0"),
        ({"matrix_lr": float("nan")}, "matrix_lr must be finite"),
        ({"logit_softcap": float("inf")}, "logit_softcap must be finite"),
        ({"logit_softcap": 0.0}, "logit_softcap must be positive"),
        ({"rope_base": 0.0}, "rope_base must be positive"),
        ({"tied_embed_init_std": -1.0}, "tied_embed_init_std must be >= 0"),
        ({"scalar_lr": -0.1}, "scalar_lr must be >= 0"),
        ({"beta2": 5.0}, r"beta2 must be in \[0, 1\)"),
        ({"muon_momentum": 1.0}, r"muon_momentum must be in \[0, 1\)"),
        ({"run_id": "../elsewhere"}, "run_id must be a plain folder name"),
        ({"num_loops": -1}, "num_loops must be >= 0"),
        ({"enable_looping_at": 1.5}, r"enable_looping_at must be in \[0, 1\]"),
        ({"num_loops": 1, "loop_start": 1, "loop_end": 0}, "loop_start <= loop_end"),
        ({"num_loops": 1, "loop_start": 0, "loop_end": 2}, r"must lie in 0\.\.1"),
        ({"parallel_start_layer": 2}, "must be below num_layers=2"),
        ({"parallel_final_lane": "both"}, "parallel_final_lane must be mean, mlp or attn"),
        ({"eval_stride": 65}, r"eval_stride=65 is longer than the evaluation window \(64\)"),
        ({"eval_seq_len": 128, "eval_stride": 100}, None),  # a longer window fits the validation batch
        ({"eval_seq_len": 4096}, "val_batch_size=1024 must hold grad_accum_steps sequences of 4096"),
        ({"eval_batch_seqs": 0}, "eval_batch_seqs must be positive"),
        ({"quant_format": "int4"}, "quant_format must be int8 or mixed"),
        ({"compressor": "gzip"}, "compressor must be none, zlib, lzma, bz2, brotli, zstd or pergroup"),
        ({"matrix_bits": 4}, "matrix_bits must be 5, 6, 7, 8 or 16"),
        ({"attn_bits": 9}, "attn_bits must be 0, 5, 6, 7, 8 or 16"),
        ({"byte_shuffle": 1}, "byte_shuffle must be 0"),
        ({"gptq_enabled": True}, "gptq_enabled needs quant_format=mixed"),
        (
            {"gptq_enabled": True, "quant_format": "mixed", "max_wallclock_seconds": 5.0},
            "gptq_reserve_seconds=10.0 leaves no training time",
        ),
        ({"embed_clip_sigmas": -1.0}, "embed_clip_sigmas must be >= 0"),
        # 6 layers, 3..5 looped twice: the decoder visits [5, 3, 4, 5, 3, 4, 5]; lanes from 4 would
        # leave layer 3 reading the single stream after the split.
        (
            {"num_layers": 6, "num_loops": 2, "loop_start": 3, "loop_end": 5, "parallel_start_layer": 4},
            r"runs a layer below 4 after a parallel one",
        ),
    ],
)
def test_validation_names_the_problem(change, message):
    cfg = preset("smoke").replace(**change)
    if message is None:
        cfg.validate()
        return
    with pytest.raises(PgolfError, match=message):
        cfg.validate()


def test_world_size_must_divide_accumulation():
    with pytest.raises(PgolfError, match="world size 3"):
        preset("baseline").validate(world_size=3)
    preset("baseline").validate(world_size=8)


def test_unknown_preset_and_unknown_key():
    with pytest.raises(PgolfError, match="unknown preset"):
        preset("huge")
    with pytest.raises(PgolfError, match="unknown key 'matrx_lr'"):
        Config().replace(matrx_lr=0.1)
    with pytest.raises(PgolfError, match="unknown key 'matrx_lr'"):
        parse_overrides(["matrx_lr=0.1"])


def test_upstream_environment_variables_are_accepted():
    env = {
        "ITERATIONS": "123",
        "MATRIX_LR": "0.02",
        "TIE_EMBEDDINGS": "0",
        "TRAIN_MAX_SEQ_LEN": "2048",
        "HOME": "/x",
    }
    got = from_env(env)
    assert got == {"iterations": "123", "matrix_lr": "0.02", "tie_embeddings": "0", "train_seq_len": "2048"}
    cfg = resolve("baseline", environ=env)
    assert (cfg.iterations, cfg.matrix_lr, cfg.tie_embeddings, cfg.train_seq_len) == (123, 0.02, False, 2048)


def test_bad_value_types_are_one_clear_error():
    with pytest.raises(PgolfError, match="iterations expects int, got 'many'"):
        resolve("baseline", environ={"ITERATIONS": "many"})
    with pytest.raises(PgolfError, match="tie_embeddings expects bool"):
        Config().replace(tie_embeddings="maybe")
    for value in ("1e999", "1.7", "nan", [1, 2], True):  # too big, not whole, not a number, a list, a bool
        with pytest.raises(PgolfError, match="iterations expects int"):
            Config().replace(iterations=value)
    with pytest.raises(PgolfError, match="matrix_lr expects float"):
        Config().replace(matrix_lr=[1, 2])
    assert Config().replace(iterations="2e4", train_seq_len="2_048").iterations == 20_000
    assert Config().replace(seed="12345678901234567891").seed == 12345678901234567891  # exact, not via float


def test_layering_preset_toml_env_flags(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('iterations = 50\nmatrix_lr = 0.03\nrun_id = "from-toml"\n')
    cfg = resolve("tiny", toml, overrides={"iterations": "70"}, environ={"MATRIX_LR": "0.01"})
    assert cfg.model_dim == preset("tiny").model_dim  # preset
    assert cfg.run_id == "from-toml"  # TOML over preset
    assert cfg.matrix_lr == 0.01  # env over TOML
    assert cfg.iterations == 70  # flags over everything


def test_toml_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("iterations = [")
    with pytest.raises(PgolfError, match="not valid TOML"):
        load_file(bad)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("learning_rate = 1\n")
    with pytest.raises(PgolfError, match="unknown key 'learning_rate'"):
        load_file(unknown)
    with pytest.raises(PgolfError, match="file not found"):
        load_file(tmp_path / "missing.toml")
    with pytest.raises(PgolfError, match="cannot read"):
        load_file(tmp_path)  # a folder
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00iterations = 1")
    with pytest.raises(PgolfError, match="not UTF-8"):
        load_file(binary)


def test_dict_round_trip_tolerates_old_keys():
    cfg = preset("tiny").replace(seed=7)
    data = cfg.to_dict()
    assert Config.from_dict(data) == cfg
    data["some_removed_field"] = 1
    assert Config.from_dict(data) == cfg
    with pytest.raises(PgolfError, match="unknown key"):
        Config.from_dict(data, strict=True)


def test_every_field_has_a_one_line_comment():
    import cli

    helps = cli._field_help()
    assert set(helps) == field_names() and all(helps.values())


def test_layer_layout_of_the_0423_record():
    """The 04-23 record's defaults: 11 layers, 3..5 looped twice more (fact sheet, section 3)."""
    cfg = preset("baseline").replace(num_layers=11, num_loops=2, loop_start=3, loop_end=5).validate()
    assert cfg.layer_layout(looping=True) == ([0, 1, 2, 3, 4, 5, 3, 4], [5, 3, 4, 5, 6, 7, 8, 9, 10])
    assert cfg.layer_layout(looping=False) == ([0, 1, 2, 3, 4], [5, 6, 7, 8, 9, 10])
    assert cfg.replace(num_loops=0).layer_layout(looping=True) == cfg.layer_layout(looping=False)
    cfg.replace(parallel_start_layer=8).validate()  # the record's lanes: every layer from 8 is parallel


def test_a_runs_config_json_is_a_config_file(tmp_path):
    saved = resolve("tiny", overrides={"seed": 7, "matrix_lr": 0.03})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(saved.to_dict(), indent=2))
    assert resolve("baseline", path, environ={}) == saved
    path.write_text('{"seed": 7,')
    with pytest.raises(PgolfError, match="not valid JSON"):
        load_file(path)
    path.write_text('{"seed": null}')
    with pytest.raises(PgolfError, match="seed in .* has no value"):
        load_file(path)
    path.write_text("[1]")
    with pytest.raises(PgolfError, match="must hold one object"):
        load_file(path)


def test_each_value_says_where_it_came_from(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text("iterations = 50\nmatrix_lr = 0.03\n")
    cfg, sources = resolve_sources("tiny", toml, {"iterations": 70}, environ={"TRAIN_MAX_SEQ_LEN": "128"})
    assert (cfg.iterations, cfg.matrix_lr, cfg.train_seq_len, cfg.model_dim) == (70, 0.03, 128, 128)
    assert sources["iterations"] == "flag"
    assert sources["matrix_lr"] == f"file {toml}"
    assert sources["train_seq_len"] == "env TRAIN_MAX_SEQ_LEN"
    assert sources["model_dim"] == "preset tiny"
    assert sources["seed"] == "default"
    assert (cfg.dataset, sources["dataset"]) == ("sotu_sp1024", "data_path")  # named after its folder


def test_a_dataset_name_looks_up_its_paths_in_the_manifest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text(json.dumps({
        "datasets": [{"name": "fineweb10B_sp4096", "tokenizer_name": "t4096", "vocab_size": 4096,
                      "path": "datasets/fineweb10B_sp4096"}],
        "tokenizers": [{"name": "t4096", "model_path": "tokenizers/fineweb_4096_bpe.model"}],
    }))  # fmt: skip
    cfg, sources = resolve_sources("tiny", overrides={"dataset": "fineweb10B_sp4096"}, environ={})
    assert cfg.data_path == str(Path("data/datasets/fineweb10B_sp4096"))
    assert cfg.tokenizer_path == str(Path("data/tokenizers/fineweb_4096_bpe.model"))
    assert (cfg.vocab_size, sources["vocab_size"]) == (4096, "dataset fineweb10B_sp4096")
    # A later layer's explicit path still wins.
    cfg = resolve("tiny", overrides={"dataset": "fineweb10B_sp4096", "data_path": "elsewhere"}, environ={})
    assert (cfg.data_path, cfg.vocab_size) == ("elsewhere", 4096)
    with pytest.raises(PgolfError, match="unknown dataset 'fineweb10B_sp1024': .* lists fineweb10B_sp4096"):
        resolve("tiny", overrides={"dataset": "fineweb10B_sp1024"}, environ={})


def test_near_misses_are_suggested(tmp_path):
    with pytest.raises(PgolfError, match="unknown preset 'tinny' \\(did you mean 'tiny'\\?\\)"):
        preset("tinny")
    (tmp_path / "r.toml").write_text("matrx_lr = 1\n")
    with pytest.raises(PgolfError, match="did you mean 'matrix_lr'"):
        load_file(tmp_path / "r.toml")


# ------------------------------------------------------------- each field's declaration
def test_every_field_declares_all_of_it():
    for f in fields(Config):
        info = f.metadata
        assert info.get("help") and info.get("section") in SECTIONS, f.name
        assert info.get("checks") and all(isinstance(c, Check) for c in info["checks"]), f.name
        assert isinstance(info.get("resume"), bool) and isinstance(info.get("scoring"), bool), f.name
    assert set(RESUMABLE_FIELDS) | set(SCORING_FIELDS) | set(EXPORT_FIELDS) <= field_names()
    assert not set(EXPORT_FIELDS) & set(
        SCORING_FIELDS
    )  # export never changes what an artifact is scored with


def other_values(cfg: Config, name: str) -> list:
    """Values of field `name` other than cfg's that pass the field's own checks, nearest first."""
    value, info = getattr(cfg, name), Config.__dataclass_fields__[name].metadata
    choices = [c for check in info["checks"] for c in check.choices]
    if isinstance(value, bool):
        candidates = [not value]
    elif choices:
        candidates = choices
    elif isinstance(value, int):
        candidates = [value + 2, value + 1, value - 1, value * 2]
    elif isinstance(value, float):
        candidates = [value * 2 + 1, value / 2, value + 0.25]
    else:  # a list keeps its first items; a name gets longer
        candidates = [value.rsplit(",", 1)[0], value + "0"]
    return [c for c in candidates if c != value and all(check.ok(c) for check in info["checks"])]


def changed_config(base: Config, name: str) -> Config:
    """`base` with field `name` set to the first other value that passes validation."""
    for value in other_values(base, name):
        try:
            return base.replace(**{name: value}).validate()
        except PgolfError:
            continue
    raise AssertionError(f"{name}: no other valid value found to try")


# Every model feature on at once (looping, parallel lanes, value embeddings, XSA, ...), so that each
# model setting has something to change.
ALL_SWITCHES = dict(MODEL_SWITCHES, **LOOPS_LANES, ve_layers="2,4")


# The attention gates exclude one another: each declared one is on in a base of its own (the sparse
# gate's scale off 1, so that the scale shows).
GATE_BASES = [
    {g.field: g is gate for g in ATTENTION_GATES}
    | ({"sparse_attn_gate_scale": 0.7} if gate.name == "sparse" else {})
    for gate in ATTENTION_GATES
]


def changes_the_model(base: Config, name: str) -> bool | None:
    """Whether changing field `name` of `base` changes the model in a way its weights' shapes do not
    tell; None when no other value of it is valid with `base`'s other settings."""
    try:
        changed = changed_config(base, name)
    except AssertionError:
        return None
    shapes = param_shapes(changed)
    if shapes != param_shapes(base):
        try:
            return getattr(config_for_params(base, shapes), name) != getattr(changed, name)
        except PgolfError:  # the weights do not fit the base config's other settings
            return True
    params = busy_params(base)
    x = np.random.default_rng(0).integers(0, base.vocab_size, (1, 8))
    x[0, 4] = base.bos_id  # a document start, for the settings that act there
    logits = reference_logits(params, base, x, looping=True)
    out = reference_logits(params, changed, x, looping=changed.num_loops > 0)
    return bool(np.abs(out - logits).max() > 1e-9)


@pytest.mark.slow
def test_a_model_setting_the_shapes_do_not_tell_is_kept_for_scoring():
    """A model field changes the model (its weights' shapes, or its output on the same weights) and
    the shapes do not tell its value exactly when it is declared scoring=True: otherwise an artifact
    scored alone would run with it at its default. Checked with every feature on, each attention
    gate in turn."""
    # Trained on 4-token rows: the 8-token input is longer, where rope_yarn acts.
    bases = [
        preset("smoke").replace(**{**ALL_SWITCHES, **gate}, train_seq_len=4).validate() for gate in GATE_BASES
    ]
    for f in fields(Config):
        if f.metadata["section"] != "model":
            continue
        seen = [m for m in (changes_the_model(base, f.name) for base in bases) if m is not None]
        assert seen, f"{f.name}: no other valid value found to try"
        matters = any(seen)
        assert f.metadata["scoring"] == matters, (
            f"{f.name}: {'changes the model and the shapes do not tell it' if matters else 'changes nothing the scoring sees'}"
            f", but it is declared scoring={f.metadata['scoring']}"
        )


@pytest.mark.slow
def test_each_scoring_setting_comes_back_from_an_artifact(tmp_path):
    small = preset("smoke")
    model = int8_format.quantize_int8(
        busy_params(small), storage_dtypes(small, False), artifact_classes(small)
    )
    for name in SCORING_FIELDS:
        cfg = Config().replace(**{name: other_values(Config(), name)[0]})
        path = tmp_path / f"{name}.pgolf"
        container.write_artifact(
            path, int8_format.artifact_bytes(model, "zlib", config=scoring_config(cfg)), "zlib"
        )
        kept, where = saved_config(path)
        assert where == f"artifact {path}" and Config.from_dict(kept) == cfg, name


# ------------------------------------------------- files and ranges a user can get wrong
def test_a_key_given_twice_is_refused_by_name(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('{"seed": 1, "matrix_lr": 0.1, "seed": 2}')
    with pytest.raises(PgolfError, match="run.json: 'seed' is given twice"):
        load_file(path)
    toml = tmp_path / "run.toml"  # TOML's own parser refuses it, naming the line
    toml.write_text("seed = 1\nseed = 2\n")
    with pytest.raises(PgolfError, match=r"not valid TOML \(Cannot overwrite a value \(at line 2"):
        load_file(toml)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("deep.json", "[" * 200_000),
        ("deep_object.json", '{"a": ' * 50_000),
        ("deep.toml", "seed = " + "[" * 200_000),
        ("deep_table.toml", "seed = " + "{a = " * 40_000),
    ],
)
def test_deeply_nested_brackets_are_one_error_line(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(PgolfError, match="nested deeper than 64"):
        load_file(path)


def test_a_nested_value_is_refused_by_name(tmp_path):
    for name, text in (
        ("a.toml", "seed = [[1]]\n"),
        ("b.toml", "[seed]\nx = 1\n"),
        ("c.json", '{"seed": {"x": 1}}'),
    ):
        (tmp_path / name).write_text(text)
        with pytest.raises(PgolfError, match=f"seed in .*{name} must be one value, not a table or a list"):
            load_file(tmp_path / name)


def test_a_fifo_or_a_device_is_refused_at_once(tmp_path):
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)  # nobody writes it: opening it to read would wait forever
    for path in (fifo, Path("/dev/zero")):
        _, error = run_within(
            10, lambda p=path: load_file(p), unblock=lambda: os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        )
        assert isinstance(error, PgolfError) and "not a regular file" in str(error), error


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"muon_backend_steps": 10**6}, "muon_backend_steps must be at most 100"),
        ({"muon_backend_steps": -1}, "muon_backend_steps must be >= 0"),
        ({"warmup_steps": -1}, "warmup_steps must be >= 0"),
        ({"muon_momentum_warmup_steps": -1}, "muon_momentum_warmup_steps must be >= 0"),
        ({"mlx_max_microbatch_tokens": -1}, "mlx_max_microbatch_tokens must be >= 0"),
        ({"ve_layers": "1,,2"}, "ve_layers must be comma-separated layer numbers"),
        ({"ve_layers": ""}, "ve_layers must be comma-separated layer numbers"),
        ({"ve_layers": "1,"}, "ve_layers must be comma-separated layer numbers"),
        ({"report_to": "tensorboard,,wandb"}, "report_to must be empty or comma-separated names"),
        ({"report_to": ","}, "report_to must be empty or comma-separated names"),
    ],
)
def test_ranges_and_lists_are_checked_by_their_declaration(change, message):
    with pytest.raises(PgolfError, match=message):
        preset("smoke").replace(**change).validate()
    preset("smoke").replace(ve_layers=" 0, 1", report_to="tensorboard, wandb").validate()
