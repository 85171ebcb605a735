"""The pergroup compressor: record 2026-04-27's layout (golden bytes of its own code), exact round trips,
the same bytes every time, and one clear line where the lrzip program is missing.

tests/golden/record_pergroup.safetensors is made by tests/golden/make_pergroup.py (see its docstring).
"""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from safetensors import safe_open

from core.artifact import container, mixed
from core.artifact.budget import budget_table
from core.artifact.export import read_pgolf_artifact
from core.artifact.fit import COMPRESSION, PERGROUP, default_compression
from core.artifact.load import read_artifact
from core.common import compress, pergroup
from core.common.errors import PgolfError
from core.config.fields import Config
from core.config.presets import preset
from tests.golden_data import GOLDEN
from tests.support.artifacts import NEEDS_LRZIP
from tests.support.backends import make_backend, needs, requires_torch
from tests.support.cli import assert_one_line_error, cli

PERGROUP_GOLDEN = GOLDEN / "record_pergroup.safetensors"
LAYERS = 3


def golden() -> tuple[dict[str, np.ndarray], dict]:
    with safe_open(PERGROUP_GOLDEN, "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["golden"])  # noqa: SIM118 (safe_open is not a dict)


def record_payload(tensors: dict[str, np.ndarray]) -> bytes:
    """The golden's quantized model (the record's names) as pgolf's payload names it: `q/`, `s/`, `p/`."""
    renamed = {}
    for key, value in tensors.items():
        name = key.removeprefix("w/")
        for suffix, role in ((".q", "q"), (".gq", "q"), (".scale", "s"), (".gs", "s")):
            if name.endswith(suffix):
                renamed[f"{role}/{name.removesuffix(suffix)}"] = value
                break
        else:
            renamed[f"p/{name}"] = value
    return container.payload_bytes(renamed, {"format": "test"})


def record_model() -> mixed.MixedModel:
    """The golden's quantized model as a MixedModel: every group present (3 layers), a gate that no
    group takes, an fp16 tensor."""
    tensors, _ = golden()
    model = mixed.MixedModel()
    for key, value in tensors.items():
        name = key.removeprefix("w/")
        if not key.startswith("w/") or name.endswith((".scale", ".gs")):
            continue
        if name.endswith((".q", ".gq")):
            stem, kind = name.rsplit(".", 1)
            model.quantized[stem] = value
            model.scales[stem] = tensors[f"w/{stem}.{'gs' if kind == 'gq' else 'scale'}"]
            model.info[stem] = {
                "class": "other", "dtype": "float32", "store": "int", "bits": 6, "clip": None, "method": "rows",
            }  # fmt: skip
        else:
            model.passthrough[name] = value
            model.info[name] = {"class": "control", "dtype": "float16", "store": "fp16"}
    return model


# ---------------------------------------------------------------- the record's layout
@pytest.mark.parametrize("case", ["random", "few_values", "repeated"])
def test_similarity_order_is_the_records(case):
    tensors, _ = golden()
    order = pergroup.similarity_order(tensors[f"sort/{case}"])
    assert order.dtype == np.uint16
    np.testing.assert_array_equal(order, tensors[f"order/{case}"])


def test_groups_and_orders_are_the_records_bytes_before_lrzip():
    tensors, _ = golden()
    parts = pergroup.split(record_payload({k: v for k, v in tensors.items() if k.startswith("w/")}))
    names = [g["name"] for g in json.loads(parts.layout)["groups"]]
    assert names == list(pergroup.GROUPS)  # every kind present, in the record's stream order
    for name, blob in zip(names, parts.groups, strict=True):
        assert blob == tensors[f"group/{name}"].tobytes(), name
    assert parts.orders == tensors["perms"].astype("<u2").tobytes()
    assert b"attn_gate_w" in parts.rest  # an int8 tensor no group takes stays in the rest, as in the record


def test_a_changed_sort_breaks_the_golden(monkeypatch):
    """The golden can fail: the highest index among equal distances instead of the lowest, or rows
    left in their order, give other bytes."""
    tensors, _ = golden()
    original = pergroup.similarity_order

    def last_of_ties(matrix):
        flipped = original(matrix[::-1].copy())
        return (matrix.shape[0] - 1 - flipped.astype(np.int64)).astype(np.uint16)

    assert not np.array_equal(last_of_ties(tensors["sort/few_values"]), tensors["order/few_values"])
    payload = record_payload({k: v for k, v in tensors.items() if k.startswith("w/")})
    monkeypatch.setattr(pergroup, "similarity_order", lambda m: np.arange(m.shape[0], dtype=np.uint16))
    parts = pergroup.split(payload)
    assert parts.groups[0] != tensors["group/tok_emb.weight"].tobytes()
    assert parts.groups[1] == tensors["group/attn.c_k.weight"].tobytes()  # a kind the record does not sort


@NEEDS_LRZIP
def test_lrzip_streams_are_the_records_where_lrzip_is_the_same():
    """Each group through lrzip: the bytes the record's own call made (same lrzip version), and the
    record's whole blob read back by the same groups."""
    tensors, meta = golden()
    here = subprocess.run(["lrzip", "-V"], capture_output=True, text=True).stdout.strip()
    if here != meta["lrzip"]:
        pytest.skip(f"{here} here, the golden was made with {meta['lrzip']}")
    for name in pergroup.GROUPS:
        group = tensors[f"group/{name}"].tobytes()
        assert pergroup._lrzip(group, pergroup.LRZIP_ARGS) == tensors[f"lrzip/{name}"].tobytes(), name
        assert pergroup._lrzip(tensors[f"lrzip/{name}"].tobytes(), ("-d",)) == group


def test_join_inverts_split_and_other_bytes_have_no_groups():
    tensors, _ = golden()
    payload = record_payload({k: v for k, v in tensors.items() if k.startswith("w/")})
    parts = pergroup.split(payload)
    assert len(parts.rest) + sum(map(len, parts.groups)) == len(payload)
    assert pergroup.join(parts.layout, parts.groups, parts.orders, parts.rest) == payload
    plain = pergroup.split(b"not a safetensors file at all")
    assert (plain.groups, plain.orders, plain.rest) == ([], b"", b"not a safetensors file at all")
    with pytest.raises(ValueError, match="do not have the sizes"):
        pergroup.join(parts.layout, parts.groups, parts.orders, parts.rest[:-1])


def test_similarity_order_visits_each_row_once():
    rng = np.random.default_rng(3)
    for shape in ((1, 5), (2, 3), (257, 7)):
        order = pergroup.similarity_order(rng.integers(-128, 128, shape).astype(np.int8))
        assert order[0] == 0 and sorted(order.tolist()) == list(range(shape[0]))


# ---------------------------------------------------------------- the container
def assert_same_model(a: mixed.MixedModel, b: mixed.MixedModel) -> None:
    assert a.info == b.info
    for part in ("quantized", "scales", "passthrough"):
        x, y = getattr(a, part), getattr(b, part)
        assert x.keys() == y.keys()
        assert all(x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]) for k in x)


