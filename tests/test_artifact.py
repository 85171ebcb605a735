"""The run's artifact and final scoring: formats from the config, any artifact read back, GPTQ's
calibration in the backends, and sliding-window evaluation through the backends."""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import pytest

from core.artifact import container, int8_format, mixed, upstream
from core.artifact import export as artifact
from core.artifact import quantized as quant
from core.artifact.budget import export_budget, from_int8
from core.artifact.export import class_bits, class_clips, export_artifact, quant_label
from core.artifact.load import load_mixed_artifact, read_artifact
from core.artifact.records import RECORD_BF16_NAMES, load_record_artifact
from core.artifact.rowquant import Clip
from core.common.errors import PgolfError
from core.config.presets import preset
from core.data.tables import byte_tables
from core.data.tokenizer import load_tokenizer
from core.datasets.writers import write_shard
from core.eval.bpb import EvalData
from core.eval.plain import evaluate
from core.eval.score import evaluators, load_eval_data
from core.eval.sliding import evaluate_sliding
from core.model.params import artifact_classes, head_weight_name, param_shapes, param_specs, storage_dtypes
from core.train.calibration import calibrate_gptq
from core.train.loop import train_loader
from tests.golden_data import GOLDEN, RECORD_PTZ, goldens
from tests.support.artifacts import int8_stats
from tests.support.backends import BACKENDS, LOOPS_LANES, busy_params, make_backend, needs
from tests.support.cli import cli

# A wide MLP: its matrices (1280 x 64) pass the 65,536-element floor and are quantized.
WIDE = {"mlp_mult": 20.0}


# ------------------------------------------------------------ config -> format
def test_bits_clips_and_label_follow_the_config():
    cfg = preset("smoke").replace(quant_format="mixed", embed_bits=16, matrix_bits=6, mlp_bits=5)
    assert class_bits(cfg) == {"embedding": "fp16", "attention": 6, "mlp": 5, "other": 8}
    assert quant_label(cfg) == "mixed"
    assert quant_label(cfg.replace(mlp_bits=0)) == "int6"
    assert quant_label(preset("smoke")) == "int8"
    clips = class_clips(cfg.replace(matrix_clip_sigmas=12.85, mlp_clip_sigmas=10.0))
    assert clips["attention"] == Clip.sdclip(12.85) and clips["mlp"] == Clip.sdclip(10.0)
    assert clips["other"] == Clip.sdclip(12.85)  # the matrices' k
    assert class_clips(cfg)["other"] == Clip.percentile(quant.CLIP_QUANTILE)  # 8 bits: the int8 format's clip
    assert class_clips(cfg)["attention"] == Clip()  # below 8 bits: the percentile search


def test_the_int8_export_is_the_int8_format(tmp_path):
    cfg = preset("smoke").replace(**WIDE)
    params, dtypes = busy_params(cfg), storage_dtypes(cfg, bf16=False)
    report = export_artifact(params, cfg, dtypes, tmp_path / "a.pgolf", 0)
    model = int8_format.quantize_int8(params, dtypes, artifact_classes(cfg))
    kept = artifact.scoring_config(cfg)  # what the artifact keeps to be scored alone
    assert kept == {"train_seq_len": 64, "val_max_tokens": 4096}  # the smoke preset's, shapes aside
    # the default tokenizer's digest when its file is there (data prepared), else none
    tokenizer = artifact.tokenizer_digest(cfg)
    assert (tmp_path / "a.pgolf").read_bytes() == int8_format.artifact_bytes(
        model, config=kept, tokenizer=tokenizer
    )
    assert report.sizes["model_bytes"] == (tmp_path / "a.pgolf").stat().st_size
    assert report.sizes["payload_bytes"] == int8_stats(params, model, dtypes)["int8_payload_bytes"]
    rows = {r["class"]: r for r in export_budget(report, cfg, params)}
    assert rows["mlp"]["bits"] == "int8" and rows["total"]["params"] == sum(v.size for v in params.values())


