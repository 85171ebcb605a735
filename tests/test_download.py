"""`data download` against a local stand-in for the Hugging Face dataset repo (no network)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
from pathlib import Path

import numpy as np
import pytest

from core.common.errors import PgolfError
from core.data.manifest import file_sha256, read_manifest
from core.data.shards import read_shard
from core.datasets.fineweb import download_fineweb, hub_fetcher
from core.datasets.writers import write_shard
from tests.support.cli import IMPORTABLE

DATASET = "datasets/fineweb10B_sp1024"
TRAIN_SHARDS = 3


def fake_manifest() -> dict:
    """The challenge manifest's shape, shrunk: 2 val docs, one val and three train shards."""
    tokenizer = {
        "name": "sp_bpe_1024",
        "kind": "sentencepiece_bpe",
        "vocab_size": 1024,
        "bos_id": 1,
        "eos_id": 2,
        "model_path": "tokenizers/fineweb_1024_bpe.model",
        "vocab_path": "tokenizers/fineweb_1024_bpe.vocab",
    }
    dataset = {
        "name": "fineweb10B_sp1024",
        "tokenizer_name": "sp_bpe_1024",
        "tokenizer_kind": "sentencepiece_bpe",
        "path": DATASET,
        "train_glob": f"{DATASET}/fineweb_train_*.bin",
        "val_glob": f"{DATASET}/fineweb_val_*.bin",
        "vocab_size": 1024,
        "bos_id": 1,
        "eos_id": 2,
        "stats": {"docs_val": 2, "docs_train": 6, "files_val": 1, "files_train": TRAIN_SHARDS},
    }
    byte_dataset = {**dataset, "name": "fineweb10B_byte260", "path": "datasets/fineweb10B_byte260"}
    return {
        "version": "10B",
        "num_val_docs": 2,
        "datasets": [dataset, byte_dataset],
        "tokenizers": [tokenizer],
    }


@pytest.fixture
def remote(tmp_path, challenge_dir) -> Path:
    """A fake repo tree: everything under `datasets/`, as on the Hub."""
    top = tmp_path / "remote" / "datasets"
    (top / DATASET).mkdir(parents=True)
    (top / "manifest.json").write_text(json.dumps(fake_manifest()))
    rng = np.random.default_rng(0)
    # Two validation documents, each [bos] + ids.
    write_shard(top / DATASET / "fineweb_val_000000.bin", np.array([1, 5, 6, 7, 1, 8, 9]))
    for i in range(TRAIN_SHARDS):
        write_shard(top / DATASET / f"fineweb_train_{i:06d}.bin", rng.integers(0, 1024, size=50 + i))
    (top / "tokenizers").mkdir()
    model = top / "tokenizers" / "fineweb_1024_bpe.model"
    shutil.copy(challenge_dir / "fineweb_1024_bpe.model", model)
    (top / "tokenizers" / "fineweb_1024_bpe.vocab").write_text("<pad>\t0\n")
    return top.parent


class CopyFetch:
    """Copies from the stand-in and records what was asked for."""

    def __init__(self, remote: Path):
        self.remote, self.calls = remote, []

    def __call__(self, path: str, dest: Path) -> None:
        self.calls.append(path)
        shutil.copyfile(self.remote / path, dest)