@NEEDS_LRZIP
@pytest.mark.parametrize("shuffle", [0, 2])
def test_round_trip_is_exact_and_the_bytes_repeat(tmp_path, shuffle):
    model = record_model()
    info = container.write_artifact(
        tmp_path / "m.pgolf", mixed.mixed_artifact_bytes(model, "pergroup", shuffle=shuffle), "pergroup"
    )
    blob = info.path.read_bytes()
    assert blob[len(container.MAGIC)] == compress.COMPRESSORS["pergroup"].id | (0x80 if shuffle else 0)
    assert_same_model(read_pgolf_artifact(info.path), model)
    assert mixed.mixed_artifact_bytes(model, "pergroup", shuffle=shuffle) == blob  # the same bytes again


@NEEDS_LRZIP
@pytest.mark.slow  # ~20 s on 2 cores: lrzip's ZPAQ over 270 KB
def test_a_quantized_model_round_trips(tmp_path, mixed_model):
    """What quantize_mixed makes (GPTQ, int5-8, a 1-D int tensor, fp32 controls, a raw int64) comes back."""
    path = container.write_artifact(
        tmp_path / "m.pgolf", mixed.mixed_artifact_bytes(mixed_model, "pergroup"), "pergroup"
    ).path
    assert_same_model(read_pgolf_artifact(path), mixed_model)


@NEEDS_LRZIP
def test_the_budget_table_compresses_each_class_by_groups():
    model = record_model()
    model.info["tok_emb.weight"]["class"] = "embedding"
    rows = {r["class"]: r for r in budget_table(model, "pergroup", shuffle=2)}
    assert rows["embedding"]["tensors"] == 1 and rows["other"]["tensors"] == LAYERS * 6 + 1
    assert rows["embedding"]["bytes_compressed"] > 1024  # an lrzip stream of its 64 x 16 values, and more
    assert rows["total"]["bytes_compressed"] == len(mixed.mixed_artifact_bytes(model, "pergroup", shuffle=2))


@NEEDS_LRZIP
def test_damaged_bodies_are_value_errors():
    body = container.pack_body(mixed.mixed_artifact_bytes(record_model(), "none", shuffle=0), "pergroup")
    for damaged, reason in [
        (body[:-5], "do not add up"),
        (body[:3], "stream table is damaged"),
        (body[:1] + b"\x00\x00\x00\x00" + body[5:], "stream table is damaged"),
    ]:
        with pytest.raises(ValueError, match=reason):
            container.unpack_body(damaged)


