"""check-record: a records folder checked as a reviewer would, on small folders written here in the
shapes the challenge's records use (their logs' lines, their submission.json's layouts)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.runs.record_folder import agree, check_record, read_log, seed_figures
from tests.support.cli import cli
from tests.support.runs import SEEDS, log_text, write_folder


def edit_submission(folder: Path, change) -> None:
    sub = json.loads((folder / "submission.json").read_text())
    change(sub)
    (folder / "submission.json").write_text(json.dumps(sub))


@pytest.fixture
def good(tmp_path) -> Path:
    return write_folder(tmp_path / "2026-04-01_Good")


def test_a_consistent_folder_passes_and_its_log_figures_are_read(good):
    assert check_record(good) == []
    log = read_log(good / "train_seed42.log")
    assert (log.seed, log.tag, str(log.val_bpb), log.total_bytes) == (
        "42",
        "final_int6_sliding_window",
        "1.09743840",
        15_915_268,
    )
    assert seed_figures(good) == (["42", "1337", "2025"], [2.5252358, 2.5264105, 2.5269013],
                                  [1.0974384, 1.0979497, 1.0981628])  # fmt: skip


def test_a_seed_over_the_cap_fails_naming_it(good):
    (good / "train_seed1337.log").write_text(log_text("1337", 2.5264105, 1.0979497, 16_000_415))
    edit_submission(good, lambda s: s["seed_results"]["1337"].update(artifact_bytes=16_000_415))
    findings = check_record(good)
    assert "seed 1337: 16,000,415 bytes, over the cap of 16,000,000 by 415" in findings
    assert any(f.startswith("train_seed1337.log: total submission size 16,000,415") for f in findings)


def test_a_val_bpb_that_disagrees_with_its_log_fails_naming_both(good):
    edit_submission(good, lambda s: s["seed_results"]["2025"].update(val_bpb=1.09716))
    findings = check_record(good)
    assert findings[0].startswith(
        "seed 2025: val_bpb 1.09716 in submission.json, 1.09816280 in train_seed2025.log"
    )
    assert "submission.json: val_bpb 1.09785 is not the mean of its seeds' (1.09751667)" in findings


def test_a_size_that_disagrees_with_its_log_fails(good):
    edit_submission(good, lambda s: s["seed_results"]["42"].update(artifact_bytes=15_905_460))
    assert check_record(good) == [
        "seed 42: 15,905,460 bytes in submission.json, 15,915,268 in train_seed42.log"
    ]


def test_missing_files_a_missing_log_and_a_repeated_seed_each_fail(good):
    (good / "train_gpt.py").unlink()
    (good / "train_seed2025.log").unlink()
    edit_submission(good, lambda s: s.update(seeds=[42, 1337, 2025, 42]))
    findings = check_record(good)
    assert "train_gpt.py: missing" in findings
    assert "seed 2025: no log (a file named for the seed, or stating it)" in findings
    assert "submission.json: a seed is listed twice: ['42', '1337', '2025', '42']" in findings


def test_the_rounding_of_each_figure_is_allowed_and_no_more():
    from decimal import Decimal

    assert agree(Decimal("1.0974"), Decimal("1.09743840"))
    assert agree(Decimal("1.1194"), Decimal("1.11937967"))
    assert not agree(Decimal("1.0974"), Decimal("1.09746"))  # 0.00006 apart: past 0.00005 + 0.000005
    assert not agree(Decimal("1.09716"), Decimal("1.09816280"))


def test_a_one_run_record_is_checked_against_its_log_or_the_mean_of_its_logs(tmp_path):
    """The early records: one figure at the top, one log per seed (or one log), a timestamp on each line."""
    folder = write_folder(tmp_path / "early")
    for seed in SEEDS:
        log = folder / f"train_seed{seed}.log"
        log.write_text("".join(f"1776142360.541 {line}\n" for line in log.read_text().splitlines()))
    mean_bpb = sum(v[1] for v in SEEDS.values()) / 3
    edit_submission(
        folder,
        lambda s: [s.pop(k) for k in ("seeds", "seed_results")] and s.update(val_bpb=round(mean_bpb, 4)),
    )
    assert check_record(folder) == []
    edit_submission(folder, lambda s: s.update(val_bpb=1.0974384, bytes_total=15_915_268))  # seed 42's alone
    assert check_record(folder) == []
    edit_submission(folder, lambda s: s.update(val_bpb=1.0901))
    assert check_record(folder)[0].startswith(
        "submission.json: val_bpb 1.0901 is no log's final figure, nor their mean"
    )


@pytest.mark.parametrize(
    "text",
    ["", "[1, 2]", "{not json", '{"val_bpb": "1.1", "seeds": {"1": 5}, "seed_results": [1]}',
     '{"seed_results": {"1": {"val_bpb": null, "artifact_bytes": 1e30}}, "seeds": [[1]], "bytes_total": "x"}',
     '{"val_bpb": 1.1, "seeds": [1, 2], "seed_scores": [1.1]}', '{"val_bpb": NaN, "bytes_total": 1e400}', '{"val_bpb": 1e-9999999, "seeds": [1, 2], "seed_results": {"1": {"val_bpb": 9e999999}, "2": {"val_bpb": 9e999999, "artifact_bytes": 1e999999}}}'],
)  # fmt: skip
def test_a_submission_it_cannot_make_sense_of_is_a_finding_never_a_traceback(good, text):
    (good / "submission.json").write_text(text)
    (good / "train_seed42.log").write_bytes(b"\xff\xfe garbage val_loss:x val_bpb:y\n")
    findings = check_record(good)
    assert findings and all(isinstance(f, str) and "\n" not in f for f in findings)


@pytest.mark.slow
def test_the_command_prints_a_line_per_finding_and_exits_1(good, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(good, bad)
    (bad / "train_gpt.py").unlink()
    result = cli("check-record", str(good), str(bad), str(tmp_path / "absent"))
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [
        f"{good}: passes",
        f"{bad}: train_gpt.py: missing",
        f"{tmp_path / 'absent'}: not a folder",
        "1 of 3 folders pass",
    ]
    assert result.stderr == ""


def test_a_later_evaluation_than_the_one_reported_is_no_finding_and_the_reported_one_is_compared(good):
    """As 2026-04-04's seed 42: its log ends with a test-time-training score that went wrong, after the
    sliding-window score it reports."""
    log = good / "train_seed42.log"
    log.write_text(
        log.read_text() + "final_int6_ttt val_loss:3.07608000 val_bpb:1.33603200 eval_time:9000ms\n"
    )
    assert check_record(good) == []
    assert seed_figures(good)[2][0] == 1.0974384


def test_any_json_in_submission_json_is_findings_never_an_exception(tmp_path_factory):
    folder = write_folder(tmp_path_factory.mktemp("fuzz") / "record")
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
    values = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=8,
    )
    keys = st.sampled_from(
        ["val_bpb", "val_loss", "seeds", "seed_results", "seed_scores", "bytes_total", "author", "github_id"]
    )
    seed_rows = st.dictionaries(
        st.sampled_from(["42", "1337", "7"]),
        st.dictionaries(
            st.sampled_from(["val_bpb", "val_loss", "artifact_bytes", "bytes_total"]), scalars, max_size=4
        ),
        max_size=3,
    )

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.dictionaries(keys, values | seed_rows, max_size=6))
    def check(sub):
        (folder / "submission.json").write_text(json.dumps(sub))
        assert all(isinstance(f, str) for f in check_record(folder))

    check()


def pgolf_rows(sub: dict) -> None:
    """The seeds' rows as `package` writes them: the artifact alone, the code, and their sum."""
    for row in sub["seed_results"].values():
        row.update(
            artifact_bytes=row["artifact_bytes"] - 68_206,
            bytes_code=68_206,
            bytes_total=row["artifact_bytes"],
        )


