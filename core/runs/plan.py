"""What a config costs on the challenge's machines, predicted without running it: the time a training step
takes in each phase, the steps that fit in the wallclock cap, the peak memory of a GPU, the artifact's bytes
beside the exact code bytes, the time of each evaluation phase, and one verdict.

The model is small and physical; its few factors are fitted on the challenge's records (core/runs/calibrate.py,
`cli.py plan --calibrate RECORDS_DIR`) and kept in `plan_table.json` beside this file:
- a step: per GPU, its tokens times (matmul FLOPs x a + attention FLOPs x b, dense or document-masked +
  activation bytes x c), plus d for each forward-backward pass a GPU runs; on an H200 times the H200 factor;
- memory: m0 + (parameters, gradients, optimizer state) x m1 + one micro-batch's activations x m2;
- bytes: each quantized tensor's values at the entropy of a Gaussian rounded at its step (bits and clip),
  times the compressor's factor, plus the scales and the tensors kept in floating point;
- evaluation: a fixed cost plus FLOPs x a factor, per phase (round trip, sliding windows, test-time training).
Each prediction carries the band the leave-one-out backtest measured (80% of the records within it).

The prediction is for the records' own training code: pgolf's ratio to it is one measured factor
(`implementation.pgolf` in the table), unknown until a GPU run measures it.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.artifact.export import class_bits, class_clips, class_floors
from core.artifact.quantized import KEEP_FLOAT_MAX_NUMEL
from core.common.errors import PgolfError
from core.common.files import read_json
from core.config.fields import EVAL_LIMIT_SECONDS, Config
from core.model.memory import memory_estimate
from core.model.params import KINDS, param_specs
from core.runs.train_script import code_bytes

TABLE_PATH = Path(__file__).with_name("plan_table.json")
MAX_TABLE_BYTES = 2**22
MIB = 2**20


@dataclass(frozen=True)
class Hardware:
    gpu: str
    count: int
    memory_bytes: int  # per GPU, as nvidia-smi reports it in the records' logs


# The H100's and H200's memory as the records' nvidia-smi tables give it (81,559 and 143,771 MiB).
HARDWARE = {
    "8xH100": Hardware("H100", 8, 81_559 * MIB),
    "1xH100": Hardware("H100", 1, 81_559 * MIB),
    "8xH200": Hardware("H200", 8, 143_771 * MIB),
}
VAL_DOCS = 50_000  # the challenge's validation split: its first 50,000 documents
DEFAULT_VAL_TOKENS = 62_021_632  # sp1024's validation tokens, for a config whose data no record used
QUANTITIES = ("ms_per_step", "memory", "bytes", "eval")
TARGET = "8xH100"  # the challenge's machine


def hardware(name: str) -> Hardware:
    if name not in HARDWARE:
        raise PgolfError(f"plan: unknown hardware {name!r} (choose from {', '.join(HARDWARE)})")
    return HARDWARE[name]


def load_table(path: Path = TABLE_PATH) -> dict[str, Any]:
    if not path.is_file():
        raise PgolfError(f"plan: no fitted table at {path}: run `cli.py plan --calibrate RECORDS_DIR`")
    table = read_json(path, "plan table", MAX_TABLE_BYTES)
    if not isinstance(table, dict) or "coefficients" not in table:
        raise PgolfError(f"plan table {path}: not a fitted table (no coefficients)")
    return table


# --------------------------------------------------------------------------- what a config computes
def layouts(cfg: Config) -> list[tuple[str, bool, float]]:
    """The training phases: (name, looped, the fraction of training at which it starts)."""
    if cfg.num_loops > 0 and cfg.enable_looping_at < 1.0:
        if cfg.enable_looping_at <= 0.0:
            return [("looped", True, 0.0)]
        return [("plain", False, 0.0), ("looped", True, cfg.enable_looping_at)]
    return [("plain", False, 0.0)]


def visits(cfg: Config, looped: bool) -> list[int]:
    encoder, decoder = cfg.layer_layout(looping=looped)
    return encoder + decoder


def matmul_params(cfg: Config, looped: bool) -> int:
    """The matmul weights one token goes through: each block's matrices once per visit, then the head
    (the tied embedding counts as the head; an embedding's lookup costs nothing)."""
    per_layer: Counter[int] = Counter()
    other = 0
    for name, spec in param_specs(cfg).items():
        if len(spec.shape) != 2 or spec.kind == "control" or name == "ve_shared.embed.weight":
            continue
        if name == "tok_emb.weight" and not cfg.tie_embeddings:
            continue
        if name.startswith("blocks."):
            per_layer[int(name.split(".")[1])] += math.prod(spec.shape)
        else:
            other += math.prod(spec.shape)
    return sum(per_layer[i] for i in visits(cfg, looped)) + other


def token_costs(cfg: Config, looped: bool, seq_len: int | None = None) -> dict[str, float]:
    """Per trained token: matmul FLOPs (6 per weight), causal attention FLOPs (6 x visits x dim x seq, over
    dense rows or document-masked ones) and activation bytes (what core/model/memory.py counts one token
    keeps for its backward pass)."""
    seq = seq_len or cfg.train_seq_len
    layers = len(visits(cfg, looped))
    flat = cfg if looped or cfg.num_loops == 0 else cfg.replace(num_loops=0)
    attention = 6.0 * layers * cfg.model_dim * seq
    return {
        "matmul": 6.0 * matmul_params(cfg, looped),
        "attention": 0.0 if cfg.varlen_attn_enabled else attention,
        "attention_varlen": attention if cfg.varlen_attn_enabled else 0.0,
        "activation": float(memory_estimate(flat, True, forward_tokens=1)["activations"]),
    }


STEP_TERMS = ("matmul", "attention", "attention_varlen", "activation")


def memory_parts(cfg: Config, hw: Hardware) -> dict[str, float]:
    """The states (parameters, gradients, optimizer) and one micro-batch's activations of a GPU, in bytes."""
    micro = max(1, cfg.train_batch_tokens // max(cfg.grad_accum_steps, hw.count))
    parts = memory_estimate(cfg, True, forward_tokens=micro)
    return {"states": float(parts["params"] + parts["optimizer"]), "activations": float(parts["activations"])}


# --------------------------------------------------------------------------- the artifact
def class_storage(cfg: Config) -> tuple[dict[str, int | str], dict[str, int], dict[str, float]]:
    """Per artifact class: its bits ("fp16" for one kept in fp16), the floor of values under which a tensor
    stays in fp16, and its SDClip k (0: the clip is searched over percentiles); the int8 format's for it."""
    if cfg.quant_format == "int8":
        return dict.fromkeys(KINDS, 8), dict.fromkeys(KINDS, KEEP_FLOAT_MAX_NUMEL), dict.fromkeys(KINDS, 0.0)
    clips = {cls: clip.k if clip.kind == "sdclip" else 0.0 for cls, clip in class_clips(cfg).items()}
    return class_bits(cfg), class_floors(cfg), clips


def gaussian_bits(bits: int, clip_sigmas: float) -> float:
    """Bits a value takes at the entropy of a Gaussian rounded to steps of clip / (2^(bits-1) - 1)."""
    levels = 2 ** (bits - 1) - 1
    return min(float(bits), max(0.5, math.log2(math.sqrt(2 * math.pi * math.e) * levels / clip_sigmas)))


def compressor_key(cfg: Config) -> str:
    return "int8+" + cfg.compressor if cfg.quant_format == "int8" else cfg.compressor


# --------------------------------------------------------------------------- evaluation
def val_tokens(known: dict[str, int], cfg: Config) -> int:
    """The validation tokens of the config's data: the challenge's split as the records logged it, by
    vocabulary (and CaseOps); else the nearest vocabulary's."""
    key = f"{cfg.vocab_size}{'+caseops' if cfg.caseops_enabled else ''}"
    if key in known:
        return int(known[key])
    sizes = {int(k.split("+")[0]): v for k, v in known.items() if "+" not in k}
    if not sizes:
        return DEFAULT_VAL_TOKENS
    return int(sizes[min(sizes, key=lambda v: abs(v - cfg.vocab_size))])


def eval_work(cfg: Config, tokens: int, hw: Hardware) -> dict[str, dict[str, float]]:
    """Per evaluation phase the config runs, the FLOPs per GPU each term of its time stands for."""
    looped = layouts(cfg)[-1][1]
    window = cfg.eval_window

    def forward(seq: int) -> float:  # one token's forward pass: a third of its training FLOPs
        costs = token_costs(cfg, looped, seq)
        return (costs["matmul"] + costs["attention"] + costs["attention_varlen"]) / 3.0

    share = tokens / hw.count
    work: dict[str, dict[str, float]] = {"roundtrip": {"flops": share * forward(window)}}
    if cfg.sliding_eval:
        work["sliding"] = {"flops": share * window / cfg.eval_stride * forward(window)}
    if cfg.ttt_enabled and cfg.ttt_mode == "full":
        scoring = window / cfg.eval_stride if cfg.sliding_eval else 1.0
        work["ttt_full"] = {"flops": share * (scoring + 3.0 * cfg.ttt_epochs) * forward(window)}
    elif cfg.ttt_enabled:
        doc = tokens / VAL_DOCS
        context = min(doc, cfg.ttt_eval_seq_len)
        # Each chunk is scored and learnt from with the document's context before it: on average half
        # the context a chunk, context / chunk times a token's share.
        lora = share * 3.0 * forward(cfg.ttt_eval_seq_len) * max(1.0, context / (2 * cfg.ttt_chunk_size))
        phases = cfg.phased_ttt_num_phases if cfg.phased_ttt_prefix_docs > 0 else 0
        prefix = min(cfg.phased_ttt_prefix_docs, VAL_DOCS) * doc / hw.count
        trained = prefix * cfg.global_ttt_epochs * 3.0 * forward(window) * (phases + 1) / 2 if phases else 0.0
        work["ttt_lora"] = {"flops": lora, "global": trained}
    return work


# --------------------------------------------------------------------------- features and predictions
@dataclass
class Features:
    """Everything the fitted factors multiply, for one config on one machine."""

    gpu: str
    steps: list[list[float]]  # per training phase, a GPU's tokens x each of STEP_TERMS
    micro_steps: int  # forward-backward passes a GPU runs a step (each pays the fixed cost)
    memory: dict[str, float]  # memory_parts
    compressor: str  # compressor_key
    quant_format: str
    fixed_bits: float  # the quantized values whose clip the config sets: their entropy, in bits
    percentile: dict[int, int]  # bits -> the values of that many bits clipped by the percentile search
    raw_bytes: float  # scales and the tensors kept in floating point
    eval: dict[str, dict[str, float]]  # eval_work


def features(cfg: Config, hw: Hardware, tokens: int) -> Features:
    """What `cfg` computes, keeps and stores on `hw`, with `tokens` of validation text."""
    fixed, percentile, raw = 0.0, Counter[int](), 0.0
    bits_of, floors, clips = class_storage(cfg)
    for spec in param_specs(cfg).values():
        n = math.prod(spec.shape)
        bits = bits_of.get(spec.kind, 8)
        if spec.kind == "control" or len(spec.shape) < 2:
            raw += 4 * n
        elif not isinstance(bits, int) or n <= floors[spec.kind]:
            raw += 2 * n
        else:
            raw += 2 * spec.shape[0]  # one fp16 scale a row
            clip = clips[spec.kind]
            if clip:
                fixed += n * gaussian_bits(bits, clip)
            else:
                percentile[bits] += n
    per_gpu = cfg.train_batch_tokens / hw.count
    steps = []
    for _, looped, _ in layouts(cfg):
        costs = token_costs(cfg, looped)
        steps.append([per_gpu * costs[t] for t in STEP_TERMS])
    micro = max(1, cfg.grad_accum_steps // hw.count)
    return Features(
        hw.gpu, steps, micro, memory_parts(cfg, hw), compressor_key(cfg), cfg.quant_format, fixed, dict(percentile), raw,
        eval_work(cfg, tokens, hw),
    )  # fmt: skip


def hw_factor(coef: dict[str, Any], f: Features) -> float:
    return coef["step"]["h200"] if f.gpu == "H200" else 1.0


def predict_steps(coef: dict[str, Any], f: Features) -> list[float]:
    """Milliseconds a step in each training phase."""
    c = coef["step"]
    return [(sum(c[t] * x for t, x in zip(STEP_TERMS, row, strict=True)) + c["step"] * f.micro_steps)
            * hw_factor(coef, f) for row in f.steps]  # fmt: skip


def predict_memory(coef: dict[str, Any], f: Features) -> float:
    c = coef["memory"]
    return c["base"] + c["states"] * f.memory["states"] + c["activations"] * f.memory["activations"]


def entropy_bytes(f: Features, clip: float) -> float:
    return (f.fixed_bits + sum(n * gaussian_bits(b, clip) for b, n in f.percentile.items())) / 8


def predict_bytes(coef: dict[str, Any], f: Features) -> tuple[float, str | None]:
    """The compressed model's bytes, and a note when no record used the compressor."""
    c = coef["bytes"]
    factor, note = c["compressor"].get(f.compressor), None
    if not c["compressor"]:
        return math.nan, "no record logged its artifact's bytes"
    if factor is None:  # priced against a compressor the records used, by their ratio on synthetic values
        name = f.compressor.removeprefix("int8+")
        known = [k for k in c["compressor"] if k.removeprefix("int8+") in c["synthetic"]] or list(
            c["compressor"]
        )
        ref = min(known, key=lambda k: (k.startswith("int8+") != (f.quant_format == "int8"), k != "brotli"))
        measured = name in c["synthetic"] and ref.removeprefix("int8+") in c["synthetic"]
        ratio = c["synthetic"][name] / c["synthetic"][ref.removeprefix("int8+")] if measured else 1.0
        factor = c["compressor"][ref] * ratio
        how = (
            f"x {ratio:.3f}, their ratio on synthetic values"
            if measured
            else "(no measure of theirs: taken as equal)"
        )
        note = f"no record of the table used {f.compressor}: priced as {ref} {how}"
    clip = c["percentile_clip"].get(f.quant_format, 4.0)
    return factor * entropy_bytes(f, clip) + f.raw_bytes, note


def predict_eval(coef: dict[str, Any], f: Features) -> dict[str, float]:
    """Seconds of each evaluation phase ("roundtrip", "sliding", "ttt") and their total."""
    out: dict[str, float] = {}
    for phase, work in f.eval.items():
        c = coef["eval"].get(phase)
        seconds = math.nan if c is None else c["base"] + sum(c[k] * v for k, v in work.items())
        out["ttt" if phase.startswith("ttt") else phase] = seconds * hw_factor(coef, f)
    out["total"] = sum(out.values())
    return out


# --------------------------------------------------------------------------- the plan
@dataclass
class PlanPhase:
    name: str
    ms_per_step: float
    tokens_per_s: float
    steps: int
    seconds: float


@dataclass
class Plan:
    hardware: str
    params: dict[str, int]
    flops_per_token: dict[str, float]
    phases: list[PlanPhase]
    steps: int
    tokens: int
    train_seconds: float
    peak_memory_bytes: int
    gpu_memory_bytes: int
    artifact_bytes: int
    code_bytes: int
    budget_bytes: int
    eval_seconds: dict[str, float]
    eval_limit_seconds: float
    bands: dict[str, float]
    verdict: str
    implementation: str = "records"
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware,
            "implementation": self.implementation,
            "params": self.params,
            "flops_per_token": self.flops_per_token,
            "phases": [vars(p) for p in self.phases],
            "steps": self.steps,
            "tokens": self.tokens,
            "train_seconds": self.train_seconds,
            "peak_memory_bytes": self.peak_memory_bytes,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "artifact_bytes": self.artifact_bytes,
            "code_bytes": self.code_bytes,
            "budget_bytes": self.budget_bytes,
            "eval_seconds": self.eval_seconds,
            "eval_limit_seconds": self.eval_limit_seconds,
            "error_bands": self.bands,
            "verdict": self.verdict,
            "notes": self.notes,
        }


def params_by_class(cfg: Config) -> dict[str, int]:
    counts = dict.fromkeys(KINDS, 0)
    for spec in param_specs(cfg).values():
        counts[spec.kind] += math.prod(spec.shape)
    return {k: v for k, v in counts.items() if v} | {"total": sum(counts.values())}


def train_phases(cfg: Config, ms: list[float]) -> list[PlanPhase]:
    """Each phase with its step time `ms` and the steps it gets: by the wallclock cap (less GPTQ's reserve)
    when there is one, else by `iterations`."""
    phases = layouts(cfg)
    cap = cfg.train_cap_seconds
    out = []
    for i, ((name, _, start), step) in enumerate(zip(phases, ms, strict=True)):
        end = phases[i + 1][2] if i + 1 < len(phases) else 1.0
        if cap > 0:
            seconds = cap * (end - start)
            steps = int(seconds * 1000 / step)
        else:
            steps = round(cfg.iterations * end) - round(cfg.iterations * start)
            seconds = steps * step / 1000
        out.append(PlanPhase(name, step, cfg.train_batch_tokens * 1000 / step, steps, seconds))
    return out


def within(value: float, band: float | None) -> str:
    return f" ±{100 * band:.0f}%" if band else ""


def verdict(plan: Plan, hw_name: str, cfg: Config) -> str:
    """One line: fits, or each limit the plan breaks and by how much (and a warning when a margin is
    inside the backtest's band)."""
    total = plan.artifact_bytes + plan.code_bytes
    broken, close = [], []
    if total > plan.budget_bytes:
        broken.append(f"the byte cap by {total - plan.budget_bytes:,} B ({total:,} > {plan.budget_bytes:,})")
    elif plan.budget_bytes - total < plan.bands.get("bytes", 0) * plan.artifact_bytes:
        close.append(f"{plan.budget_bytes - total:,} B under the cap is inside the bytes band")
    if plan.peak_memory_bytes > plan.gpu_memory_bytes:
        over = (plan.peak_memory_bytes - plan.gpu_memory_bytes) / 2**30
        broken.append(f"GPU memory by {over:,.1f} GiB")
    if plan.eval_seconds["total"] > plan.eval_limit_seconds:
        broken.append(
            f"the evaluation limit by {plan.eval_seconds['total'] - plan.eval_limit_seconds:,.0f} s"
        )
    elif (
        plan.eval_limit_seconds - plan.eval_seconds["total"]
        < plan.bands.get("eval", 0) * plan.eval_seconds["total"]
    ):
        close.append(f"evaluation {plan.eval_seconds['total']:,.0f} s is within the eval band of the limit")
    if cfg.train_cap_seconds <= 0 and plan.train_seconds > EVAL_LIMIT_SECONDS:
        broken.append(
            f"the 600 s training time by {plan.train_seconds - EVAL_LIMIT_SECONDS:,.0f} s (no wallclock cap)"
        )
    if broken:
        return f"verdict: breaks {'; '.join(broken)} on {hw_name}"
    margin = f"{plan.budget_bytes - total:,} B spare"
    tail = f" (careful: {'; '.join(close)})" if close else ""
    return f"verdict: fits {hw_name}: {plan.steps:,} steps, {margin}, eval {plan.eval_seconds['total']:,.0f} s{tail}"


def speed_factor(table: dict[str, Any], implementation: str) -> float:
    """The step time of `implementation`'s code over the records' (the records': 1)."""
    if implementation == "records":
        return 1.0
    if implementation != "pgolf":
        raise PgolfError(f"plan: unknown implementation {implementation!r} (choose from records, pgolf)")
    factor = table.get("implementation", {}).get("pgolf")
    if factor is None:
        raise PgolfError(
            "plan --implementation pgolf: pgolf's step time against the records' code has not been measured on "
            "a GPU yet (implementation.pgolf in core/runs/plan_table.json); the plan predicts the records' code"
        )
    return float(factor)


def make_plan(
    cfg: Config, hw_name: str, table: dict[str, Any], code_bytes: int, implementation: str = "records"
) -> Plan:
    """The plan of `cfg` on `hw_name` with the fitted `table`, `code_bytes` being its packaged script's."""
    hw = hardware(hw_name)
    coef = table["coefficients"]
    factor = speed_factor(table, implementation)
    f = features(cfg, hw, val_tokens(table.get("val_tokens", {}), cfg))
    phases = train_phases(cfg, [ms * factor for ms in predict_steps(coef, f)])
    model_bytes, note = predict_bytes(coef, f)
    if not math.isfinite(model_bytes):
        raise PgolfError(f"plan: the table holds no record with artifact bytes to predict them from ({note})")
    notes = [note] if note else []
    if hw.count == 1:
        notes.append("1xH100: the 8xH100 fit with eight times the tokens a GPU (no record ran on one GPU)")
    looped = layouts(cfg)[-1][1]
    costs = token_costs(cfg, looped)
    attention = costs["attention"] + costs["attention_varlen"]
    plan = Plan(
        hardware=hw_name,
        params=params_by_class(cfg),
        flops_per_token={
            "matmul": costs["matmul"],
            "attention": attention,
            "total": costs["matmul"] + attention,
        },
        phases=phases,
        steps=sum(p.steps for p in phases),
        tokens=sum(p.steps for p in phases) * cfg.train_batch_tokens,
        train_seconds=sum(p.seconds for p in phases),
        peak_memory_bytes=int(predict_memory(coef, f)),
        gpu_memory_bytes=hw.memory_bytes,
        artifact_bytes=int(model_bytes),
        code_bytes=code_bytes,
        budget_bytes=cfg.budget_bytes,
        eval_seconds=predict_eval(coef, f),
        eval_limit_seconds=EVAL_LIMIT_SECONDS,
        bands=dict(table.get("bands", {})),
        verdict="",
        implementation=implementation,
        notes=notes,
    )
    plan.verdict = verdict(plan, hw_name, cfg)
    return plan


def plan_lines(plan: Plan, table: dict[str, Any]) -> list[str]:
    """The plan as text, each predicted figure with its band."""
    b = plan.bands
    gib = 2**30
    if plan.implementation == "records":
        code = f"the records' training code; pgolf's own: {pgolf_factor_text(table)}"
    else:
        code = f"pgolf's training code: the records' step time {pgolf_factor_text(table)}"
    lines = [f"plan on {plan.hardware} ({code})"]
    lines.append(
        "parameters: "
        + ", ".join(f"{k} {v:,}" for k, v in plan.params.items())
        + f"; FLOPs a token {plan.flops_per_token['total'] / 1e6:,.1f} M"
        + f" (matmul {plan.flops_per_token['matmul'] / 1e6:,.1f} M, attention {plan.flops_per_token['attention'] / 1e6:,.1f} M)"
    )
    for p in plan.phases:
        lines.append(
            f"train {p.name}: {p.ms_per_step:,.1f} ms/step{within(p.ms_per_step, b.get('ms_per_step'))}, "
            f"{p.tokens_per_s / 1e6:,.2f} M tokens/s, {p.steps:,} steps in {p.seconds:,.0f} s"
        )
    lines.append(f"steps: {plan.steps:,}, tokens: {plan.tokens:,} in {plan.train_seconds:,.0f} s of training")
    lines.append(
        f"peak memory: {plan.peak_memory_bytes / gib:,.1f} GiB{within(0, b.get('memory'))} a GPU "
        f"of {plan.gpu_memory_bytes / gib:,.1f} GiB"
    )
    total = plan.artifact_bytes + plan.code_bytes
    lines.append(
        f"bytes: artifact {plan.artifact_bytes:,}{within(0, b.get('bytes'))} + code {plan.code_bytes:,} (exact) = "
        f"{total:,} of {plan.budget_bytes:,}: {plan.budget_bytes - total:+,} B headroom"
    )
    phases = ", ".join(
        f"{k} {v:,.1f} s" if math.isfinite(v) else f"{k} unknown (no record of the table ran it)"
        for k, v in plan.eval_seconds.items()
        if k != "total"
    )
    lines.append(
        f"evaluation: {phases}; total {plan.eval_seconds['total']:,.0f} s{within(0, b.get('eval'))} "
        f"of {plan.eval_limit_seconds:,.0f} s"
    )
    lines += [f"note: {n}" for n in plan.notes]
    lines.append(plan.verdict)
    return lines


def pgolf_factor_text(table: dict[str, Any]) -> str:
    factor = table.get("implementation", {}).get("pgolf")
    if factor is None:
        return "not measured on a GPU yet, so unknown"
    return f"x{factor:.2f} their step time, measured"


# --------------------------------------------------------------------------- in the workflow (sweep, train, runs)
def on_target(device: str, world_size: int) -> bool:
    """Whether a run is on the target machine: eight processes, each on an H100."""
    return world_size == HARDWARE[TARGET].count and HARDWARE[TARGET].gpu in device


_SHORT: dict[str, dict[str, Any]] = {}


def target_summary(cfg: Config) -> dict[str, Any]:
    """The plan of `cfg` on the target, short: ms a step per phase, steps, artifact + code bytes, the verdict
    (or why the target would refuse the config) and whether it breaks a limit there."""
    key = json.dumps(cfg.to_dict(), sort_keys=True)
    if key not in _SHORT:
        nothing = {"hardware": TARGET, "ms_per_step": [], "steps": None, "bytes": None, "breaks": True}
        try:
            checked = cfg.validate(HARDWARE[TARGET].count)
        except PgolfError as exc:
            _SHORT[key] = nothing | {"verdict": f"cannot run there as set: {exc}"}
            return _SHORT[key]
        try:
            plan = make_plan(checked, TARGET, load_table(), code_bytes(checked))
        except PgolfError as exc:
            _SHORT[key] = nothing | {"verdict": f"no plan: {exc}", "breaks": False}
        else:
            _SHORT[key] = {
                "hardware": TARGET,
                "ms_per_step": [round(p.ms_per_step, 1) for p in plan.phases],
                "steps": plan.steps,
                "bytes": plan.artifact_bytes + plan.code_bytes,
                "verdict": plan.verdict.removeprefix("verdict: "),
                "breaks": plan.verdict.startswith("verdict: breaks"),
            }
    return _SHORT[key]


def target_line(cfg: Config) -> str:
    """One line for a run away from the target: the plan's verdict there, with its step time."""
    short = target_summary(cfg)
    ms = "/".join(f"{m:,.1f}" for m in short["ms_per_step"])
    pace = f" at {ms} ms/step" if ms else ""
    return f"plan on {TARGET}{pace} (the records' code; cli.py plan for every figure): {short['verdict']}"