def test_layout_manifest_and_idempotence(tmp_path, remote):
    out = tmp_path / "data"
    # The embedded corpus may already be there: its entries must survive.
    out.mkdir()
    sotu = {"name": "sotu_sp1024", "tokenizer_name": "sotu_1024_bpe"}
    (out / "manifest.json").write_text(
        json.dumps({"datasets": [sotu], "tokenizers": [{"name": "sotu_1024_bpe"}]})
    )
    fetch, messages = CopyFetch(remote), []
    summary = download_fineweb(out, train_shards=2, fetch=fetch, progress=messages.append)

    assert fetch.calls[0] == "datasets/manifest.json"
    assert sorted(p.name for p in (out / DATASET).iterdir()) == [
        "fineweb_train_000000.bin",
        "fineweb_train_000001.bin",
        "fineweb_val_000000.bin",
    ]
    assert sorted(p.name for p in (out / "tokenizers").iterdir()) == [
        "fineweb_1024_bpe.model",
        "fineweb_1024_bpe.vocab",
    ]
    for name in ("fineweb_val_000000.bin", "fineweb_train_000001.bin"):
        assert (out / DATASET / name).read_bytes() == (remote / "datasets" / DATASET / name).read_bytes()
    assert read_shard(out / DATASET / "fineweb_val_000000.bin").tolist() == [1, 5, 6, 7, 1, 8, 9]
    assert not list(out.rglob(".*"))  # no staging files left behind

    manifest = read_manifest(out)
    assert [d["name"] for d in manifest["datasets"]] == ["sotu_sp1024", "fineweb10B_sp1024"]
    assert [t["name"] for t in manifest["tokenizers"]] == ["sotu_1024_bpe", "sp_bpe_1024"]
    fetched = {**manifest["datasets"][1]}
    digests = fetched.pop("sha256")  # recorded at download, for `data verify`
    tokenizer = fetched.pop("tokenizer_sha256")  # the file that made the shards, checked when they are read
    assert tokenizer == file_sha256(out / "tokenizers" / "fineweb_1024_bpe.model")
    assert fetched == fake_manifest()["datasets"][0]
    assert digests == {p.name: file_sha256(p) for p in sorted((out / DATASET).glob("fineweb_*.bin"))}
    assert summary["downloaded"] == 5 and summary["already_present"] == 0
    assert summary["tokens_val"] == 7 and summary["tokens_train"] == 50 + 51
    assert len(messages) == 7 and any("fineweb_train_000001.bin" in m for m in messages)  # + the checksums

    # Second run: everything is present, nothing is fetched, not even the manifest.
    fetch.calls.clear()
    again = download_fineweb(out, train_shards=2, fetch=fetch)
    assert fetch.calls == []
    assert again["downloaded"] == 0 and again["already_present"] == 5
    # Asking for one more shard fetches exactly that shard.
    download_fineweb(out, train_shards=3, fetch=fetch)
    assert fetch.calls == [f"datasets/{DATASET}/fineweb_train_000002.bin"]


def test_truncated_local_shard_is_fetched_again(tmp_path, remote):
    out = tmp_path / "data"
    fetch = CopyFetch(remote)
    download_fineweb(out, train_shards=1, fetch=fetch)
    shard = out / DATASET / "fineweb_train_000000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    fetch.calls.clear()
    download_fineweb(out, train_shards=1, fetch=fetch)
    assert fetch.calls == [f"datasets/{DATASET}/fineweb_train_000000.bin"]
    assert shard.read_bytes() == (remote / "datasets" / DATASET / shard.name).read_bytes()


def test_unknown_variant_lists_the_available_ones(tmp_path, remote):
    with pytest.raises(PgolfError, match=r"unknown variant 'sp4096'.*byte260, sp1024"):
        download_fineweb(tmp_path / "data", variant="sp4096", fetch=CopyFetch(remote))


def test_a_malformed_variant_is_refused_before_any_fetch(tmp_path, remote):
    fetch = CopyFetch(remote)
    with pytest.raises(PgolfError, match="'sp1o24' is not a variant name"):
        download_fineweb(tmp_path / "data", variant="sp1o24", fetch=fetch)
    assert fetch.calls == [] and not (tmp_path / "data").exists()


def test_too_many_train_shards(tmp_path, remote):
    with pytest.raises(PgolfError, match=r"only 3 training shards.*4 were asked"):
        download_fineweb(tmp_path / "data", train_shards=4, fetch=CopyFetch(remote))
    with pytest.raises(PgolfError, match=">= 0"):
        download_fineweb(tmp_path / "data", train_shards=-1, fetch=CopyFetch(remote))


def test_corrupt_shard_is_named_and_not_kept(tmp_path, remote):
    bad = remote / "datasets" / DATASET / "fineweb_train_000001.bin"
    bad.write_bytes(bad.read_bytes()[:-3])
    out = tmp_path / "data"
    with pytest.raises(PgolfError, match=r"fineweb_train_000001\.bin.*corrupt") as info:
        download_fineweb(out, train_shards=2, fetch=CopyFetch(remote))
    assert ".part" not in str(info.value)
    assert not (out / DATASET / "fineweb_train_000001.bin").exists()
    assert not list((out / DATASET).glob(".*"))
    # The shard before it is kept; the manifest does not list an incomplete dataset.
    assert (out / DATASET / "fineweb_train_000000.bin").is_file()
    assert read_manifest(out)["datasets"] == []