def test_a_row_of_artifact_code_and_total_passes_when_they_add_up(good):
    edit_submission(good, pgolf_rows)
    assert check_record(good) == []


def _seed42(**change):
    return lambda s: s["seed_results"]["42"].update(**change)


@pytest.mark.parametrize(
    ("change", "finding"),
    [
        (_seed42(val_loss=float("nan")), "submission.json: NaN is not a number JSON allows"),
        (_seed42(val_loss="2.5"), "submission.json: seed 42's val_loss is \"2.5\", not a number above 0 and below 1,000"),
        (_seed42(val_bpb=-1.0974), "submission.json: seed 42's val_bpb is -1.0974, not a number above 0 and below 1,000"),
        (lambda s: s.update(seed_results=list(s["seed_results"].values())),
         "submission.json: seed_results is a list, not a table of each seed's figures"),
        (lambda s: s.update(seeds="42,1337,2025"), 'submission.json: seeds is "42,1337,2025", not a list of seeds'),
        (lambda s: s.update(seeds=[42, 1337, 2025.5]), "submission.json: seeds holds 2025.5, not a seed (a whole number from 0)"),
        (lambda s: s.update(val_loss=99), "submission.json: val_loss 99 is not the mean of its seeds' (2.52618333)"),
        (lambda s: s.update(bytes_total=1),
         "submission.json: bytes_total 1 is neither its seeds' largest (15,927,782) nor their mean (15,916,170)"),
        (lambda s: s.update(author=7), "submission.json: author is 7, not text"),
        (lambda s: s.update(date="yesterday"), 'submission.json: date is "yesterday", not a date (YYYY-MM-DD)'),
        (lambda s: s.update(artifact_bytes_max=15_000_000),
         "submission.json: artifact_bytes_max 15,000,000 is not its seeds' largest (15,927,782)"),
        (lambda s: pgolf_rows(s) or s["seed_results"]["42"].update(artifact_bytes=10**20),
         "submission.json: seed 42's artifact_bytes is 100000000000000000000, not a byte count (a whole number from 0 to 1e+15)"),
        (lambda s: pgolf_rows(s) or s["seed_results"]["42"].update(artifact_bytes=15_000_000),
         "seed 42: bytes_total 15,915,268 is not its artifact_bytes 15,000,000 + code 68,206"),
        (lambda s: pgolf_rows(s) or s["seed_results"]["42"].update(bytes_code=1),
         "seed 42: bytes_total 15,915,268 is not its artifact_bytes 15,847,062 + code 1"),
    ],
)  # fmt: skip
def test_a_submission_off_the_schema_fails_naming_the_field(good, change, finding):
    """The cases that passed when check-record read only some fields: each one finding, the others checked."""
    edit_submission(good, change)
    assert finding in check_record(good)


