"""The records' log reader on excerpts of every log format in the challenge's track_10min_16mb
(tests/fixtures/record_logs/: lines copied from the records' logs, a few of each kind)."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.common.errors import PgolfError
from core.runs.record_logs import code_defaults, read_folder, read_log, read_records, readme_env

LOGS = Path(__file__).parent / "fixtures" / "record_logs"


def run_of(name: str, index: int = -1):
    return read_log((LOGS / name).read_text(), name)[index]


def test_march_step_avg_log():
    run = run_of("march_baseline.log")
    assert run.model_params == 17_059_912
    assert run.settings["train_batch_tokens"] == "524288"
    assert run.settings["num_kv_heads"] == "4"
    assert run.world_size == 8 and run.gpu is None
    assert run.steps == 13_780 and run.stop == (13_780, 600_038.0)
    (phase,) = run.phases()
    # From step 13,000 (566,009 ms; the first step logged past the phase's first 5%) to the stop.
    assert phase.ms_per_step == pytest.approx((600_038 - 566_009) / (13_780 - 13_000), rel=1e-9)
    assert phase.ms_per_step == pytest.approx(43.54, abs=0.1)
    assert run.peak_memory_mib == 10_184
    assert run.quant_label == "int8+zlib" and run.quantized_bytes == 15_815_847
    assert run.code_bytes == 47_642 and run.total_bytes == 15_863_489
    assert run.eval_seconds == {"roundtrip": 1.401}
    assert run.val_tokens == 63_779_840


def test_march_log_with_the_script_and_nvidia_smi():
    run = run_of("march_code_h200.log")
    assert run.gpu == "H200"
    # The copy of the script gives the defaults; the code's own log0(...) line is no figure.
    assert run.sources["log_script"]["num_layers"] == "9"
    assert run.model_params == 17_059_912
    assert run.phases()[0].ms_per_step == pytest.approx(41.6, abs=0.1)


def test_april_hyperparameters_block_and_loop_switch():
    run = run_of("april_0427.log")
    assert run.sources["log"]["num_loops"] == "2" and run.settings["compressor"] == "pergroup"
    assert run.switches == [2178] and run.varlen
    plain, looped = run.phases()
    # tok/s is the run's average so far: step N came at N * 786,432 / rate seconds.
    at = {
        n: n * 786_432 / rate * 1000 for n, rate in ((500, 8_217_810), (2000, 8_167_705), (2500, 7_705_526))
    }
    assert plain.ms_per_step == pytest.approx((at[2000] - at[500]) / 1500, rel=1e-9)
    assert looped.ms_per_step == pytest.approx((599_592 - at[2500]) / (4945 - 2500), rel=1e-9)
    assert 95 < plain.ms_per_step < 98 and 140 < looped.ms_per_step < 144
    assert run.quant_label == "quantized+pergroup" and run.quantized_bytes == 15_865_260
    assert run.code_bytes == 31_999
    # The diagnostic before quantization is no evaluation phase; the quantized one is the round trip.
    assert run.eval_seconds == {"roundtrip": 49.995, "ttt": 508.785}
    assert run.val_tokens == 47_851_520


def test_april_log_with_timestamps():
    run = run_of("april_timestamps.log")
    assert run.model_params == 35_944_602 and run.settings["num_layers"] == "11"
    assert run.switches == [2125] and run.varlen
    assert [round(p.ms_per_step) for p in run.phases()] == [97, 141]
    assert run.eval_seconds == {"roundtrip": 55.851, "ttt": 500.104}


def test_recurrence_switch_and_three_evaluations():
    run = run_of("april_recurrence.log")
    assert run.switches == [3000] and not run.varlen
    assert len(run.phases()) == 2
    assert run.quant_label == "int6+brotli" and run.code_bytes == 24_584
    assert run.eval_seconds == {"roundtrip": 7.776, "sliding": 76.195, "ttt": 405.41}


def test_ternary_log():
    run = run_of("ternary.log")
    assert run.model_params == 73_685_840
    # Printed settings win over the script's default (16 layers).
    assert run.sources["log_script"]["num_layers"] == "16" and run.settings["num_layers"] == "10"
    assert run.settings["model_dim"] == "768"
    assert run.code_bytes == 70_853 and run.artifact_bytes == {"ternary": 15_993_853 - 70_853}
    assert run.eval_seconds == {"sliding": 429.311}  # the temperature calibration is not a phase
    assert run.phases()[0].ms_per_step == pytest.approx((599_652 - 91_478) / (6530 - 1000))


def test_a_log_of_several_runs():
    runs = read_log((LOGS / "march_two_runs.log").read_text(), "train.log")
    assert [r.steps for r in runs] == [10_804, 12_386, 12_395]
    assert [r.peak_memory_mib for r in runs] == [8517, 11_254, 11_251]
    assert runs[-1].eval_seconds == {"roundtrip": 1.547, "sliding": 72.65}
    assert runs[-1].quantized_bytes == 15_296_720


def test_an_exact_line_is_the_phase_only_when_alone():
    run = run_of("april_legal_ttt.log")
    assert run.eval_seconds == {"roundtrip": 7.77, "sliding": 83.569, "ttt": 289.945}


def test_script_defaults_and_readme_commands():
    source = 'a = int(os.environ.get("NUM_LAYERS", 11))\nb = os.getenv("RUN_ID", f"x{y}")\nc = _e("MODEL_DIM", 768, int)\n'
    assert code_defaults(source) == {"num_layers": "11", "model_dim": "768"}
    readme = "Run:\n```bash\nNUM_LAYERS=10 \\\nMLP_MULT=3 torchrun --standalone train_gpt.py\n```\n```\nNOT_A_RUN=1\n```\n"
    assert readme_env(readme) == {"num_layers": "10", "mlp_mult": "3"}


def test_folder_sources_in_order(tmp_path):
    folder = tmp_path / "records" / "track_10min_16mb" / "2026-01-01_Example"
    folder.mkdir(parents=True)
    (folder / "README.md").write_text("```bash\nNUM_LAYERS=10 torchrun train_gpt.py\n```\n")
    (folder / "train_gpt.py").write_text(
        'n = int(os.environ.get("NUM_LAYERS", 9))\nd = int(os.environ.get("MODEL_DIM", 512))\n'
    )
    (folder / "train.log").write_text((LOGS / "march_baseline.log").read_text())
    (folder / "requirements.txt").write_text("torch\n")
    (found,) = read_records(tmp_path)
    assert found.name == "2026-01-01_Example" and [r.log for r in found.runs] == ["train.log"]
    run = found.runs[0]
    assert run.settings["num_layers"] == "10" and run.settings["model_dim"] == "512"
    assert run.settings_in(("readme", "script"))["num_layers"] == "9"
    assert read_folder(folder).runs[0].model_params == 17_059_912


def test_no_records_is_one_line(tmp_path):
    with pytest.raises(PgolfError, match="no records folders"):
        read_records(tmp_path)