def test_bad_manifest_paths_are_refused(tmp_path, remote):
    manifest = fake_manifest()
    manifest["tokenizers"][0]["model_path"] = "../../outside.model"
    (remote / "datasets" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PgolfError, match="must be relative"):
        download_fineweb(tmp_path / "data", train_shards=0, fetch=CopyFetch(remote))


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda m: m["datasets"][0]["stats"].update(files_train=1e300), "has no shard counts"),
        (lambda m: m["datasets"][0]["stats"].update(files_val=1.5), "has no shard counts"),
        (lambda m: m["datasets"][0].update(stats="many"), "has no shard counts"),
        (lambda m: m["datasets"][0].update(path="datasets/a\u0000b"), "must be relative and stay inside"),
        (lambda m: m.update(deep=json.loads("[" * 70 + "]" * 70)), "nested deeper than 64"),
    ],
)
def test_a_published_manifest_that_is_not_one_is_refused_in_one_line(tmp_path, remote, change, says):
    manifest = fake_manifest()
    change(manifest)
    (remote / "datasets" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PgolfError, match=says) as refused:
        download_fineweb(tmp_path / "data", train_shards=1, fetch=CopyFetch(remote))
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "error",
    [
        ConnectionResetError("connection reset by peer"),
        urllib.error.HTTPError("https://hf.co/x", 503, "Service Unavailable", None, None),  # type: ignore[arg-type]
    ],
)
def test_failing_fetch(tmp_path, remote, error):
    copy = CopyFetch(remote)

    def fetch(path: str, dest: Path) -> None:
        if path.endswith("fineweb_val_000000.bin"):
            dest.write_bytes(b"half a file")  # then the connection drops
            raise error
        copy(path, dest)

    out = tmp_path / "data"
    with pytest.raises(PgolfError, match=r"download of datasets/.*fineweb_val_000000\.bin failed"):
        download_fineweb(out, train_shards=1, fetch=fetch)
    assert not list((out / DATASET).iterdir())