def test_the_mixed_export_follows_the_config(tmp_path):
    cfg = preset("smoke").replace(
        **WIDE,
        quant_format="mixed",
        attn_bits=5,
        mlp_bits=7,
        embed_bits=16,
        compressor="zstd",
        byte_shuffle=2,
    )
    params = busy_params(cfg)
    report = export_artifact(params, cfg, storage_dtypes(cfg, False), tmp_path / "m.pgolf", 0)
    model = read_artifact(tmp_path / "m.pgolf")
    assert isinstance(model, mixed.MixedModel)
    box = container.open_container((tmp_path / "m.pgolf").read_bytes())
    assert (box.compressor, box.shuffle) == ("zstd", 2)
    assert model.info["blocks.0.mlp.fc.weight"]["bits"] == 7
    assert model.info["tok_emb.weight"]["store"] == "fp16"
    rows = {r["class"]: r for r in export_budget(report, cfg, params)}
    assert rows["mlp"]["bits"] == "int7" and rows["embedding"]["bits"] == "fp16"
    assert rows["total"]["bytes_compressed"] == report.sizes["model_bytes"]
    assert report.gptq_tensors == 0  # no Hessians given
    back = artifact.dequantize(model)
    for name, w in params.items():  # within a quarter step of each row's scale (int7: 1/63 of the clip)
        assert np.abs(back[name] - w).max() < 0.1, name


# --------------------------------------------------------------------- reading
@pytest.mark.slow
def test_every_format_is_read_back(tmp_path):
    cfg = preset("smoke").replace(**WIDE)
    params, dtypes, classes = busy_params(cfg), storage_dtypes(cfg, False), artifact_classes(cfg)
    int8 = int8_format.quantize_int8(params, dtypes, classes)
    container.write_artifact(
        tmp_path / "a.pgolf", int8_format.artifact_bytes(int8, "lzma", shuffle=2), "lzma"
    )
    container.write_artifact(
        tmp_path / "m.pgolf", mixed.mixed_artifact_bytes(mixed.quantize_mixed(params, classes)), "brotli"
    )
    expected = {
        "a.pgolf": int8_format.dequantize_int8(int8),
        "m.pgolf": mixed.dequantize_mixed(load_mixed_artifact(tmp_path / "m.pgolf")),
        RECORD_PTZ.name: mixed.dequantize_mixed(load_record_artifact(RECORD_PTZ)),
    }
    paths = {"a.pgolf": tmp_path / "a.pgolf", "m.pgolf": tmp_path / "m.pgolf", RECORD_PTZ.name: RECORD_PTZ}
    pytest.importorskip("torch")
    upstream.save_upstream_torch(tmp_path / "u.ptz", int8)
    expected["u.ptz"], paths["u.ptz"] = int8_format.dequantize_int8(int8), tmp_path / "u.ptz"
    for name, path in paths.items():
        got = artifact.dequantize(read_artifact(path))
        assert sorted(got) == sorted(expected[name]), name
        for key, value in expected[name].items():
            np.testing.assert_array_equal(got[key], value, err_msg=f"{name}: {key}")


