"""The records folder `cli.py package` writes for the runs of one config, one per seed: train_gpt.py
(core/runs/train_script.py), submission.json, README.md, requirements.txt and the logs, checked as it
is written (each seed under the cap with its own code bytes, on the same data, its artifact the one its
log describes; the evaluation time where it ran on the track's hardware) and staged, then moved into
place whole.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.common.errors import PgolfError
from core.config.fields import EVAL_LIMIT_SECONDS, Config
from core.config.sources import read_run_config
from core.data.provenance import SAME_DATA
from core.datasets.byte_proof import dataset_of, verify_bytes
from core.runs.run_artifact import check_run_artifact
from core.runs.stats import mean_std
from core.runs.summary import RunSummary, summarize
from core.runs.train_script import bundled_modules, left_out, requirements, script

TRACKS = ("10min_16mb", "non_record_16mb")  # the challenge's records/track_<track>/ folders
TRACK_HARDWARE = re.compile(r"8x.*H100.*")  # what the 10min_16mb track's limits are set on
# May differ between the seeds (abort_behind: each seed's reference run; a packaged run has none).
VARYING = ("seed", "run_id", "out_dir", "data_path", "tokenizer_path", "abort_behind", "abort_margin")


def _check_seeds(
    results: list[RunSummary], codes: dict[int, int], bytes_code: int, track: str, log: Callable[[str], None]
) -> None:
    """Each seed within the byte cap (its artifact with its own code, `codes[seed]` bytes, as its log counted
    it, and with this train_gpt.py, `bytes_code`), its evaluation within the limit where it ran on the track's hardware, all on the same
    data; each seed's headroom and evaluation time logged."""
    for r in results:
        code = max(codes[r.seed], bytes_code)
        total = r.artifact_bytes + code
        if total > r.budget_bytes:
            raise PgolfError(
                f"package: seed {r.seed} ({r.path}) is {total:,} bytes (artifact {r.artifact_bytes:,} + code "
                f"{code:,}), {total - r.budget_bytes:,} over the {r.budget_bytes:,}-byte cap: it cannot be submitted"
            )
        if (
            track == "10min_16mb"
            and TRACK_HARDWARE.fullmatch(r.hardware)
            and r.eval_time_s > EVAL_LIMIT_SECONDS
        ):
            raise PgolfError(
                f"package: seed {r.seed} ({r.path}) took {r.eval_time_s:.1f} s to evaluate on {r.hardware}, past "
                f"the track's {EVAL_LIMIT_SECONDS:g} s: it cannot be submitted"
            )
        seconds = "?" if math.isnan(r.eval_time_s) else f"{r.eval_time_s:,.1f} s"
        log(
            f"seed {r.seed}: artifact {r.artifact_bytes:,} + code {code:,} = {total:,} bytes, headroom "
            f"{r.budget_bytes - total:,}; evaluation {seconds} on {r.hardware}"
        )
    first = results[0]
    for r in results[1:]:
        theirs, ours = r.data or {}, first.data or {}
        differ = [k for k in SAME_DATA if theirs.get(k) != ours.get(k)]
        if differ:
            name = differ[0]
            raise PgolfError(
                f"package: seed {r.seed} ({r.path}) trained on other data than seed {first.seed}: {name} "
                f"{str(theirs.get(name, 'not recorded'))[:16]} vs {str(ours.get(name, 'not recorded'))[:16]}"
            )


def _finished_run(run_dir: Path) -> tuple[Config, RunSummary]:
    """A run's config and its summary (core.runs.summary: its score is the sliding-window one where evaluated so)."""
    try:
        cfg = Config.from_dict(read_run_config(run_dir / "config.json"))
    except PgolfError as exc:
        raise PgolfError(f"package: {run_dir} has no readable config.json ({exc})") from None
    if cfg.artifact_fit_bytes:
        raise PgolfError(
            f"package: {run_dir} chose its artifact settings at the end (artifact_fit_bytes); train_gpt.py "
            f"does not search: train again with the chosen ones (train --config {run_dir}/final_model.*.pgolf.fit.toml)"
        )
    if cfg.init_from:
        raise PgolfError(
            f"package: {run_dir} started from other weights (init_from={cfg.init_from}); train_gpt.py trains "
            "from its seed: package a run that did"
        )
    summary = summarize(run_dir)
    if not summary.finished:
        raise PgolfError(f"package: {run_dir} did not finish (no final record in metrics.jsonl)")
    return cfg, summary


def _files(n: int) -> str:
    return f" ({n} file{'s' if n != 1 else ''})" if n else ""


