"""`plan`: the fitted table against its own samples, the plans of record_0427 and baseline against the
records' logged figures (each fitted without its own record), the backtest, calibration from records folders,
the refusals, and the plan in the workflow (sweep's report, train's line, runs --plan)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from core.config.presets import preset
from core.runs import sweep as sw
from core.runs.calibrate import backtest, fit, pairs_of, refit_without, summary_line
from core.runs.plan import load_table, make_plan, target_line
from tests.support.backends import run_blocked
from tests.support.cli import assert_one_line_error, cli, data_flags
from tests.support.runs import fake_run, write_spec

LOGS = Path(__file__).parent / "fixtures" / "record_logs"
RECORD_0427 = "2026-04-27_SP8192_LQER_SparseGate_BOSSmearFix_9HpStack_1.0611"


@pytest.fixture(scope="module")
def table():
    return load_table()


def logged(table, record: str) -> dict:
    (sample,) = [s for s in table["samples"] if s["record"] == record]
    return sample["logged"]


def test_the_table_is_its_samples_fitted(table):
    """The coefficients kept are what fitting the kept samples gives (the command that wrote them)."""
    refit = fit(pairs_of(table["samples"]), table["coefficients"]["bytes"]["synthetic"])
    assert _same(json.loads(json.dumps(refit)), table["coefficients"])
    assert not _same(fit(pairs_of(table["samples"][1:]), refit["bytes"]["synthetic"]), table["coefficients"])


def _same(a, b) -> bool:
    """Nested dicts of numbers equal to 1e-9 relative."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float | int) and isinstance(b, float | int):
        return a == pytest.approx(b, rel=1e-9)
    return a == b


def test_the_samples_cover_the_records(table):
    assert len(table["samples"]) >= 25
    named = {s["record"] for s in table["samples"]} | {x["record"] for x in table["left_out"]}
    assert len(named) == len(table["samples"]) + len(table["left_out"])
    assert all(x["reason"] for x in table["left_out"])


def test_record_0427_planned_without_its_records(table):
    """Done-when: fitted without the 04-27 records, the preset's plan is within 10% of their logged ms a step in
    both phases, 2% of the artifact's bytes and 25% of the TTT evaluation."""
    result = make_plan(preset("record_0427"), "8xH100", refit_without(table, "2026-04-27"), code_bytes=32_000)
    seen = logged(table, RECORD_0427)
    assert [p.name for p in result.phases] == ["plain", "looped"]
    for phase, ms in zip(result.phases, seen["ms_per_step"], strict=True):
        assert phase.ms_per_step == pytest.approx(ms, rel=0.10)
    assert result.artifact_bytes == pytest.approx(seen["artifact_bytes"], rel=0.02)
    assert result.eval_seconds["ttt"] == pytest.approx(seen["eval_seconds"]["ttt"], rel=0.25)
    assert 4000 < result.steps < 6000


def test_baseline_planned_without_its_record(table):
    """Done-when: the naive baseline's 43.5 ms a step within 10%, fitted without it."""
    result = make_plan(preset("baseline"), "8xH100", refit_without(table, "NaiveBaseline"), code_bytes=34_000)
    (phase,) = result.phases
    assert logged(table, "2026-03-17_NaiveBaseline")["ms_per_step"] == [pytest.approx(43.54, abs=0.1)]
    assert phase.ms_per_step == pytest.approx(43.54, rel=0.10)
    assert result.steps == pytest.approx(600_000 / phase.ms_per_step, abs=1)


def test_a_bigger_model_costs_more(table):
    small = make_plan(preset("baseline"), "8xH100", table, code_bytes=34_000)
    deeper = make_plan(preset("baseline").replace(num_layers=12), "8xH100", table, code_bytes=34_000)
    assert deeper.phases[0].ms_per_step > small.phases[0].ms_per_step
    assert deeper.artifact_bytes > small.artifact_bytes and deeper.steps < small.steps
    assert deeper.verdict.startswith("verdict: breaks the byte cap by")


def test_backtest_leaves_each_record_out(table):
    samples = [s for s in table["samples"] if "2026-04-1" in s["record"]][:4]
    result = backtest(samples, table["coefficients"]["bytes"]["synthetic"])
    assert [r["record"] for r in result["rows"]] == [s["record"] for s in samples]
    assert all(len(r["predicted"]["ms_per_step"]) == 2 for r in result["rows"])
    assert re.fullmatch(
        r"backtest: 4 records, ms/step median \|error\| [\d.]+%, memory [\d.]+%, bytes [\d.]+%, eval [\d.]+%",
        summary_line(result),
    )


