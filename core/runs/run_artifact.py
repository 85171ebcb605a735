"""A finished run's artifact checked against what the run says it wrote: the size (and SHA-256, for runs
that logged it) its final record holds, and the size its train.log printed. `package` checks each run
first, so that a folder whose artifact was swapped for another run's is refused, not described twice."""

from __future__ import annotations

import re
from pathlib import Path

from core.artifact.export import quant_label
from core.common.errors import PgolfError
from core.common.files import file_sha256, read_text
from core.config.fields import Config
from core.runs.summary import read_metrics

# core/train/loop.py's line; a size of more digits than any file's is no size (and no int() of it)
LOGGED_SIZE = re.compile(r"^Serialized model \S+: (\d{1,20}) bytes$", re.M)
MAX_LOG_BYTES = 2**28


def check_run_artifact(run_dir: Path, cfg: Config) -> Path:
    """The artifact of the finished run `run_dir` (trained with `cfg`), when it is the file the run wrote;
    else a PgolfError naming what differs."""
    artifact = run_dir / f"final_model.{quant_label(cfg)}.pgolf"
    final = next((r for r in reversed(read_metrics(run_dir)) if r["kind"] == "final"), None)
    if final is None:
        raise PgolfError(f"package: {run_dir} did not finish (no final record in metrics.jsonl)")
    if not artifact.is_file():
        raise PgolfError(f"package: {run_dir} has no artifact {artifact.name}: its bytes cannot be checked")
    size = artifact.stat().st_size
    claims = [("its final record", int(final["artifact_bytes"]))]
    log = run_dir / "train.log"
    if log.is_file():
        sizes = LOGGED_SIZE.findall(read_text(log, "run log", MAX_LOG_BYTES))
        claims += [("its train.log", int(sizes[-1]))] if sizes else []
    for where, claimed in claims:
        if claimed != size:
            raise PgolfError(
                f"package: {artifact} holds {size:,} bytes but {where} says the run wrote {claimed:,}: "
                "not this run's artifact"
            )
    logged = final.get("artifact_sha256")
    found = file_sha256(artifact, "artifact") if logged else ""
    if found != (logged or ""):
        raise PgolfError(
            f"package: {artifact} is not the file the run wrote: SHA-256 {found[:12]}..., its final record's "
            f"{str(logged)[:12]}..."
        )
    return artifact