def test_the_int8_model_described_as_mixed_dequantizes_the_same():
    cfg = preset("smoke").replace(**WIDE)
    params = busy_params(cfg)
    int8 = int8_format.quantize_int8(params, storage_dtypes(cfg, True), artifact_classes(cfg))
    view = from_int8(int8, artifact_classes(cfg))
    a, b = int8_format.dequantize_int8(int8), mixed.dequantize_mixed(view)
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def mixed_blob(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("mixed") / "m.pgolf"
    cfg = preset("smoke").replace(**WIDE, quant_format="mixed", compressor="brotli", byte_shuffle=2)
    export_artifact(busy_params(cfg), cfg, storage_dtypes(cfg, False), path, 0)
    return path.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("cut", [0, 5, 11, 12, 40, -1])
def test_damaged_artifacts_are_one_line(tmp_path, mixed_blob, cut):
    (tmp_path / "bad").write_bytes(mixed_blob[:cut])
    with pytest.raises(PgolfError, match="artifact") as err:
        read_artifact(tmp_path / "bad")
    assert "\n" not in str(err.value)


# ------------------------------------------------------- the backends' hooks
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_input_hessians(backend_name, tied):
    """Every linear weight gets the Gram matrix of its inputs: q, k and v share theirs, the head's is
    the final hidden state's, and a looped layer adds each visit."""
    cfg = preset("smoke").replace(tie_embeddings=tied, **LOOPS_LANES)
    backend = make_backend(backend_name, cfg)
    backend.load_params(busy_params(cfg))
    x = np.random.default_rng(3).integers(0, cfg.vocab_size, (3, cfg.train_seq_len)).astype(np.int32)
    batches = [(x[:2], x[:2]), (x[2:], x[2:])]
    backend.set_looping(False)
    h = backend.input_hessians(iter(batches))
    specs = param_specs(cfg)
    linears = {n for n, s in specs.items() if s.kind in ("attention", "mlp") and len(s.shape) == 2}
    assert set(h) == linears | {head_weight_name(cfg)}
    for name, gram in h.items():
        cols = param_shapes(cfg)[name][1]
        assert gram.shape == (cols, cols) and gram.dtype == np.float32, name
        np.testing.assert_allclose(gram, gram.T, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(h["blocks.0.attn.c_q.weight"], h["blocks.0.attn.c_v.weight"])
    hidden = _hidden(backend, backend_name, x)
    np.testing.assert_allclose(h[head_weight_name(cfg)], hidden.T @ hidden, rtol=1e-4, atol=1e-3)
    backend.set_looping(True)  # layers 1 and 2 run twice, 0 once
    looped = backend.input_hessians(iter(batches))
    np.testing.assert_allclose(looped["blocks.0.mlp.fc.weight"], h["blocks.0.mlp.fc.weight"], rtol=1e-5)
    assert np.trace(looped["blocks.1.mlp.fc.weight"]) > 1.5 * np.trace(h["blocks.1.mlp.fc.weight"])


def _hidden(backend, name: str, x: np.ndarray) -> np.ndarray:
    """The final hidden states (tokens, d) from the framework's own model."""
    if name == "cuda":
        import torch

        with torch.no_grad():
            out = backend.model.hidden(torch.from_numpy(x).long(), backend.looping)
        return out.reshape(-1, out.shape[-1]).numpy().astype(np.float64)
    import mlx.core as mx

    out = np.array(backend.model.hidden(mx.array(x), backend.looping))
    return out.reshape(-1, out.shape[-1]).astype(np.float64)


@needs("cuda")
@needs("mlx")
def test_both_backends_collect_the_same_hessians_and_token_losses():
    cfg = preset("smoke").replace(**LOOPS_LANES)
    params = busy_params(cfg)
    x = np.random.default_rng(4).integers(0, cfg.vocab_size, (2, cfg.train_seq_len)).astype(np.int32)
    got = []
    for name in ("cuda", "mlx"):
        backend = make_backend(name, cfg)
        backend.load_params(params)
        nll = backend.token_losses(x, x)
        assert nll.shape == x.shape and float(nll.sum()) == pytest.approx(
            float(backend.eval_nll(x, x)), rel=1e-6
        )
        got.append((backend.input_hessians([(x, x)]), nll))
    (h_t, nll_t), (h_m, nll_m) = got
    np.testing.assert_allclose(nll_m, nll_t, rtol=0, atol=2e-5)
    assert sorted(h_t) == sorted(h_m)
    for name in h_t:
        np.testing.assert_allclose(h_m[name], h_t[name], rtol=1e-4, atol=1e-3, err_msg=name)


@pytest.mark.slow
@needs("cuda")
def test_calibration_reads_training_batches_and_gptq_rounds_the_matrices(sotu_dataset, tmp_path):
    cfg = sotu_dataset.config(**WIDE, quant_format="mixed", gptq_enabled=True, gptq_calibration_batches=3)
    backend = make_backend("cuda", cfg)
    params = busy_params(cfg)
    backend.load_params(params)
    lines: list[str] = []
    hessians = calibrate_gptq(backend, train_loader(cfg, backend), lines.append)
    assert "from 3 batches" in lines[0]
    report = export_artifact(params, cfg, storage_dtypes(cfg, False), tmp_path / "g.pgolf", 0, hessians)
    model = read_artifact(tmp_path / "g.pgolf")
    gptq = sorted(n for n, i in model.info.items() if i.get("method") == "gptq")
    quantized = sorted(
        n for n, i in model.info.items() if i["store"] == "int" and model.quantized[n].ndim == 2
    )
    assert gptq and report.gptq_tensors == len(gptq)
    assert gptq == sorted(n for n in quantized if n in hessians)


# ---------------------------------------------------------- sliding windows
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_the_records_sliding_score_through_the_backends(backend_name, challenge_dir):
    """The record's own eval_val_sliding on its tiny model, fixed weights (goldens): each backend,
    scoring the same tokens with pgolf's windows, gives its val_loss and val_bpb within 1e-6."""
    g, meta = goldens()
    m, ev = meta["model"], meta["eval"]
    same = ("vocab_size", "num_layers", "model_dim", "num_heads", "num_kv_heads", "mlp_mult", "rope_dims",
            "xsa_last_n", "ve_enabled", "ve_dim", "ve_layers", "skip_gates_enabled", "ln_scale", "qk_gain_init",
            "tie_embeddings", "logit_softcap", "rope_base", "train_seq_len", "eval_seq_len", "eval_stride")  # fmt: skip
    cfg = preset("smoke").replace(
        **{k: m[k] for k in same}, mlp_activation="leaky_relu2", eval_batch_seqs=ev["batch_seqs"]
    )
    shapes = param_shapes(cfg)
    params = {k[6:]: v.reshape(shapes[k[6:]]) for k, v in g.items() if k.startswith("model/")}
    backend = make_backend(backend_name, cfg)
    backend.load_params(params)
    tables = byte_tables(load_tokenizer(challenge_dir / "fineweb_1024_bpe.model"), 1024)
    meter = evaluate_sliding(backend, EvalData(g["eval/tokens"], tables))
    assert meter.tokens == len(g["eval/tokens"]) - 1
    assert meter.val_loss == pytest.approx(ev["val_loss"], abs=1e-6)
    assert meter.val_bpb == pytest.approx(ev["val_bpb"], abs=1e-6)


@needs("cuda")
def test_sliding_with_a_full_stride_is_the_plain_score(sotu_dataset):
    cfg = sotu_dataset.config(eval_stride=64)  # smoke: 64-token sequences
    assert list(evaluators(cfg)) == ["plain"]  # stride == window: no second figure
    backend = make_backend("cuda", cfg)
    backend.load_params(busy_params(cfg))
    data = load_eval_data(cfg)
    plain, full = evaluate(backend, data), evaluate_sliding(backend, data)
    assert (full.tokens, full.nbytes) == (plain.tokens, plain.nbytes)
    assert full.val_bpb == pytest.approx(plain.val_bpb, abs=1e-6)
    backend.cfg = cfg.replace(eval_stride=16)
    assert list(evaluators(backend.cfg)) == ["plain", "sliding_window"]
    assert evaluate_sliding(backend, data).tokens == plain.tokens  # every target once


# ------------------------------------------- a record's own artifact, scored as the record scores it
def score_record_artifact(
    name: str, backend_name: str, tmp_path, challenge_dir, preset_name: str, flags: dict, *extra: str
) -> dict[str, tuple[float, float]]:
    """`cli.py eval` of tests/golden/<name>.ptz with a record's preset and `flags` on the golden's validation
    tokens (and byte sidecar, if it has one): {"plain" | "sliding_window": (val_loss, val_bpb)}."""
    golden = json.loads((GOLDEN / f"{name}.json").read_text())
    write_shard(tmp_path / "fineweb_val_000000.bin", np.array(golden["val_tokens"], dtype=np.uint16))
    if "val_bytes" in golden:
        write_shard(tmp_path / "fineweb_val_bytes_000000.bin", np.array(golden["val_bytes"], dtype=np.uint16))
    flags = {"data-path": tmp_path, "tokenizer-path": challenge_dir / "fineweb_1024_bpe.model", **flags}
    args = [f for k, v in flags.items() for f in (f"--{k}", str(v))]
    result = cli("eval", str(GOLDEN / f"{name}.ptz"), "--backend", backend_name, "--preset", preset_name,
                 *args, *extra, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    found = re.findall(r"eval:(\w+) tokens:\d+ val_loss:([\d.]+) val_bpb:([\d.]+)", result.stdout)
    return {kind: (float(loss), float(bpb)) for kind, loss, bpb in found}


def assert_scores(scores: dict[str, tuple[float, float]], golden: dict) -> None:
    for kind, (loss, bpb) in scores.items():
        assert loss == pytest.approx(golden[kind]["val_loss"], abs=1e-6), kind
        assert bpb == pytest.approx(golden[kind]["val_bpb"], abs=1e-6), kind


def record_0401_flags() -> dict:
    golden = json.loads((GOLDEN / "record_eval.json").read_text())
    s = golden["settings"]
    names = ("vocab_size", "train_seq_len", "eval_stride", "rope_dims", "ve_dim", "ve_layers", "xsa_last_n")
    return {k.replace("_", "-"): s[k] for k in names} | {"eval-batch-seqs": golden["eval_batch_seqs"]}


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_eval_scores_a_records_artifact_as_the_record_does(backend_name, tmp_path, challenge_dir):
    """An artifact written by record 2026-04-01's own code (GPTQ int6 MLP, int8 embedding, lzma), scored
    by its own deserialize + eval_val / eval_val_sliding (tests/golden/make_record_eval.py), and by
    `cli.py eval` with the record's preset: the same val_loss and val_bpb within 1e-6. The preset
    carries the record's precision: bf16 embeddings and RoPE tables made from bf16 positions."""
    golden = json.loads((GOLDEN / "record_eval.json").read_text())
    run = (backend_name, tmp_path, challenge_dir, "record_0401", record_0401_flags())
    scores = score_record_artifact("record_eval", *run)
    assert sorted(scores) == ["plain", "sliding_window"]
    assert_scores(scores, golden)
    # With float32 RoPE tables the same file scores differently: the check can fail.
    fp32 = score_record_artifact("record_eval", *run, "--rope-precision", "float32")
    assert abs(fp32["sliding_window"][1] - golden["sliding_window"]["val_bpb"]) > 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_eval_scores_the_top_records_artifact_as_it_does(backend_name, tmp_path, challenge_dir):
    """Record 2026-04-27's own artifact (GPTQ int6 MLP with LQER, both packings; int8 gate rows; brotli),
    from its own serialize path, read to the weights its deserialize gives, bit for bit; scored by its
    eval_val one row at a time (documents masked, bytes from a sidecar) and by `cli.py eval` with its
    preset: within 1e-6."""
    golden = json.loads((GOLDEN / "record_eval_0427.json").read_text())
    weights = mixed.dequantize_mixed(load_record_artifact(GOLDEN / "record_eval_0427.ptz"))
    assert sorted(weights) == sorted(golden["weights_sha256"])
    for name, digest in golden["weights_sha256"].items():
        assert hashlib.sha256(np.ascontiguousarray(weights[name]).tobytes()).hexdigest() == digest, name
    env = golden["env"]
    flags = {
        "vocab-size": env["VOCAB_SIZE"], "train-seq-len": env["TRAIN_SEQ_LEN"], "eval-stride": env["EVAL_SEQ_LEN"],
        "rope-dims": env["ROPE_DIMS"], "xsa-last-n": env["XSA_LAST_N"], "num-loops": env["NUM_LOOPS"],
        "loop-start": env["LOOP_START"], "loop-end": env["LOOP_END"], "gate-window": env["GATE_WINDOW"],
        "parallel-start-layer": env["PARALLEL_START_LAYER"],
        # its eval_val took one row a batch: flat batches of EVAL_SEQ_LEN tokens
        "val-batch-size": env["EVAL_SEQ_LEN"], "grad-accum-steps": 1,
    }  # fmt: skip
    run = (backend_name, tmp_path, challenge_dir, "record_0427", flags)
    scores = score_record_artifact("record_eval_0427", *run, "--no-ttt-enabled")
    assert sorted(scores) == ["plain"]
    assert_scores(scores, golden)
    # Without the document mask the score moves past the tolerance (float32 RoPE tables: by 3e-6).
    unmasked = score_record_artifact(
        "record_eval_0427", *run, "--no-ttt-enabled", "--no-varlen-attn-enabled", "--eval-protocol", "rows"
    )
    assert abs(unmasked["plain"][0] - golden["plain"]["val_loss"]) > 5e-6


def test_a_records_artifact_keeps_its_embedding_tables_in_bf16():
    """The records score a model cast to bf16 whose linear layers, vectors and controls go back to fp32:
    the tensors the records' reader gives bf16 are the ones pgolf's parameter table keeps in the compute
    dtype, for a model with every table (value embeddings on)."""
    cfg = preset("record_0401")
    names = set(param_specs(cfg))
    assert (
        {n for n in names if RECORD_BF16_NAMES.search(n)}
        == {n for n, d in storage_dtypes(cfg, True).items() if d == "bfloat16"}
        == {"tok_emb.weight", "ve_shared.embed.weight"}
    )
    model = load_record_artifact(GOLDEN / "record_eval.ptz")
    assert {n for n, i in model.info.items() if i.get("dtype") == "bfloat16"} == {
        "tok_emb.weight",
        "ve_shared.embed.weight",
    }