@NEEDS_LRZIP
def test_a_changed_byte_in_a_group_is_one_damaged_line(tmp_path):
    blob = bytearray(mixed.mixed_artifact_bytes(record_model(), "pergroup", shuffle=2))
    blob[-container.DIGEST_BYTES - 40] ^= 0x01  # inside the last lrzip stream
    path = tmp_path / "m.pgolf"
    path.write_bytes(bytes(blob))
    with pytest.raises(
        PgolfError, match=r"^artifact .*m\.pgolf is damaged: lrzip -d failed: MD5 CHECK FAILED\.$"
    ):
        read_pgolf_artifact(path)


# ---------------------------------------------------------------- lrzip missing
LRZIP_LINE = (
    "lrzip program, which is not installed",
    "apt-get install lrzip",
    "brew install lrzip",
    "--compressor brotli",
)


def test_a_missing_lrzip_is_one_line_before_training(monkeypatch, tmp_path):
    from core.runs.setup import training_runs

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    with pytest.raises(PgolfError) as caught:
        training_runs("auto", "smoke", None, {"compressor": "pergroup", "out_dir": str(tmp_path)})
    message = str(caught.value)
    assert "\n" not in message and all(part in message for part in LRZIP_LINE), message
    assert list(tmp_path.iterdir()) == []
    compress.check_available("brotli")  # the others are not refused
    assert default_compression(Config()) == COMPRESSION  # and the fit does not try it


@needs("cuda")
def test_a_run_without_lrzip_stops_before_it_reads_anything(sotu_dataset, tmp_path, monkeypatch):
    """The training loop checks too (a packaged train_gpt.py runs it without core/runs/setup.py)."""
    from core.train import loop

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    backend = make_backend("cuda", sotu_dataset.config(out_dir=str(tmp_path), compressor="pergroup"))
    try:
        with pytest.raises(PgolfError, match="lrzip program, which is not installed"):
            loop.train(backend, log=lambda line: None)
    finally:
        backend.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # ~3 s
def test_train_without_lrzip_stops_at_its_first_line(tmp_path):
    """The CLI, with no lrzip on its PATH: one error line, nothing trained, nothing written."""
    empty = tmp_path / "bin"
    empty.mkdir()
    runs = tmp_path / "runs"
    result = cli(
        "train",
        "--preset",
        "smoke",
        "--compressor",
        "pergroup",
        "--out-dir",
        str(runs),
        env={"PATH": str(empty)},
    )
    assert_one_line_error(result, *LRZIP_LINE)
    assert not runs.exists() and "step:" not in result.stdout


def test_the_fit_tries_pergroup_where_lrzip_is_installed_unless_it_keeps_the_compressor(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: f"/usr/bin/{name}")
    assert default_compression(Config()) == (*COMPRESSION, PERGROUP)
    assert default_compression(Config(artifact_fit_keep_compressor=True)) == ()


@NEEDS_LRZIP
def test_reading_a_pergroup_artifact_without_lrzip_is_one_line(tmp_path, monkeypatch):
    path = container.write_artifact(
        tmp_path / "m.pgolf", mixed.mixed_artifact_bytes(record_model(), "pergroup"), "pergroup"
    ).path
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    with pytest.raises(PgolfError) as caught:
        read_pgolf_artifact(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"artifact {path}: reading a pergroup artifact needs")
    assert all(part in message for part in LRZIP_LINE[:3]) and "--compressor" not in message


def test_the_record_0427_preset_names_pergroup():
    assert preset("record_0427").compressor == "pergroup"
    assert preset("record_0427_tiny").compressor == "brotli"  # runs where lrzip is not installed


# ---------------------------------------------------------------- the record's own file
@pytest.mark.slow
@NEEDS_LRZIP
@requires_torch
def test_the_records_pergroup_file_reads_as_its_brotli_one(monkeypatch):
    """Record 2026-04-27's model written by its `_serialize_pergroup` (tests/golden/make_pergroup.py) is,
    as `eval` reads it, the model of its brotli file, array for array (the groups, their row orders,
    the LQER factors and gate rows in its rest)."""
    pergroup_file = GOLDEN / "record_eval_0427_pergroup.ptz"
    model, same = read_artifact(pergroup_file), read_artifact(GOLDEN / "record_eval_0427.ptz")
    assert_same_model(model, same)
    assert model.lqer.keys() == same.lqer.keys() and model.lqer
    for name, factors in same.lqer.items():
        assert all(np.array_equal(model.lqer[name][k], v) for k, v in factors.items())
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    with pytest.raises(PgolfError) as caught:
        read_artifact(pergroup_file)
    message = str(caught.value)
    assert "\n" not in message and all(part in message for part in LRZIP_LINE[:3])
    assert "--compressor" not in message  # reading: another compressor is no way out
