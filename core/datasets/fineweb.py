"""Download the challenge's published FineWeb shards and tokenizer from Hugging Face.

The dataset repo holds everything under `datasets/`: `manifest.json`, the shards in
`datasets/fineweb10B_<variant>/` and the tokenizers in `tokenizers/`. Paths in the
manifest are relative to that prefix, and locally to `out_root`, so the local tree
has the challenge's layout. Every file lands atomically and is checked, so a file
that is present is complete and a second run downloads nothing.

The records' CaseOps data (repo romeerp/parameter-golf-caseops-v1, variant
sp8192_lossless_caps_caseops_v1_reserved) has the same layout; its dataset entry names a
validation byte sidecar (`val_bytes_glob`), fetched beside the validation shards
(`fineweb_val_bytes_N.bin`, one entry per token of `fineweb_val_N.bin`; core/datasets/caseops.py).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.common.errors import PgolfError
from core.common.files import WriterLock, make_dir, read_json, sync
from core.data.manifest import (
    MAX_MANIFEST_BYTES,
    file_sha256,
    find_entries,
    manifest_path,
    merge_manifest,
    read_manifest,
)
from core.data.shards import read_shard_header

MAX_SHARDS = 100_000  # shards of one split: the published data has a few hundred
REPO_ID = "willdepueoai/parameter-golf"
REMOTE_PREFIX = "datasets"  # the dataset repo keeps the challenge tree under this folder

Fetch = Callable[[str, Path], None]  # (path in the repo, local file to create)
Progress = Callable[[str], None]


def hub_fetcher(repo_id: str = REPO_ID) -> Fetch:
    """A fetch that downloads through the Hugging Face cache, then links or copies out of it."""

    def fetch(remote: str, dest: Path) -> None:
        try:
            from huggingface_hub import hf_hub_download
            from huggingface_hub.utils import logging as hub_logging
        except ImportError:
            raise PgolfError("downloading needs huggingface_hub: pip install huggingface_hub") from None
        hub_logging.set_verbosity_error()  # its retry warnings; a failure still ends as one error line
        folder, _, name = remote.rpartition("/")
        try:
            cached = hf_hub_download(
                repo_id=repo_id, repo_type="dataset", filename=name, subfolder=folder or None
            )
        # The hub raises httpx, OSError and ValueError subclasses that vary between
        # versions; from here any of them means the download itself failed.
        except Exception as exc:
            raise PgolfError(f"download of {remote} from {repo_id} failed: {_one_line(exc)}") from None
        # Cache entries are usually symlinks into a blob store: materialize the real file.
        source = Path(cached).resolve(strict=True)
        make_dir(dest.parent)
        try:
            os.link(source, dest)  # no second copy of a 200 MB shard on disk
        except OSError:
            shutil.copyfile(source, dest)

    return fetch


def download_fineweb(
    out_root: Path = Path("data"),
    variant: str = "sp1024",
    train_shards: int = 80,
    repo_id: str = REPO_ID,
    progress: Progress | None = None,
    fetch: Fetch | None = None,
) -> dict[str, Any]:
    """Fetch the val shards, the first `train_shards` train shards and the tokenizer of a variant.

    Files already present and valid are kept; the variant's entries are merged into
    `out_root/manifest.json`. Returns a short summary for the CLI to print.
    """
    if train_shards < 0:
        raise PgolfError(f"--train-shards must be >= 0, got {train_shards}")
    if not re.fullmatch(r"sp\d+(_[a-z0-9_]+)?|byte260", variant):
        raise PgolfError(
            f"{variant!r} is not a variant name: sp<VOCAB> (e.g. sp1024), sp<VOCAB>_<kind> "
            "(e.g. sp8192_lossless_caps_caseops_v1_reserved) or byte260"
        )
    make_dir(Path(out_root), "data folder")
    with WriterLock(out_root, "data folder"):  # one writer of a data folder at a time
        say = progress or (lambda message: None)
        fetch = fetch or hub_fetcher(repo_id)
        root = Path(out_root)

        dataset, tokenizer = _entries(root, variant, repo_id, fetch, say)
        stats = dataset.get("stats") if isinstance(dataset.get("stats"), dict) else {}
        files_val, files_train = stats.get("files_val"), stats.get("files_train")
        if not all(type(n) is int and 0 <= n <= MAX_SHARDS for n in (files_val, files_train)):
            raise PgolfError(
                f"manifest entry {dataset.get('name')} has no shard counts (stats: files_val and files_train, "
                f"whole numbers up to {MAX_SHARDS:,})"
            )
        if train_shards > files_train:
            raise PgolfError(
                f"{variant} has only {files_train} training shards on {repo_id}, {train_shards} were asked for"
            )

        folder = manifest_path(dataset.get("path") or f"datasets/{dataset['name']}")
        shards = [f"{folder}/fineweb_val_{i:06d}.bin" for i in range(files_val)]
        if dataset.get("val_bytes_glob"):  # CaseOps data: each validation shard has its byte sidecar
            shards += [f"{folder}/fineweb_val_bytes_{i:06d}.bin" for i in range(files_val)]
        shards += [f"{folder}/fineweb_train_{i:06d}.bin" for i in range(train_shards)]
        artifacts = [manifest_path(tokenizer[k]) for k in ("model_path", "vocab_path") if tokenizer.get(k)]
        if not artifacts:
            raise PgolfError(f"manifest entry for tokenizer {tokenizer.get('name')} names no files")

        todo = [(rel, True) for rel in shards] + [(rel, False) for rel in artifacts]
        fetched, tokens = 0, {"val": 0, "train": 0}
        for i, (rel, is_shard) in enumerate(todo, 1):
            dest = root / rel
            if _complete(dest, is_shard):
                say(f"[{i}/{len(todo)}] have {rel}")
            else:
                say(f"[{i}/{len(todo)}] downloading {rel}")
                _fetch_one(fetch, f"{REMOTE_PREFIX}/{rel}", dest, is_shard)
                fetched += 1
            if is_shard and "fineweb_val_bytes_" not in rel:
                tokens["val" if "fineweb_val_" in rel else "train"] += read_shard_header(dest)
        for i in range(files_val if dataset.get("val_bytes_glob") else 0):
            val, sidecar = (root / folder / f"fineweb_val{kind}_{i:06d}.bin" for kind in ("", "_bytes"))
            if read_shard_header(sidecar) != read_shard_header(val):
                raise PgolfError(f"byte sidecar {sidecar} does not have one entry per token of {val.name}")

        say("recording the shards' SHA-256 (data verify checks them)")
        dataset = {**dataset, "sha256": {Path(rel).name: file_sha256(root / rel) for rel in shards}}
        # Written last, so the manifest only names a dataset once its files are all here.
        merge_manifest(root, dataset, tokenizer)
        return {
            "dataset": str(root / folder),
            "tokenizer": str(root / artifacts[0]),
            "val_shards": files_val,
            "byte_sidecar": bool(dataset.get("val_bytes_glob")),
            "train_shards": train_shards,
            "tokens_val": tokens["val"],
            "tokens_train": tokens["train"],
            "downloaded": fetched,
            "already_present": len(todo) - fetched,
        }


def _entries(
    root: Path, variant: str, repo_id: str, fetch: Fetch, say: Progress
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The variant's dataset and tokenizer entries: from the local manifest after a
    complete earlier download, else from the published one."""
    name = f"fineweb10B_{variant}"
    found = find_entries(read_manifest(root), name)
    if found:
        return found
    say(f"downloading {REMOTE_PREFIX}/manifest.json")
    # Kept aside: the local manifest.json merges entries and is written only at the end.
    remote = root / ".manifest.remote.json"
    _fetch_one(fetch, f"{REMOTE_PREFIX}/manifest.json", remote, is_shard=False)
    try:
        manifest = read_json(remote, f"the manifest of {repo_id}", MAX_MANIFEST_BYTES)
    finally:
        remote.unlink(missing_ok=True)
    if not isinstance(manifest, dict):
        raise PgolfError(f"the manifest of {repo_id} is not a JSON object")
    found = find_entries(manifest, name)
    if found:
        return found
    prefix = "fineweb10B_"
    available = sorted(
        str(d.get("name"))[len(prefix) :]
        for d in manifest.get("datasets") or []
        if isinstance(d, dict) and str(d.get("name", "")).startswith(prefix)
    )
    raise PgolfError(
        f"unknown variant {variant!r}: {repo_id} has {', '.join(available) or 'no FineWeb datasets'}"
    )