def _compliance(audits: list[tuple[int, Any]]) -> str:
    """The README's Compliance section: each seed's `audit` (core/runs/audit.py), and how to rerun it."""
    if not audits:
        return ""
    tolerance = audits[0][1].tolerance
    rows = "\n".join(
        f"| {seed} | {a.verdict()} | {a.evaluation} | {a.check.checked:,} | {a.check.max_change:.3g} | "
        f"{a.calibration.status}{_files(len(a.calibration.shards))} | "
        f"{a.artifact_bytes:,} | {a.code_bytes:,} | {a.eval_seconds:.1f} s |"
        for seed, a in audits
    )
    commands = "\n".join(a.command for _, a in audits)
    machine = ", ".join(dict.fromkeys(f"{a.backend} backend, {a.device}" for _, a in audits))
    return f"""
## Compliance

`cli.py audit` scored each run's artifact twice with the run's own evaluation in fp32 (test-time
training included where the run used it), the second time with the second half of one validation
document permuted (same length, every BOS in place). Every token scored before the first changed
token was scored (in the evaluation's own order) must keep its loss within {tolerance:g} nats: one that
moves was scored by weights that had learnt from, or a forward that read, tokens not yet scored.
Calibration: the files GPTQ's Hessians were collected from, as the run recorded them. Eval time:
the first evaluation's wall time on the machine that ran the audit ({machine}).

| seed | verdict | evaluation | tokens checked | largest change (nats) | calibration | artifact bytes | code bytes | eval time |
|---|---|---|---|---|---|---|---|---|
{rows}

Rerun:

```bash
{commands}
```
"""


def _byte_proof(cfg: Config) -> str:
    """For data pgolf made (its manifest entry names its documents), `data verify NAME --bytes`'s lines
    for the Compliance section; refused when scoring's bytes are not the text's. "" for other data (the
    challenge's published datasets count with the challenge's tables, which define its figures)."""
    found = dataset_of(cfg.data_path)
    if found is None:
        return ""
    root, name = found
    proof = verify_bytes(root, name)
    if not proof.exact:
        raise PgolfError(
            f"package: the validation bytes of dataset {name} are not its text's: {proof.difference}"
        )
    lines = "\n".join(proof.lines)
    return f"""
Validation bytes, counted against the documents that made dataset `{name}` (`cli.py data verify {name} --bytes`):

```
{lines}
```
"""


def _readme(
    name: str,
    blurb: str,
    cfg: Config,
    results: list[RunSummary],
    codes: dict[int, int],
    bytes_code: int,
    compliance: str = "",
) -> str:
    baseline = Config()
    changed = {k: v for k, v in cfg.to_dict().items() if k not in VARYING and getattr(baseline, k) != v}
    rows = "\n".join(f"| `{k.upper()}` | {v} |" for k, v in sorted(changed.items()))
    seeds = "\n".join(
        f"| {r.seed} | {r.score_val_loss:.5f} | {r.score_val_bpb:.5f} | {r.steps} | {r.train_time_ms / 1000:.1f} s | "
        f"{'–' if math.isnan(r.eval_time_s) else f'{r.eval_time_s:.1f} s'} | {r.hardware} | {r.artifact_bytes:,} | "
        f"{r.artifact_bytes + codes[r.seed]:,} |"
        for r in results
    )
    mean = mean_std([r.score_val_bpb for r in results])[0]
    missing = ", ".join(what for what, *_ in left_out(bundled_modules(cfg)))
    refused = (
        f" (the script holds no code for {missing}: a setting that needs one is refused)" if missing else ""
    )
    return f"""# {name}

{blurb}

Mean val_bpb **{mean:.5f}** over {len(results)} seed(s) ({"sliding-window evaluation, stride " + str(cfg.eval_stride) if cfg.eval_stride else "non-overlapping evaluation"}, after the artifact round trip).

## Results

| seed | val_loss | val_bpb | steps | training | evaluation | hardware | artifact bytes | total bytes |
|---|---|---|---|---|---|---|---|---|
{seeds}

Evaluation: the final scores' wall time, reading and decompressing the artifact included (the
challenge's limit is {EVAL_LIMIT_SECONDS:g} s on 8xH100). Cap: {results[0].budget_bytes:,} bytes of artifact + code.

Code: `train_gpt.py`, {bytes_code:,} bytes.

## Configuration (what differs from the challenge's baseline)

| setting | value |
|---|---|
{rows}

## Run

```bash
SEED={results[0].seed} DATA_PATH={cfg.data_path} TOKENIZER_PATH={cfg.tokenizer_path} \\
  torchrun --standalone --nproc_per_node=8 train_gpt.py
```

Every setting above can be overridden by its environment variable{refused}. The logs of the runs are
`train_seed<N>.log`.
{compliance}"""


