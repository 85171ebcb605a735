"""The data manifest (`data/manifest.json`): the datasets and tokenizers a data folder holds.

`data prepare` and `data download` add entries; `--dataset NAME` looks one up. A dataset entry
also records the SHA-256 of each of its shards (`"sha256": {file name: hex digest}`), which
`data verify` checks. Training itself checks every shard's header and size when it starts (a
cut or padded shard fails at once); a flipped token inside a shard only the full hash finds.
"""

from __future__ import annotations

import fnmatch
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from core.common.errors import PgolfError
from core.common.files import file_sha256, read_json, write_atomic
from core.data.shards import MAX_VOCAB, read_shard_header

DATA_ROOT = "data"  # datasets/, tokenizers/ and manifest.json, relative to the working folder
MAX_MANIFEST_BYTES = 1 << 26  # the challenge's, with a digest per shard, is a few KB


def read_manifest(root: str | Path) -> dict[str, Any]:
    """The manifest of data folder `root` (none yet: no entries), read through the guarded reader."""
    path = Path(root) / "manifest.json"
    if not path.exists() and not path.is_symlink():
        return {"datasets": [], "tokenizers": []}
    manifest = read_json(path, "manifest", MAX_MANIFEST_BYTES)
    if not isinstance(manifest, dict):
        raise PgolfError(f"manifest {path} must be a JSON object")
    for key in ("datasets", "tokenizers"):
        entries = manifest.setdefault(key, [])
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise PgolfError(f"manifest {path}: '{key}' must be a list of objects")
    return manifest


def merge_manifest(root: Path, dataset: dict[str, Any], tokenizer: dict[str, Any]) -> None:
    """Add or replace one dataset and its tokenizer, keeping every other entry. The dataset's entry
    records the SHA-256 of the tokenizer file that made it (`tokenizer_sha256`, see `check_tokenizer`)."""
    model = Path(root) / manifest_path(tokenizer.get("model_path") or "")
    if model.is_file():
        dataset = {**dataset, "tokenizer_sha256": file_sha256(model, "tokenizer")}
    manifest = read_manifest(root)
    for key, entry in (("datasets", dataset), ("tokenizers", tokenizer)):
        others = [e for e in manifest[key] if e.get("name") != entry["name"]]
        manifest[key] = [*others, entry]
    write_atomic(root / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())