def _complete(path: Path, is_shard: bool) -> bool:
    """A shard is complete when its size matches its header; other files have no such check,
    but atomic writes mean a present file is a whole one."""
    if not path.is_file():
        return False
    if not is_shard:
        return path.stat().st_size > 0
    try:
        read_shard_header(path)
    except PgolfError:
        return False  # e.g. truncated by a copy that was not atomic: fetch it again
    return True


def _fetch_one(fetch: Fetch, remote: str, dest: Path, is_shard: bool) -> None:
    """Fetch into a staging file beside `dest`, check it, then rename it into place.

    Whatever `fetch` does, `dest` is never seen half-written or unchecked.
    """
    staging = dest.with_name(f".{dest.name}.part")
    make_dir(dest.parent)
    staging.unlink(missing_ok=True)  # left by an interrupted run
    try:
        try:
            fetch(remote, staging)
        except OSError as exc:  # also urllib's and requests' HTTP errors
            raise PgolfError(f"download of {remote} failed: {_one_line(exc)}") from None
        if not staging.is_file():
            raise PgolfError(f"download of {remote} failed: nothing was written")
        if is_shard:
            try:
                read_shard_header(staging)
            except PgolfError as exc:
                # Name the file the user knows, not the staging file.
                reason = str(exc).replace(str(staging), str(dest))
                raise PgolfError(f"download of {remote} is corrupt: {reason}") from None
        sync(staging)  # on disk before the rename, and the rename after it
        os.replace(staging, dest)
        sync(dest.parent)
    finally:
        staging.unlink(missing_ok=True)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