def test_default_fetch_calls_the_hub_and_links(tmp_path, monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    blob = tmp_path / "cache" / "blob"
    blob.parent.mkdir()
    blob.write_bytes(b"shard bytes")
    snapshot = tmp_path / "cache" / "fineweb_val_000000.bin"
    snapshot.symlink_to(blob)  # the HF cache hands out symlinks into its blob store
    seen = []

    def fake_download(**kwargs):
        seen.append(kwargs)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    dest = tmp_path / "out" / "file.bin"
    hub_fetcher("someone/repo")(f"datasets/{DATASET}/fineweb_val_000000.bin", dest)
    assert seen == [
        {
            "repo_id": "someone/repo",
            "repo_type": "dataset",
            "filename": "fineweb_val_000000.bin",
            "subfolder": f"datasets/{DATASET}",
        }
    ]
    assert not dest.is_symlink() and dest.read_bytes() == b"shard bytes"
    assert dest.stat().st_ino == blob.stat().st_ino  # hard-linked, not copied

    # Where a link is impossible (another file system), it copies.
    def no_link(*args):
        raise OSError("cross-device link")

    monkeypatch.setattr("core.datasets.fineweb.os.link", no_link)
    copied = tmp_path / "out" / "copy.bin"
    hub_fetcher()("datasets/manifest.json", copied)
    assert seen[-1]["subfolder"] == "datasets" and seen[-1]["repo_id"] == "willdepueoai/parameter-golf"
    assert copied.read_bytes() == b"shard bytes" and copied.stat().st_ino != blob.stat().st_ino


def test_default_fetch_turns_hub_errors_into_one_line(tmp_path, monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")
    httpx = pytest.importorskip("httpx")
    from huggingface_hub.errors import HfHubHTTPError

    url = "https://huggingface.co/datasets/x/y/resolve/main/datasets/manifest.json"
    response = httpx.Response(404, request=httpx.Request("GET", url))
    errors = [
        HfHubHTTPError("404 Client Error: Not Found", response=response),
        httpx.ConnectError("no route"),
    ]

    def failing_download(**kwargs):
        raise errors.pop(0)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", failing_download)
    for expected in ("404 Client Error", "no route"):
        with pytest.raises(
            PgolfError, match=rf"download of datasets/manifest.json from x/y failed: {expected}"
        ):
            download_fineweb(tmp_path / "data", repo_id="x/y")


def test_core_download_does_not_import_the_hub():
    code = "import sys, core.datasets.fineweb; assert 'huggingface_hub' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], env=os.environ | IMPORTABLE, check=True, timeout=60)


def test_stand_in_manifest_has_the_challenge_shape(challenge_dir):
    """The stand-in's entries use only keys the real manifest has."""
    real = json.loads((challenge_dir / "manifest.json").read_text())
    ours = fake_manifest()
    assert set(ours["datasets"][0]) <= set(real["datasets"][0])
    assert set(ours["tokenizers"][0]) <= set(real["tokenizers"][0])
    assert ours["datasets"][0]["path"] == real["datasets"][0]["path"]


@pytest.mark.parametrize("how", ["flag", "env"])
def test_cli_download_through_the_default_fetch(tmp_path, monkeypatch, remote, how):
    """`cli.py data download` end to end, with the hub replaced by the stand-in; the repo is
    named by --repo-id or by the challenge script's MATCHED_FINEWEB_REPO_ID."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from typer.testing import CliRunner

    from cli import app

    def fake_download(repo_id, filename, subfolder=None, repo_type=None):
        assert (repo_id, repo_type) == ("someone/repo", "dataset")
        return str(remote / (subfolder or "") / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    out = tmp_path / "data"
    args = ["data", "download", "--out", str(out), "--train-shards", "2"]
    if how == "flag":
        args += ["--repo-id", "someone/repo"]
    else:
        monkeypatch.setenv("MATCHED_FINEWEB_REPO_ID", "someone/repo")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "downloaded: 5" in result.output
    assert (out / DATASET / "fineweb_train_000001.bin").is_file()
    assert "downloaded: 0" in CliRunner().invoke(app, args).output


# ------------------------------------------------------------- the records' CaseOps variant
CASEOPS_REPO, CASEOPS_VARIANT = (
    "romeerp/parameter-golf-caseops-v1",
    "sp8192_lossless_caps_caseops_v1_reserved",
)
CASEOPS_DATASET = f"datasets/fineweb10B_{CASEOPS_VARIANT}"
CASEOPS_TOKENIZER = "tokenizers/fineweb_8192_bpe_lossless_caps_caseops_v1_reserved"


@pytest.fixture
def caseops_remote(tmp_path_factory) -> Path:
    """A stand-in for the CaseOps repo, with the entries its exporter writes (a dataset naming its
    val_bytes_glob, a tokenizer naming its text_transform), filled with the embedded corpus's CaseOps
    data (a real tokenizer and sidecar, so that the download can be scored)."""
    from core.datasets.embedded import prepare_sotu

    made = tmp_path_factory.mktemp("made")
    prepare_sotu(made, vocab_size=512, limit_docs=20, shard_tokens=8_000, case_ops=True)
    top = tmp_path_factory.mktemp("caseops_remote") / "datasets"
    (top / CASEOPS_DATASET).mkdir(parents=True)
    (top / "tokenizers").mkdir()
    source = made / "datasets" / "sotu_sp512_caseops"
    for shard in source.iterdir():
        shutil.copyfile(shard, top / CASEOPS_DATASET / shard.name)
    for suffix in (".model", ".vocab"):
        shutil.copyfile(
            made / "tokenizers" / f"sotu_512_bpe_caseops{suffix}", top / f"{CASEOPS_TOKENIZER}{suffix}"
        )
    made_entry = read_manifest(made)["datasets"][0]
    tokenizer = {
        "name": "sp_bpe_8192_lossless_caps_caseops_v1_reserved",
        "kind": "sentencepiece_bpe",
        "vocab_size": 512,
        "bos_id": 1,
        "eos_id": 2,
        "text_transform": "lossless_caps_caseops_v1",
        "reserve_text_transform_controls": True,
        "model_path": f"{CASEOPS_TOKENIZER}.model",
        "vocab_path": f"{CASEOPS_TOKENIZER}.vocab",
    }
    dataset = {
        "name": f"fineweb10B_{CASEOPS_VARIANT}",
        "tokenizer_name": tokenizer["name"],
        "tokenizer_kind": "sentencepiece_bpe",
        "path": CASEOPS_DATASET,
        "train_glob": f"{CASEOPS_DATASET}/fineweb_train_*.bin",
        "val_glob": f"{CASEOPS_DATASET}/fineweb_val_*.bin",
        "vocab_size": 512,
        "bos_id": 1,
        "eos_id": 2,
        "val_bytes_glob": f"{CASEOPS_DATASET}/fineweb_val_bytes_*.bin",
        "stats": made_entry["stats"],
    }
    manifest = {"version": "10B", "datasets": [dataset], "tokenizers": [tokenizer]}
    (top / "manifest.json").write_text(json.dumps(manifest))
    return top.parent


def test_the_caseops_variant_comes_with_its_sidecar_and_scores_with_it(tmp_path, monkeypatch, caseops_remote):
    """The records' command, offline: `data download --repo-id romeerp/parameter-golf-caseops-v1
    --variant sp8192_lossless_caps_caseops_v1_reserved` fetches each validation shard's byte sidecar,
    records its SHA-256, and `--dataset` then scores with it."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from typer.testing import CliRunner

    from cli import app
    from core.config.presets import preset
    from core.data.manifest import dataset_settings
    from core.eval.score import load_eval_data

    def fake_download(repo_id, filename, subfolder=None, repo_type=None):
        assert (repo_id, repo_type) == (CASEOPS_REPO, "dataset")
        return str(caseops_remote / (subfolder or "") / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    out = tmp_path / "data"
    args = ["data", "download", "--out", str(out), "--repo-id", CASEOPS_REPO, "--variant", CASEOPS_VARIANT]
    result = CliRunner().invoke(app, [*args, "--train-shards", "1"])
    assert result.exit_code == 0, result.output
    files_val = read_manifest(caseops_remote / "datasets")["datasets"][0]["stats"]["files_val"]
    assert files_val > 1 and "byte_sidecar: True" in result.output
    sidecars = sorted((out / CASEOPS_DATASET).glob("fineweb_val_bytes_*.bin"))
    assert [p.name for p in sidecars] == [f"fineweb_val_bytes_{i:06d}.bin" for i in range(files_val)]
    for p in sidecars:
        assert p.read_bytes() == (caseops_remote / "datasets" / CASEOPS_DATASET / p.name).read_bytes()
    entry = read_manifest(out)["datasets"][0]
    assert {p.name: file_sha256(p) for p in sidecars}.items() <= entry["sha256"].items()
    assert (
        f"tokens_val: {sum(len(read_shard(p)) for p in (out / CASEOPS_DATASET).glob('fineweb_val_0*.bin'))}"
        in result.output
    )

    found = dataset_settings(entry["name"], out)
    assert found["caseops_enabled"] is True
    data = load_eval_data(preset("smoke").replace(**found, eval_seq_len=64))
    sidecar = np.concatenate([read_shard(p) for p in sidecars])
    assert data.target_bytes[1:].tolist() == sidecar[1 : len(data.tokens)].tolist()


def test_a_caseops_sidecar_missing_or_short_on_the_repo_is_refused(tmp_path, caseops_remote):
    folder = caseops_remote / "datasets" / CASEOPS_DATASET
    short = read_shard(folder / "fineweb_val_bytes_000001.bin")[:-1]
    write_shard(folder / "fineweb_val_bytes_000001.bin", short)
    out = tmp_path / "data"
    with pytest.raises(
        PgolfError,
        match=r"fineweb_val_bytes_000001.bin does not have one entry per token of fineweb_val_000001.bin",
    ):
        download_fineweb(out, CASEOPS_VARIANT, 1, CASEOPS_REPO, fetch=CopyFetch(caseops_remote))
    assert read_manifest(out)["datasets"] == []  # not listed: scoring would refuse it anyway
    (folder / "fineweb_val_bytes_000001.bin").unlink()
    with pytest.raises(PgolfError, match=r"download of datasets/.*fineweb_val_bytes_000001.bin failed"):
        download_fineweb(
            tmp_path / "other", CASEOPS_VARIANT, 1, CASEOPS_REPO, fetch=CopyFetch(caseops_remote)
        )