def find_entries(manifest: dict[str, Any], name: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The dataset entry `name` of a manifest and its tokenizer's entry; None when it lists no such dataset."""
    datasets = [d for d in manifest.get("datasets") or [] if isinstance(d, dict) and d.get("name") == name]
    if not datasets:
        return None
    tok_name = datasets[0].get("tokenizer_name")
    tokenizers = [
        t for t in manifest.get("tokenizers") or [] if isinstance(t, dict) and t.get("name") == tok_name
    ]
    if not tokenizers:
        raise PgolfError(f"manifest: dataset {name} names tokenizer {tok_name!r}, which it does not list")
    return datasets[0], tokenizers[0]


def manifest_path(path: Any) -> str:
    """A manifest path, refused if it could point outside the data folder."""
    p = PurePosixPath(str(path))
    if p.is_absolute() or ".." in p.parts or not p.parts or "\0" in str(path):
        raise PgolfError(f"manifest path {path!r} must be relative and stay inside the data folder")
    return p.as_posix()


def dataset_settings(name: str, root: str | Path = DATA_ROOT) -> dict[str, Any]:
    """data_path, tokenizer_path, vocab_size and caseops_enabled of the dataset `name` listed in
    `root/manifest.json`: caseops_enabled when its entry names a validation byte sidecar (val_bytes_glob)."""
    manifest = read_manifest(root)
    found = find_entries(manifest, name)
    if found is None:
        listed = ", ".join(d.get("name", "?") for d in manifest["datasets"]) or "none yet"
        raise PgolfError(
            f"unknown dataset {name!r}: {Path(root) / 'manifest.json'} lists {listed} "
            "(cli.py data prepare / data download add entries)"
        )
    dataset, tokenizer = found
    vocab_size = dataset.get("vocab_size")
    if type(vocab_size) is not int or not 1 < vocab_size <= MAX_VOCAB or not tokenizer.get("model_path"):
        raise PgolfError(
            f"manifest entry {name} lacks its vocab_size (a whole number in 2..{MAX_VOCAB}) or its "
            "tokenizer's model_path"
        )
    model = manifest_path(tokenizer["model_path"])
    return {
        "data_path": str(
            _stable(Path(root), manifest_path(dataset.get("path") or f"datasets/{name}"), f"datasets/{name}")
        ),
        "tokenizer_path": str(_stable(Path(root), model, f"tokenizers/{Path(model).name}")),
        "vocab_size": vocab_size,
        "caseops_enabled": bool(dataset.get("val_bytes_glob")),  # the data has a byte sidecar: BPB counts it
    }


def _stable(root: Path, listed: str, link: str) -> Path:
    """The path a run should keep for the listed path: the link a prepare keeps in place (`datasets/<name>`,
    `tokenizers/<tok>.model`) where it names the same file, else the listed (versioned) path itself."""
    stable = root / link
    return stable if stable.resolve() == (root / listed).resolve() else root / listed


def check_tokenizer(data_path: str | Path, tokenizer_path: str | Path) -> None:
    """Refuse a tokenizer that did not make the dataset in `data_path`: the manifest of its data folder
    (`<root>/manifest.json` for `<root>/datasets/<name>`) records the SHA-256 of the tokenizer file
    of each dataset it lists. A folder no manifest lists, or an entry without that hash (written by an
    older pgolf), is not checked. Called by the commands (core/runs/setup.py: train, eval, verify)."""
    found = listed_entry(data_path)
    if found is None or not Path(tokenizer_path).is_file():
        return  # nothing to check against, or a tokenizer its reader will refuse by name
    root, entry = found
    name, recorded = entry.get("name"), entry.get("tokenizer_sha256")
    if not isinstance(recorded, str):
        return
    _check_digest(
        tokenizer_path, root, name, recorded,
        " (set --tokenizer-path to the dataset's, or choose the data with --dataset)",
    )  # fmt: skip


def _check_digest(tokenizer_path: str | Path, root: Path, name: Any, recorded: Any, advice: str) -> None:
    """Refuse the tokenizer file whose SHA-256 is not the one the manifest recorded for dataset `name`."""
    if not isinstance(recorded, str):
        raise PgolfError(
            f"manifest {root / 'manifest.json'}: dataset {name}'s tokenizer_sha256 is not a digest"
        )
    given = file_sha256(tokenizer_path, "tokenizer")
    if given != recorded:
        raise PgolfError(
            f"tokenizer {tokenizer_path} did not make dataset {name}: {root / 'manifest.json'} records its "
            f"tokenizer's SHA-256 as {recorded[:12]}…, this file's is {given[:12]}…{advice}"
        )


def listed_entry(data_path: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """(data folder, manifest entry) of the dataset folder `data_path` (`<root>/datasets/<name>`), when
    the manifest of its data folder lists it; None otherwise."""
    folder = Path(data_path).resolve()
    root = folder.parent.parent
    if not (root / "manifest.json").is_file():
        return None
    for entry in read_manifest(root)["datasets"]:
        try:
            listed = (root / manifest_path(entry.get("path") or f"datasets/{entry.get('name')}")).resolve()
        except PgolfError:
            continue
        if listed == folder:
            return root, entry
    return None


def shard_digests(folder: str | Path) -> dict[str, str]:
    """{file name: SHA-256} of the shards in a dataset folder."""
    return {p.name: file_sha256(p) for p in sorted(Path(folder).glob("fineweb_*.bin"))}


def verify_dataset(
    root: str | Path,
    name: str,
    progress: Callable[[str], None] | None = None,
    shards: str = "fineweb_*.bin",
) -> dict[str, Any]:
    """Check a listed dataset: its tokenizer file against the SHA-256 the manifest recorded, and each of
    its shards matching `shards` (every one by default; the validation ones, "fineweb_val_*.bin", for
    `data verify --bytes`): its header and size, its SHA-256 against the one the manifest recorded, and
    that the validation shards hold tokens. Raises PgolfError naming the first file that fails;
    returns counts."""
    say, root = progress or (lambda message: None), Path(root)
    found = find_entries(read_manifest(root), name)
    if found is None:
        raise PgolfError(f"unknown dataset {name!r} in {root / 'manifest.json'}")
    dataset, tokenizer = found
    folder = _stable(root, manifest_path(dataset.get("path") or f"datasets/{name}"), f"datasets/{name}")
    if "tokenizer_sha256" in dataset:  # not in entries an older pgolf wrote
        model = manifest_path(tokenizer.get("model_path") or "")
        path = _stable(root, model, f"tokenizers/{PurePosixPath(model).name}")
        _check_digest(path, root, name, dataset["tokenizer_sha256"], " (the file changed or was replaced)")
    recorded = dataset.get("sha256") or {}
    if not isinstance(recorded, dict):
        raise PgolfError(f"manifest entry {name}: 'sha256' must map shard names to digests")
    files = sorted(folder.glob(shards))
    if not files:
        raise PgolfError(f"dataset {name}: no shards in {folder}")
    missing = sorted(n for n in set(recorded) - {p.name for p in files} if fnmatch.fnmatch(n, shards))
    if missing:
        raise PgolfError(f"dataset {name}: shard {folder / missing[0]} is listed but absent")
    checked = val_tokens = 0
    for i, path in enumerate(files, 1):
        say(f"[{i}/{len(files)}] {path.name}")
        count = read_shard_header(path)
        val_tokens += count if re.fullmatch(r"fineweb_val_\d+\.bin", path.name) else 0
        if path.name in recorded:
            if file_sha256(path) != recorded[path.name]:
                raise PgolfError(f"shard {path}: its SHA-256 differs from the manifest's: the file changed")
            checked += 1
    if not val_tokens:
        raise PgolfError(f"dataset {name}: its validation shards in {folder} hold no tokens")
    return {
        "dataset": name,
        "shards": len(files),
        "hashed": checked,
        "without_checksum": len(files) - checked,
    }


_DOCS_VALUES = {  # what each value of a manifest's "docs" entry must be: (said as, checked by)
    "sotu": ('"sotu"', lambda v: v == "sotu"),
    "path": ("a file path", lambda v: isinstance(v, str) and v != "" and "\0" not in v),
    "digest": (
        "a SHA-256 hex digest",
        lambda v: isinstance(v, str) and re.fullmatch("[0-9a-f]{64}", v) is not None,
    ),
    "count": ("a whole number of at least 1", lambda v: type(v) is int and 1 <= v <= sys.maxsize),
}


def documents_source(root: str | Path, dataset: dict[str, Any]) -> dict[str, Any] | None:
    """The "docs" of a dataset's manifest entry, what `data verify --bytes` reads the documents by:
    `{"embedded": "sotu", "limit_docs": N or null, "val_docs": N}` or `{"path": FILE, "sha256": HEX or
    null, "documents": N, "val_docs": N}` (core/datasets/prepare.py writes them); None where it has none."""
    source = dataset.get("docs")
    if source is None:
        return None
    where = f"manifest {Path(root) / 'manifest.json'}: dataset {dataset.get('name')}'s docs"
    if not isinstance(source, dict):
        raise PgolfError(f"{where} must be an object")
    if "embedded" in source:
        fields = {"embedded": "sotu", "limit_docs": "count?", "val_docs": "count"}
    else:
        fields = {"path": "path", "sha256": "digest?", "documents": "count?", "val_docs": "count"}
    for key, kind in fields.items():
        value = source.get(key)
        if value is None and kind.endswith("?"):  # may be null
            continue
        meaning, ok = _DOCS_VALUES[kind.rstrip("?")]
        if not ok(value):
            raise PgolfError(f"{where}: {key} must be {meaning}, not {str(value)[:40]!r}")
    return source