@pytest.mark.parametrize(
    ("text", "finding"),
    [
        ("[" * 200_000 + "]" * 200_000, "submission.json: nested deeper than 64 levels"),
        ('{"bytes_total": ' + "9" * 5000 + "}", "submission.json: an integer of 5,000 digits (at most 40)"),
        ('{"val_bpb": Infinity}', "submission.json: Infinity is not a number JSON allows"),
        ('{"author": "\\ud800"}', "submission.json: a string holds a lone surrogate"),
        (b'{"author": "\xff"}', "submission.json: line 1 is not UTF-8 text"),
        (b" " * (2**20 + 1), "submission.json is 1,048,577 bytes, over the limit of 1,048,576"),
    ],
    ids=["deep", "digits", "infinity", "surrogate", "utf-8", "huge"],
)
def test_a_hostile_submission_json_is_one_finding(good, text, finding):
    path = good / "submission.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    findings = check_record(good)
    assert any(f.startswith(finding) for f in findings), findings


def test_a_hostile_log_or_script_is_a_finding_naming_it(good):
    log = good / "train_seed42.log"
    log.write_text(log.read_text().replace("size int6+brotli: 15915268", "size int6+brotli: " + "1" * 5000))
    (good / "train_seed1337.log").write_bytes(b"seed: 1337\n\xff\xfe\n")
    (good / "train_gpt.py").write_text("x" + ".a" * 200_000)
    findings = check_record(good)
    assert "train_seed42.log: line 8 holds a number of 5,000 characters" in findings
    assert "train_seed1337.log: line 2 is not UTF-8 text" in findings
    assert "train_gpt.py: not valid Python (nested too deeply to parse)" in findings


def test_files_that_are_no_regular_files_are_findings_never_a_hang(good):
    import os

    (good / "submission.json").unlink()
    os.mkfifo(good / "submission.json")
    (good / "train_seed42.log").unlink()
    os.mkfifo(good / "train_seed42.log")
    (good / "train_seed2025.log").unlink()
    (good / "train_seed2025.log").symlink_to("/dev/zero")
    findings = check_record(good)
    assert "submission.json: not a regular file" in findings
    assert any(f.startswith("train_seed42.log") and "is not a regular file" in f for f in findings), findings
    assert any(f.startswith("train_seed2025.log") and "is not a regular file" in f for f in findings), (
        findings
    )


@pytest.mark.slow
def test_a_batch_reports_every_folder_and_the_count_whatever_one_holds(good, tmp_path):
    deep = tmp_path / "deep"
    shutil.copytree(good, deep)
    (deep / "submission.json").write_text("[" * 200_000)
    result = cli("check-record", str(deep), str(good))
    assert result.returncode == 1 and result.stderr == ""
    assert result.stdout.splitlines() == [
        f"{deep}: submission.json: nested deeper than 64 levels",
        f"{good}: passes",
        "1 of 2 folders pass",
    ]
