"""runs --compare RUN... --against RECORD_FOLDER: Welch's test of finished runs against a record's seeds,
on run directories and records folders written here (no training)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats as scipy_stats

from core.common.errors import PgolfError
from tests.support.runs import SEEDS, VARIANTS, fake_run, write_folder, write_spec

RECORD_LOSS = [v[0] for v in SEEDS.values()]  # the folder's seeds 42, 1337, 2025, from their logs
RECORD_BPB = [v[1] for v in SEEDS.values()]


def cli(*args: str):
    """The command run in this process (typer's runner: a PgolfError is left in `.exception`, which
    cli.main turns into its one line)."""
    from typer.testing import CliRunner

    from cli import app

    return CliRunner().invoke(app, list(args))


@pytest.fixture
def setup(tmp_path):
    record = write_folder(tmp_path / "record")
    runs = tmp_path / "runs"
    mine = [(1, 2.50, 1.0866), (2, 2.503, 1.0879), (3, 2.498, 1.0857)]  # ~0.025 nats better
    for seed, loss, bpb in mine:
        fake_run(
            runs / f"mine-seed{seed}",
            {"seed": seed, "run_group": "mine"},
            roundtrip_val_loss=loss,
            roundtrip_val_bpb=bpb,
        )
    fake_run(
        runs / "same-seed1",
        {"seed": 1, "run_group": "same"},
        roundtrip_val_loss=2.5252,
        roundtrip_val_bpb=1.0974,
    )
    fake_run(
        runs / "same-seed2",
        {"seed": 2, "run_group": "same"},
        roundtrip_val_loss=2.5268,
        roundtrip_val_bpb=1.0981,
    )
    return record, runs, mine


def test_runs_that_beat_a_record_by_the_margin_get_scipys_p_with_both_sides_seeds(setup):
    record, runs, mine = setup
    result = cli("runs", "--out-dir", str(runs), "--compare", "mine", "--against", str(record))
    assert result.exit_code == 0, result.exception
    loss = [m[1] for m in mine]
    ref = scipy_stats.ttest_ind(np.array(RECORD_LOSS) - 0.005, loss, equal_var=False, alternative="greater")
    out = result.output
    assert f"record {record}: seeds 42,1337,2025;" in out and "runs: 3 (seeds 1,2,3);" in out
    assert f"p={ref.pvalue:.3e} that the runs are not better by 0.005 nats" in out
    assert ref.pvalue < 0.01 and "beats the record by 0.005 nats at p < 0.01" in out
    got = json.loads(
        cli("runs", "--out-dir", str(runs), "--compare", "mine", "--against", str(record), "--json").output
    )
    assert got["nats"]["p"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert got["record_seeds"] == ["42", "1337", "2025"] and got["run_seeds"] == [1, 2, 3]
    margin_bpb = 0.005 * np.mean(RECORD_BPB) / np.mean(RECORD_LOSS)
    ref_bpb = scipy_stats.ttest_ind(np.array(RECORD_BPB) - margin_bpb, [m[2] for m in mine], equal_var=False,
                                    alternative="greater")  # fmt: skip
    assert got["bpb"]["p"] == pytest.approx(ref_bpb.pvalue, rel=1e-9) and got["margin_bpb"] == pytest.approx(
        margin_bpb
    )


def test_runs_no_better_than_the_record_do_not_beat_it_and_the_flags_change_the_test(setup):
    record, runs, _ = setup
    same = cli("runs", "--out-dir", str(runs), "--compare", "same", "--against", str(record))
    assert same.exit_code == 0 and "does not beat the record" in same.output
    # run directories work as well as a group; a huge margin is not met, a zero one at a loose alpha is
    dirs = [str(runs / f"mine-seed{n}") for n in (1, 2, 3)]
    strict = json.loads(
        cli("runs", "--compare", *dirs, "--against", str(record), "--margin", "0.1", "--json").output
    )
    assert not strict["beats_record"] and strict["margin_nats"] == 0.1
    loose = json.loads(cli("runs", "--compare", *dirs, "--against", str(record), "--margin", "0", "--alpha", "0.5",
                           "--json").output)  # fmt: skip
    assert loose["beats_record"] and loose["nats"]["p"] < strict["nats"]["p"]


def test_without_logs_the_records_figures_come_from_its_submission(setup):
    record, runs, _ = setup
    for log in record.glob("*.log"):
        log.unlink()
    got = json.loads(
        cli("runs", "--out-dir", str(runs), "--compare", "mine", "--against", str(record), "--json").output
    )
    assert got["record_seeds"] == ["42", "1337", "2025"]
    assert got["nats"]["mean_a"] == pytest.approx(
        np.mean([round(v, 5) for v in RECORD_LOSS])
    )  # submission's rounding


def test_what_cannot_be_compared_is_one_line(setup, tmp_path):
    record, runs, _ = setup
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, message in (
        (("--compare", "nope", "--against", str(record)), "nope: no run group"),
        (("--compare", "same-seed1", "--against", str(record)), "group B needs at least 2 runs"),
        (("--against", str(record)), "give the runs to test with --compare"),
        (("--compare", "mine", "--against", str(empty)), "no per-seed val_loss and val_bpb"),
        (("--compare", "mine", "same", "mine"), "runs --compare takes two groups"),
        (("same",), "give runs or groups after --compare"),
    ):
        result = cli("runs", "--out-dir", str(runs), *args)
        assert isinstance(result.exception, PgolfError) and message in str(result.exception), (
            args,
            result.output,
        )


def test_compare_of_two_groups_still_takes_them_after_one_flag(setup):
    _, runs, _ = setup
    got = json.loads(cli("runs", "--out-dir", str(runs), "--compare", "same", "mine", "--json").output)
    assert (got["a"], got["b"]) == ("same", "mine") and got["diff_nats"] > 0.02


def test_a_sweep_whose_spec_names_a_record_compares_every_variant_with_its_seeds(tmp_path):
    from core.runs import sweep as sw

    write_folder(tmp_path / "the_record")
    spec = write_spec(tmp_path, 'record = "the_record"\nmargin_nats = 0.005\n' + VARIANTS)
    plan = sw.load_sweep(spec, environ={})
    losses = {"base": [2.53, 2.531], "lr_low": [2.49, 2.495], "wide": [2.52, 2.54]}
    for run in plan.runs:
        if run.seed <= 2:
            fake_run(
                run.path, run.cfg, sweep=True, curve=3, roundtrip_val_loss=losses[run.variant][run.seed - 1]
            )
    result = sw.report(plan)
    assert result["compared_with"] == f"the record {tmp_path / 'the_record'} (seeds 42, 1337, 2025)"
    for row in result["variants"]:  # the base config's runs too
        mine = losses[row["variant"]]
        ref = scipy_stats.ttest_ind(
            np.array(RECORD_LOSS) - 0.005, mine, equal_var=False, alternative="greater"
        )
        assert row["p_margin"] == pytest.approx(ref.pvalue, rel=1e-12)
        assert row["diff_nats"] == pytest.approx(np.mean(mine) - np.mean(RECORD_LOSS), abs=1e-12)
    assert "minus that of the record" in sw.markdown(result)
    bad = write_spec(tmp_path, 'record = "nowhere"\n' + VARIANTS, name="bad.toml")
    with pytest.raises(PgolfError, match="record must be the path of a records folder, got 'nowhere'"):
        sw.load_sweep(bad, environ={})


def strict_json(text: str):
    """JSON as the standard has it: NaN and Infinity are not JSON (Python's json accepts them)."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in {text[:200]}"))


@pytest.mark.parametrize(
    ("loss", "message"),
    [
        (0.0, "seed 42's val_loss 0 is not a number above 0 and below 1,000"),
        # Written out in its logs, 1e300 is a number 309 digits long: each log is refused (check-record
        # names it), and submission.json's own figures are no losses either.
        (1e300, "no per-seed val_loss and val_bpb in its logs or submission.json"),
        (-1e300, "no per-seed val_loss and val_bpb in its logs or submission.json"),
    ],
    ids=["zero", "huge", "negative"],
)
def test_a_record_whose_losses_are_no_losses_is_one_line(setup, tmp_path, loss, message):
    """A mean val_loss of 0 divided the margin by zero; ±1e300 overflowed the spread."""
    _, runs, _ = setup
    record = write_folder(tmp_path / "odd", {seed: (loss, *rest) for seed, (_, *rest) in SEEDS.items()})
    result = cli("runs", "--out-dir", str(runs), "--compare", "mine", "--against", str(record))
    assert isinstance(result.exception, PgolfError), result.output
    assert str(result.exception).removeprefix("record ").startswith(f"{record}: ")
    assert message in str(result.exception)


def test_a_log_figure_written_with_an_exponent_is_read_and_refused_when_no_loss(setup):
    record, runs, _ = setup
    log = record / "train_seed42.log"
    log.write_text(
        log.read_text().replace("val_bpb:1.09743840 eval_time:65493ms", "val_bpb:1e300 eval_time:65493ms")
    )
    result = cli("runs", "--out-dir", str(runs), "--compare", "mine", "--against", str(record))
    assert isinstance(result.exception, PgolfError)
    assert (
        str(result.exception)
        == f"record {record}: seed 42's val_bpb 1E+300 is not a number above 0 and below 1,000"
    )


def test_a_margin_past_any_loss_is_not_met_and_the_json_stays_json(setup):
    record, runs, _ = setup
    result = cli("runs", "--out-dir", str(runs), "--compare", "mine", "--against", str(record), "--margin", "1e308",
                 "--json")  # fmt: skip
    got = strict_json(result.output)
    assert got["nats"]["p"] == 1.0 and got["bpb"]["p"] == 1.0 and not got["beats_record"]
    assert got["nats"]["t"] is None  # -inf: no JSON number; null
    assert "p=1.000e+00" in cli("runs", "--out-dir", str(runs), "--compare", "mine", "--against", str(record),
                                "--margin", "1e308").output  # fmt: skip


def test_a_diverged_run_is_named_and_every_json_figure_that_does_not_exist_is_null(setup):
    record, runs, _ = setup
    fake_run(
        runs / "diverged-seed4",
        {"seed": 4, "run_group": "mine"},
        roundtrip_val_loss=float("nan"),
        roundtrip_val_bpb=float("inf"),
    )
    result = cli("runs", "--out-dir", str(runs), "--compare", "mine", "--against", str(record))
    assert isinstance(result.exception, PgolfError)
    assert str(result.exception).startswith(
        f"{runs / 'diverged-seed4'}: its final val_loss nan and val_bpb inf"
    )
    rows = [strict_json(line) for line in cli("runs", "--out-dir", str(runs), "--json").output.splitlines()]
    (diverged,) = [row for row in rows if row["name"] == "diverged-seed4"]
    assert diverged["roundtrip_val_bpb"] is None and diverged["score_val_loss"] is None
    one = cli(
        "runs", "--out-dir", str(runs), "--compare", "same", "mine", "--json"
    )  # a group without a spread
    assert isinstance(one.exception, PgolfError) and "not finite" in str(one.exception)