@pytest.mark.slow
def test_json_keys():
    result = cli("plan", "--preset", "baseline", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    for key in ("hardware", "phases", "steps", "tokens", "peak_memory_bytes", "artifact_bytes", "code_bytes",
                "budget_bytes", "eval_seconds", "verdict"):  # fmt: skip
        assert key in plan
    assert plan["hardware"] == "8xH100" and set(plan["phases"][0]) >= {"ms_per_step", "tokens_per_s", "steps"}
    assert "total" in plan["eval_seconds"] and plan["verdict"].startswith("verdict: fits 8xH100")


@pytest.mark.slow
def test_text_says_whose_code_and_the_verdict():
    result = cli("plan", "--preset", "baseline", "--hardware", "8xH200")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("plan on 8xH200 (the records' training code; pgolf's own: not measured")
    assert lines[2].startswith("train plain: ") and "steps in 600 s" in lines[2]
    assert lines[-1].startswith("verdict: fits 8xH200: ")


@pytest.mark.slow
def test_plan_needs_no_framework():
    code = "import sys\nsys.argv = ['cli.py', 'plan', '--preset', 'record_0401']\nimport cli\ncli.main()\n"
    result = run_blocked(code)
    assert result.returncode == 0, result.stderr
    assert "verdict: " in result.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--hardware", "4xA100"], "unknown hardware '4xA100'"),
        (["--num-heads", "7"], "num_heads=7 must divide model_dim=512"),
        (["--implementation", "pgolf"], "has not been measured on a GPU yet"),
        (["--without", "no-such-record"], "no record of the table has that in its name"),
        (["--calibrate", "records", "--backtest", "records"], "give one"),
    ],
)
def test_refusals_are_one_line(args, fragment):
    assert_one_line_error(cli("plan", "--preset", "baseline", *args), "error: ", fragment)


@pytest.mark.slow
def test_calibrate_and_backtest_from_records_folders(tmp_path):
    """`--calibrate` on a records checkout writes a table `plan` reads; a folder it cannot express is named."""
    root = tmp_path / "records" / "track_10min_16mb"
    for name, log in (("2026-03-17_NaiveBaseline", "march_baseline.log"), (RECORD_0427, "april_0427.log"),
                      ("2026-03-24_Ternary", "ternary.log")):  # fmt: skip
        (root / name).mkdir(parents=True)
        (root / name / "README.md").write_text("# a record\n")
        shutil.copy(LOGS / log, root / name / "train.log")
    table = tmp_path / "table.json"
    result = cli("plan", "--calibrate", str(tmp_path), "--table", str(table))
    assert result.returncode == 0, result.stderr
    assert "left out 2026-03-24_Ternary: ternary weights" in result.stdout
    assert "backtest: 2 records" in result.stdout and table.is_file()
    assert {s["record"] for s in json.loads(table.read_text())["samples"]} == {
        "2026-03-17_NaiveBaseline",
        RECORD_0427,
    }
    planned = cli("plan", "--preset", "baseline", "--table", str(table))
    assert planned.returncode == 0, planned.stderr
    tested = cli("plan", "--backtest", str(tmp_path))
    assert tested.stdout.splitlines()[-1].startswith("backtest: 2 records, ms/step median |error| ")
    assert_one_line_error(cli("plan", "--calibrate", str(tmp_path / "none")), "no records folders")


def test_the_sweep_report_plans_each_variant(tmp_path):
    spec = write_spec(
        tmp_path,
        'name = "depth"\npreset = "baseline"\nseeds = [1]\n[[variants]]\nname = "deep"\nnum_layers = 12\n',
    )
    sweep = sw.load_sweep(spec, environ={})
    for run in sweep.runs:
        fake_run(run.path, run.cfg, sweep=True, curve=3, roundtrip_val_loss=3.0)
    result = sw.report(sweep)
    plans = {row["variant"]: row["plan"] for row in result["variants"]}
    assert plans["deep"]["breaks"] and plans["deep"]["verdict"].startswith("breaks the byte cap by")
    assert not plans[sweep.base.name]["breaks"] and plans[sweep.base.name]["verdict"].startswith(
        "fits 8xH100"
    )
    assert plans["deep"]["ms_per_step"][0] > plans[sweep.base.name]["ms_per_step"][0]
    text = sw.markdown(result)
    assert "| 8xH100 ms/step | 8xH100 steps | 8xH100 bytes | 8xH100 verdict |" in text
    assert "| **breaks the byte cap by" in text


@pytest.mark.slow
def test_train_away_from_the_target_says_the_plan_and_runs_shows_it(sotu_dataset, tmp_path):
    assert target_line(preset("smoke")) == (
        "plan on 8xH100 (the records' code; cli.py plan for every figure): cannot run there as set: config: world "
        "size 8 must divide grad_accum_steps=2"
    )
    flags = ["--preset", "smoke", "--out-dir", str(tmp_path), "--run-id", "b", "--grad-accum-steps", "8"]
    planned = cli("train", *flags, *data_flags(sotu_dataset))
    assert planned.returncode == 0, planned.stderr
    line = next(x for x in planned.stdout.splitlines() if "plan on 8xH100" in x)
    assert re.search(
        r"plan on 8xH100 at [\d.]+ ms/step \(the records' code; .*\): fits 8xH100: [\d,]+ steps", line
    )
    listed = cli("runs", "--out-dir", str(tmp_path), "--plan")
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"^b: plan on 8xH100 at [\d.]+ ms/step: fits 8xH100", listed.stdout, re.M)