def write_record(
    run_dirs: list[Path],
    out: Path,
    name: str,
    author: str = "",
    github_id: str = "",
    blurb: str = "",
    compressed: bool = True,
    audit: Callable[[Path], Any] | None = None,
    track: str = TRACKS[0],
    log: Callable[[str], None] = lambda line: None,
) -> tuple[Path, int]:
    """The records folder for the runs of one config (one per seed) on `track`: train_gpt.py,
    submission.json, README.md, requirements.txt and train_seed<N>.log. Returns the folder and the bytes
    of its train_gpt.py. Refused: a seed over the byte cap, one whose evaluation passed the track's limit
    on its hardware, seeds trained on different data (`_check_seeds`; `log` gets each seed's headroom).
    `audit` (run directory -> core.runs.audit.Audit): each run is audited then, the folder written only
    when all pass, its README with their Compliance section."""
    import datetime
    import shutil
    import tempfile

    if not run_dirs:
        raise PgolfError("package: give at least one run directory")
    runs = [_finished_run(Path(d)) for d in run_dirs]
    cfg = runs[0][0]
    same = {k: v for k, v in cfg.to_dict().items() if k not in VARYING}
    for other, result in runs[1:]:
        diff = sorted(k for k, v in other.to_dict().items() if k not in VARYING and same[k] != v)
        if diff:
            raise PgolfError(f"package: {result.path} differs from {run_dirs[0]} in {', '.join(diff[:5])}")
    results = sorted((r for _, r in runs), key=lambda r: r.seed)
    if len({r.seed for r in results}) != len(results):
        raise PgolfError("package: two runs share a seed")
    if track not in TRACKS:
        raise PgolfError(f"package: unknown track {track!r} (choose {' or '.join(TRACKS)})")
    for run_cfg, result in runs:
        check_run_artifact(result.path, run_cfg)  # the artifact its log and final record describe
    if out.exists():
        raise PgolfError(f"package: {out} exists already: choose another --out")
    text = script(cfg, compressed)
    size = len(text.encode("utf-8"))
    # Each seed's own code bytes, as its run counted and logged them (its config, seed included, packaged),
    # else its config's script now; the cap holds the larger of that and this train_gpt.py (`_check_seeds`).
    codes = {
        r.seed: r.total_bytes - r.artifact_bytes or len(script(c, compressed).encode("utf-8"))
        for c, r in runs
    }
    _check_seeds(results, codes, size, track, log)
    audits = []
    for r in results if audit is not None else ():
        found = audit(r.path)
        if not found.legal:
            raise PgolfError(f"package: {r.path} fails the audit: {found.verdict()} (rerun: {found.command})")
        audits.append((r.seed, found))
    compliance, proof = _compliance(audits), _byte_proof(cfg)
    compliance += proof if compliance or not proof else f"\n## Compliance\n{proof}"
    mean_bpb, std = mean_std([r.score_val_bpb for r in results])
    submission = {
        "author": author,
        "github_id": github_id,
        "name": name,
        "blurb": blurb,
        "date": datetime.date.today().isoformat(),
        "track": track,
        "val_loss": round(mean_std([r.score_val_loss for r in results])[0], 5),
        "val_bpb": round(mean_bpb, 5),
        "val_bpb_std": round(std, 5) if len(results) > 1 else 0.0,
        "seeds": [r.seed for r in results],
        "seed_results": {
            str(r.seed): {
                "val_loss": round(r.score_val_loss, 5),
                "val_bpb": round(r.score_val_bpb, 5),
                "artifact_bytes": r.artifact_bytes,
                "bytes_code": codes[r.seed],
                "bytes_total": r.artifact_bytes + codes[r.seed],
                "eval_time_s": None if math.isnan(r.eval_time_s) else round(r.eval_time_s, 1),
                "eval_phases_s": {phase: round(t, 1) for phase, t in r.eval_phase_s.items()},
                "steps": r.steps,
                "train_time_s": round(r.train_time_ms / 1000, 3),
                "train_tokens": r.train_tokens,
                "hardware": r.hardware,
            }
            for r in results
        },
        "bytes_total": max(r.artifact_bytes + codes[r.seed] for r in results),
        "bytes_code": size,
        "hardware": ", ".join(dict.fromkeys(r.hardware for r in results)),
        **({"data": results[0].data} if results[0].data else {}),
    }
    parent = out.parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
    try:
        (staging / "train_gpt.py").write_text(text, encoding="utf-8")
        (staging / "submission.json").write_text(json.dumps(submission, indent=2) + "\n", encoding="utf-8")
        (staging / "requirements.txt").write_text(requirements(cfg, compressed), encoding="utf-8")
        (staging / "README.md").write_text(
            _readme(name, blurb, cfg, results, codes, size, compliance), encoding="utf-8"
        )
        for r in results:
            shutil.copyfile(r.path / "train.log", staging / f"train_seed{r.seed}.log")
        staging.rename(out)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise PgolfError(f"package: cannot write {out}: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out, size
