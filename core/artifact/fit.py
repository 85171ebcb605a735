"""Fit the artifact to a byte cap: the artifact settings with the lowest calibration loss whose
artifact + code bytes stay within the cap (`export --fit-bytes`, `artifact_fit_bytes`).

What is searched: each tensor class's bits (5-8, or fp16), clip (its `*_clip_sigmas`: the
class's default rule or SDClip at a few k) and floor (its `*_passthrough_numel`: its tensors of at
most that many values stay in fp16; the records' 65,536 or one of SEARCH_FLOORS below it, so that
a small model's matrices can be quantized too), GPTQ on or off, LQER off or on with its
`lqer_top_k` and `lqer_rank`, and the compressor with its byte shuffle. Every candidate is a Config,
so the chosen one is a config a run can be given again, and its artifact is what `export_artifact`
writes for it.

The search is cheap: real evaluations (quantize, compress, score) are few, and a model of size and
loss chooses what to evaluate.
- Compressor: the base settings' model compressed with each choice (pergroup among them where the lrzip
  program is installed); the smallest wins (the loss does not depend on it). Its ratio of real bytes
  to the model's entropy is the size model's scale.
- Size: per class and setting, the order-0 entropy of the stored bytes (each byte lane of the values,
  scales and fp16 tensors on its own), quantized with per-row rounding: compressed size follows it.
  Each tensor is priced once per bits and clip, and once kept in fp16; a floor sums the one or the
  other, tensor by tensor (entropy and error are sums over the tensors).
- Loss: per class and setting, the rounding error weighted by the diagonal of its layer's input
  Hessian (GPTQ's calibration; 1 where there is none), normalised to mean 1: sum (W - Q)^2_ij h_j.
  One real evaluation per class (the class at its coarsest setting, the rest as the base) turns
  that into nats of calibration loss.
- Choice: the combinations of the classes' settings are priced by the two models. Both are sums over
  the classes, so a setting another of its class beats in both size and error is never best, and
  the classes are joined one at a time, each join cut to the combinations no other beats in both
  (a few hundred, of millions); the one predicted lowest in loss within the cap is evaluated for
  real. If it does not fit, the size model was wrong by the overshoot: the cap is lowered by it,
  said in the log, and the next is tried. Then, one class at a time, the winner with that class at
  the two settings of its frontier predicted best that fit; then GPTQ is toggled on the winner, one
  real evaluation. (GPTQ on or off is first decided on the base settings, one more real evaluation,
  and kept for the trials between.)
- LQER: on each of the LQER_BASES candidates scored lowest that fit, every (top_k, rank) is priced
  from that candidate's own rounding: the errors LQER would correct (largest first, as it does), each
  one's SVD once, its factors at each rank packed as the artifact stores them; their entropy (times
  the ratio, plus each matrix's share of the container, measured once by two compressions) is the
  bytes they add, their weighted error taken off (times the class's nats) the loss.
  In the order of their predicted loss, settings predicted to fit are evaluated for real until
  LQER_TRIALS fit (at most twice as many tried: one over the cap is not scored).
- The uniform settings (every class at the same bits and floor: per bits, the base's floors or the
  highest of SEARCH_FLOORS predicted to fit) are evaluated too, for the table. The result is the
  evaluated candidate with the lowest loss among those whose real bytes fit; none: one error line
  (nothing is written by this module).

The calibration loss is a callable (weights -> mean nats per token), so that this module needs no
framework: core/train/fitting.py scores it with a backend on tokens from the training data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.artifact.export import (
    artifact_blob,
    class_bits,
    class_clips,
    class_floors,
    lqer_settings,
    quantize_mixed_for,
)
from core.artifact.lqer import LqerSettings, correction, factors, ranked_errors
from core.artifact.mixed import MixedModel, add_lqer, dequantize_mixed, quantize_mixed
from core.artifact.quantized import KEEP_FLOAT_MAX_NUMEL
from core.common import compress
from core.common.compress import lrzip_installed
from core.common.errors import PgolfError
from core.config.fields import Config
from core.model.params import artifact_classes

__all__ = ["FIT_FIELDS", "Fit", "Trial", "default_compression", "entropy_bytes", "fit_artifact"]

SEARCH_BITS = (5, 6, 7, 8, 16)  # 16: the class kept in fp16
SEARCH_SIGMAS = (0.0, 6.0, 10.0, 14.0)  # 0: the class's default clip rule
# Each class's floor: its tensors of at most this many values stay in fp16 (the records: 65,536).
SEARCH_FLOORS = (65_536, 32_768, 16_384, 8_192, 4_096, 2_048, 1_024)
# (compressor, byte shuffle) pairs tried besides the base config's own; pergroup where lrzip is installed.
COMPRESSION = (("brotli", 2), ("zstd", 2), ("lzma", 2), ("brotli", 0))
PERGROUP = (compress.PERGROUP, 2)
# Each searched class: its bits field, its clip field ("other" follows matrix_clip_sigmas) and its
# floor field.
CLASS_FIELDS = {
    "embedding": ("embed_bits", "embed_clip_sigmas", "embed_passthrough_numel"),
    "attention": ("attn_bits", "attn_clip_sigmas", "attn_passthrough_numel"),
    "mlp": ("mlp_bits", "mlp_clip_sigmas", "mlp_passthrough_numel"),
    "other": ("other_bits", None, "other_passthrough_numel"),
}
# Every field a fit may set: what its config file carries over the run's own.
FIT_FIELDS = (
    "quant_format", "embed_bits", "attn_bits", "mlp_bits", "other_bits", "embed_clip_sigmas",
    "attn_clip_sigmas", "mlp_clip_sigmas", "embed_passthrough_numel", "attn_passthrough_numel",
    "mlp_passthrough_numel", "other_passthrough_numel", "gptq_enabled", "lqer_enabled", "lqer_top_k", "lqer_rank",
    "compressor", "byte_shuffle",
)  # fmt: skip
MAX_STEPS_DOWN = 4
REFINE = 2  # settings per class tried around the winner
LQER_RANKS = (2, 4, 8)  # besides the base config's lqer_rank; top_k: 1, 2, 4, ... and every matrix
LQER_BASES = 3  # the candidates scored lowest that fit, each priced with every LQER setting
LQER_TRIALS = 2  # the LQER settings predicted best that fit, scored for real
# Code bytes vary by a few with the settings written into the script, by a module's with GPTQ or LQER
# (the size model counts GPTQ's once decided on; each trial measures its own candidate's).
CODE_SLACK = 64

Loss = Callable[[dict[str, np.ndarray]], float]
Log = Callable[[str], None]


@dataclass
class Trial:
    """One candidate evaluated for real (or priced only, when `bytes` is None)."""

    label: str
    changes: dict[str, Any]  # what it changes from the base config
    kind: str  # base, gptq-base, probe, uniform, fit, step-down, smallest, refine, gptq, lqer
    predicted_bytes: int  # artifact + code, by the size model
    bytes: int | None = None  # artifact + code, measured
    loss: float | None = None  # calibration loss, nats per token
    cap: int = 0

    @property
    def fits(self) -> bool:
        return self.bytes is not None and self.bytes <= self.cap

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label, "kind": self.kind, "changes": self.changes,
            "predicted_bytes": self.predicted_bytes, "bytes": self.bytes, "fits": self.fits, "loss": self.loss,
        }  # fmt: skip


@dataclass
class Fit:
    cap: int
    float_loss: float  # the calibration loss of the weights before quantization
    trials: list[Trial]
    chosen: Trial
    cfg: Config  # the base config with the chosen settings (artifact_fit_bytes off)
    model: MixedModel  # the chosen artifact's quantized model
    notes: list[str] = field(default_factory=list)  # the steps down, said in the log too
    # Per class: the settings priced by the models (bits x clip x floor) and those on its frontier.
    priced: dict[str, list[int]] = field(default_factory=dict)
    seconds: float = 0.0  # the search's wall time

    def to_json(self) -> dict[str, Any]:
        return {
            "cap": self.cap,
            "float_loss": self.float_loss,
            "chosen": self.trials.index(self.chosen),
            "settings": {k: getattr(self.cfg, k) for k in FIT_FIELDS},
            "notes": self.notes,
            "priced": self.priced,
            "seconds": round(self.seconds, 1),
            "trials": [t.to_json() for t in self.trials],
        }


def entropy_bytes(arrays: list[np.ndarray]) -> float:
    """The order-0 entropy of the arrays' bytes, in bytes: each byte lane (the low bytes of fp16
    values apart from their high bytes) counted on its own, as a byte shuffle lays them out."""
    total = 0.0
    for a in arrays:
        if a.size == 0:
            continue
        lanes = np.ascontiguousarray(a).reshape(-1).view(np.uint8).reshape(-1, max(a.itemsize, 1))
        for lane in lanes.T:
            p = np.bincount(lane, minlength=256) / lane.size
            p = p[p > 0]
            total += lane.size * float(-(p * np.log2(p)).sum()) / 8
    return total


@dataclass(frozen=True)
class Option:
    """One setting of one class, priced: its entropy bytes and weighted error."""

    changes: tuple[tuple[str, Any], ...]
    entropy: float
    error: float


def _label(cfg: Config, largest: dict[str, int]) -> str:
    """A candidate in log lines: per searched class (`largest`: its largest tensor's size) its bits,
    its SDClip k, and its floor where it is not the records' ("mlp:int6>4096": the MLP tensors of
    more than 4,096 values at 6 bits, the others fp16); "fp16" where it quantizes none."""
    bits, clips, floors = class_bits(cfg), class_clips(cfg), class_floors(cfg)
    parts = []
    for cls, size in largest.items():
        b = bits[cls]
        if b == "fp16" or floors[cls] >= size:
            parts.append(f"{cls[:4]}:fp16")
            continue
        text = f"{cls[:4]}:int{b}"
        if clips[cls].kind == "sdclip":
            text += f"@{clips[cls].k:g}σ"
        if floors[cls] != KEEP_FLOAT_MAX_NUMEL:
            text += f">{floors[cls]}"
        parts.append(text)
    extras = ["gptq"] * cfg.gptq_enabled + [f"lqer:k{cfg.lqer_top_k}r{cfg.lqer_rank}"] * cfg.lqer_enabled
    shuffle = f"+shuffle{cfg.byte_shuffle}" if cfg.byte_shuffle else ""
    return " ".join(parts + extras + [cfg.compressor + shuffle])


def _searched_classes(
    params: dict[str, np.ndarray], classes: dict[str, str], cfg: Config
) -> dict[str, list[str]]:
    """The classes with a float tensor the mixed format can quantize (larger than the lowest floor
    searched, or than `cfg`'s), each with all its float tensors (those kept in fp16 priced too)."""
    out: dict[str, list[str]] = {}
    for name, w in sorted(params.items()):
        if classes[name] in CLASS_FIELDS and np.issubdtype(w.dtype, np.floating):
            out.setdefault(classes[name], []).append(name)
    floors = class_floors(cfg)
    return {
        cls: out[cls]
        for cls in CLASS_FIELDS
        if cls in out and max(params[n].size for n in out[cls]) > min(*SEARCH_FLOORS, floors[cls])
    }


def _pareto(items: list, loss: Callable[[Any], float], size: Callable[[Any], float]) -> list:
    """The items no other beats in both loss and size (of equals, the first), in order of loss."""
    out, smallest = [], math.inf
    for item in sorted(items, key=lambda x: (loss(x), size(x))):  # stable: of equals, the first
        if size(item) < smallest:
            out.append(item)
            smallest = size(item)
    return out


def _weighted(error: np.ndarray, h: np.ndarray | None) -> float:
    """sum (error^2)_ij h_j, h the diagonal of the input Hessian normalised to mean 1 (1 without one)."""
    err = np.square(np.asarray(error, np.float64))
    if h is not None and err.ndim == 2 and h.shape == (err.shape[1], err.shape[1]):
        d = np.diagonal(h).astype(np.float64)
        err = err * (d / d.mean() if d.mean() > 0 else 1.0)
    return float(err.sum())


def stored_arrays(model: MixedModel) -> list[np.ndarray]:
    """Every array a mixed model stores."""
    parts = (model.quantized, model.scales, model.passthrough)
    return [a for part in parts for a in part.values()] + [a for f in model.lqer.values() for a in f.values()]


def with_lqer(model: MixedModel, state: dict[str, np.ndarray], lqer: LqerSettings | None) -> MixedModel:
    """`model` (made of `state`) with the LQER corrections `lqer` asks for instead of any it has
    (None: none). The arrays are the model's own, not copies."""
    info = {name: {k: v for k, v in i.items() if k != "lqer"} for name, i in model.info.items()}
    out = MixedModel(dict(model.quantized), dict(model.scales), dict(model.passthrough), info=info)
    return add_lqer(out, state, lqer) if lqer is not None else out


def _weighted_error(
    model: MixedModel, params: dict[str, np.ndarray], hessians: dict[str, np.ndarray]
) -> float:
    back = dequantize_mixed(model)
    return sum(_weighted(np.asarray(params[n], np.float64) - w, hessians.get(n)) for n, w in back.items())


class _Search:
    def __init__(self, params, cfg, dtypes, cap, loss, code_bytes, hessians, log, compression):
        self.params, self.dtypes, self.cap, self.compression = params, dtypes, cap, compression
        self.loss_of, self.code_bytes, self.log = loss, code_bytes, log
        self.hessians = hessians or {}
        self.base = cfg.replace(quant_format="mixed", artifact_fit_bytes=0).validate()
        self.classes = artifact_classes(self.base)
        self.groups = _searched_classes(params, self.classes, self.base)
        self.largest = {cls: max(params[n].size for n in names) for cls, names in self.groups.items()}
        self.trials: list[Trial] = []
        self.made: dict[tuple[str, int], Trial] = {}  # (artifact's SHA-256, bytes with code): its trial
        self.kept: list[tuple[Trial, MixedModel]] = []  # the LQER_BASES scored lowest that fit
        self.notes: list[str] = []
        self.decided: dict[str, Any] = {}  # GPTQ on or off, once the base settings have shown which is better

    def say(self, line: str) -> None:
        if self.log is not None:
            self.log(f"fit: {line}")

    @property
    def best(self) -> tuple[Trial, MixedModel] | None:
        return self.kept[0] if self.kept else None

    # ------------------------------------------------------------ real trials
    def trial(
        self, changes: dict[str, Any], kind: str, predicted: float, model: MixedModel | None = None
    ) -> Trial:
        """The candidate `changes` make, evaluated (`model`: its quantized model, when already made)."""
        changes = self.decided | changes
        cfg = self.base.replace(**changes)
        for t in self.trials:
            if self.base.replace(**t.changes) == cfg:
                return t
        if model is None:
            model = quantize_mixed_for(self.params, cfg, self.dtypes, self.hessians)
        blob = artifact_blob(model, cfg)
        total = len(blob) + self.code_bytes(cfg)
        made = (hashlib.sha256(blob).hexdigest(), total)
        if made in self.made:  # other settings, the same artifact (floors above every tensor): scored once
            return self.made[made]
        t = Trial(_label(cfg, self.largest), changes, kind, round(predicted), total, cap=self.cap)
        self.made[made] = t
        if t.fits or kind in ("base", "gptq-base", "probe"):  # a loss where it may be chosen, or is needed
            t.loss = float(self.loss_of(dequantize_mixed(model)))
            if not math.isfinite(t.loss):
                raise PgolfError(f"fit: the calibration loss of {t.label} is {t.loss}")
        self.trials.append(t)
        loss = "-" if t.loss is None else f"{t.loss:.5f}"
        self.say(f"{kind:<9} {t.label}: {t.bytes:,} B ({'fits' if t.fits else 'over'}), loss {loss}")
        if t.fits and t.loss is not None:  # sorted stably: the first of equals stays first
            self.kept = sorted([*self.kept, (t, model)], key=lambda tm: self._key(tm[0]))[:LQER_BASES]
        return t

    @staticmethod
    def _key(t: Trial) -> tuple[float, int]:
        return (t.loss, t.bytes)  # type: ignore[return-value]

    # ---------------------------------------------------------- size and loss models
    def pick_compression(self) -> None:
        """The compressor and shuffle that make the base model smallest; the size model's ratio."""
        model = quantize_mixed_for(self.params, self.base, self.dtypes)
        sizes = {}
        for comp, shuffle in ((self.base.compressor, self.base.byte_shuffle), *self.compression):
            try:
                sizes[(comp, shuffle)] = len(
                    artifact_blob(model, self.base.replace(compressor=comp, byte_shuffle=shuffle))
                )
            except PgolfError:  # a compressor whose package is not installed
                continue
        (comp, shuffle), size = min(sizes.items(), key=lambda kv: (kv[1], kv[0]))
        self.base = self.base.replace(compressor=comp, byte_shuffle=shuffle)
        self.ratio = size / entropy_bytes(stored_arrays(model))
        self.base_entropy = entropy_bytes(stored_arrays(model))
        self.code = self.code_bytes(self.base) + CODE_SLACK
        self.say(
            f"compressor {comp}"
            + (f"+shuffle{shuffle}" if shuffle else "")
            + f": {size:,} B for the base settings"
        )

    def price(self, name: str, cfg: Config) -> tuple[float, float]:
        """Tensor `name` as `cfg` stores it (rounded per row): its entropy bytes and weighted error."""
        model = quantize_mixed(
            {name: self.params[name]}, self.classes, class_bits(cfg), class_clips(cfg), None, self.dtypes,
            floors=class_floors(cfg),
        )  # fmt: skip
        return entropy_bytes(stored_arrays(model)), _weighted_error(
            model, {name: self.params[name]}, self.hessians
        )

    def price_options(self) -> None:
        """Each class's settings with their entropy and weighted error (per-row rounding): each tensor
        priced once per bits and clip, quantized and kept in fp16; a floor sums the one or the other."""
        self.options: dict[str, list[Option]] = {}
        self.frontier: dict[str, list[Option]] = {}  # the options no other beats in size and error
        self.base_option: dict[str, Option] = {}
        self.base_clip: dict[str, tuple[tuple[str, Any], ...]] = {}
        self.base_floor: dict[str, int] = {}
        for cls, names in self.groups.items():
            bits_field, clip_field, floor_field = CLASS_FIELDS[cls]
            base_bits = class_bits(self.base)[cls]
            base_bits = 16 if base_bits == "fp16" else base_bits
            base_k = getattr(self.base, clip_field) if clip_field else None
            base_floor = getattr(self.base, floor_field)
            sigmas = sorted({*SEARCH_SIGMAS, base_k}) if clip_field else [None]
            floors = sorted({*SEARCH_FLOORS, base_floor}, reverse=True)
            kept = {n: self.price(n, self.base.replace(**{bits_field: 16})) for n in names}
            options, rounded = [], {}
            settings = [(b, k, f) for b in SEARCH_BITS if b != 16 for k in sigmas for f in floors]
            for b, k, f in [(base_bits, base_k, base_floor), *settings, (16, None, None)]:
                if b == 16:
                    changes: tuple[tuple[str, Any], ...] = ((bits_field, 16),)
                    entropy, error = (sum(p[i] for p in kept.values()) for i in (0, 1))
                else:
                    clip = ((clip_field, k),) if clip_field else ()
                    changes = ((bits_field, b), *clip, (floor_field, f))
                    if (b, k) not in rounded:
                        cfg = self.base.replace(**{bits_field: b, floor_field: 0, **dict(clip)})
                        rounded[b, k] = {n: self.price(n, cfg) for n in names}
                    chosen = [rounded[b, k][n] if self.params[n].size > f else kept[n] for n in names]
                    entropy, error = (sum(p[i] for p in chosen) for i in (0, 1))
                if all(o.changes != changes for o in options):
                    options.append(Option(changes, entropy, error))
            self.base_option[cls] = options[0]
            self.base_clip[cls] = ((clip_field, base_k),) if clip_field else ()
            self.base_floor[cls] = base_floor
            self.options[cls] = options
            self.frontier[cls] = _pareto(options, lambda o: o.error, lambda o: o.entropy)

    def option(self, cls: str, bits: int, floor: int | None = None) -> Option:
        """Class `cls` at `bits`, its clip as the base's, its floor `floor` (None: the base's)."""
        bits_field, _, floor_field = CLASS_FIELDS[cls]
        want: tuple[tuple[str, Any], ...] = ((bits_field, bits),)
        if bits != 16:
            want += (*self.base_clip[cls], (floor_field, self.base_floor[cls] if floor is None else floor))
        return next(o for o in self.options[cls] if o.changes == want)

    def predicted_bytes(self, combo: dict[str, Option]) -> float:
        entropy = self.base_entropy + sum(o.entropy - self.base_option[c].entropy for c, o in combo.items())
        return self.ratio * entropy + self.code

    def calibrate_losses(self, base_loss: float) -> None:
        """nats per unit of weighted error, per class: one real evaluation with the class at the
        setting farthest from the base (its clip as the base's)."""
        self.scale: dict[str, float] = {}
        for cls, options in self.options.items():
            base = self.base_option[cls]
            probe = max(options, key=lambda o: (abs(o.error - base.error), o.changes))
            combo = {c: (probe if c == cls else self.base_option[c]) for c in self.options}
            t = self.trial(dict(probe.changes), "probe", self.predicted_bytes(combo))
            delta = probe.error - base.error
            self.scale[cls] = max((t.loss - base_loss) / delta, 0.0) if delta else 0.0

    def predicted_loss(self, combo: dict[str, Option]) -> float:
        return sum(self.scale[c] * (o.error - self.base_option[c].error) for c, o in combo.items())

    def combos(self) -> list[tuple[float, float, dict[str, Option]]]:
        """The combinations of the classes' settings that no other beats in both predicted loss and
        bytes, in order of loss: (predicted loss change, bytes, combination). Loss and bytes are sums
        over the classes, so the classes are joined one at a time, each join cut to its frontier."""
        joined: list[tuple[float, float, dict[str, Option]]] = [(0.0, 0.0, {})]
        for cls, options in self.frontier.items():
            base = self.base_option[cls]
            joined = _pareto(
                [
                    (loss + self.scale[cls] * (o.error - base.error), entropy + o.entropy - base.entropy, combo | {cls: o})
                    for loss, entropy, combo in joined
                    for o in options
                ],
                lambda x: x[0], lambda x: x[1],
            )  # fmt: skip
        return [(loss, self.predicted_bytes(combo), combo) for loss, _, combo in joined]

    def combo_of(self, changes: dict[str, Any]) -> dict[str, Option]:
        """The classes' settings a trial's changes make (the base's where it changes none)."""
        out = {}
        for cls, options in self.options.items():
            bits_field, clip_field, floor_field = CLASS_FIELDS[cls]
            bits = changes.get(bits_field, self.base_option[cls].changes[0][1])
            want: tuple[tuple[str, Any], ...] = ((bits_field, bits),)
            if clip_field and bits != 16:
                want += ((clip_field, changes.get(clip_field, getattr(self.base, clip_field))),)
            if bits != 16:
                want += ((floor_field, changes.get(floor_field, self.base_floor[cls])),)
            out[cls] = next((o for o in options if o.changes == want), self.base_option[cls])
        return out

    def refine(self) -> None:
        """One class at a time, the winner with that class at each of the REFINE settings predicted
        lowest in loss and to fit (the others as the winner's; settings another beats in both size
        and error left out, and those priced the same as the winner's): a few more real trials."""
        for cls in list(self.options):
            winner = self.best[0]  # type: ignore[index]
            combo = self.combo_of(winner.changes)
            same = (combo[cls].entropy, combo[cls].error)
            priced = []
            for o in self.frontier[cls]:
                trial = combo | {cls: o}
                if (o.entropy, o.error) != same and self.predicted_bytes(trial) <= self.cap:
                    priced.append((self.predicted_loss(trial), o.changes, trial))
            for _, _, trial in sorted(priced, key=lambda x: x[:2])[:REFINE]:
                self.trial(winner.changes | self.changes(trial), "refine", self.predicted_bytes(trial))

    @staticmethod
    def changes(combo: dict[str, Option]) -> dict[str, Any]:
        return dict(kv for o in combo.values() for kv in o.changes)

    def lqer_prices(self, t: Trial, model: MixedModel) -> dict[tuple[int, int], tuple[float, float]]:
        """Each LQER setting (top_k, rank) on `t`'s rounding ((0, 0): off): the bytes its factors add
        and the calibration loss they take off, by the size and loss models."""
        cfg = self.base.replace(**t.changes)
        dtypes = {name: info["dtype"] for name, info in model.info.items()}
        errors = ranked_errors(self.params, model.quantized, model.scales, dtypes)
        n = len(errors)
        top_ks = {*(2**i for i in range(n.bit_length()) if 2**i < n), n, min(cfg.lqer_top_k, n)}
        ranks = sorted({*LQER_RANKS, cfg.lqer_rank})
        settings = lqer_settings(cfg.replace(lqer_enabled=True))
        prices = {(0, 0): (0.0, 0.0)}
        added, taken = dict.fromkeys(ranks, 0.0), dict.fromkeys(ranks, 0.0)
        for k, (name, error) in enumerate(errors, 1):
            svd = np.linalg.svd(error, full_matrices=False)
            h, nats = self.hessians.get(name), self.scale.get(self.classes[name], 0.0)
            before = _weighted(error, h)
            for rank in ranks:
                _, packed = factors(svd, dataclasses.replace(settings, rank=rank))
                added[rank] += self.ratio * entropy_bytes(list(packed.values())) + self.lqer_each
                taken[rank] += nats * (before - _weighted(error - correction(packed), h))
                if k in top_ks:
                    prices[k, rank] = (added[rank], taken[rank])
        return prices

    def lqer_overhead(self, t: Trial, model: MixedModel) -> float:
        """The bytes each corrected matrix adds besides its factors' entropy (their names and
        descriptions in the container), measured on `t` with every matrix corrected: two compressions."""
        cfg = self.base.replace(**t.changes, lqer_enabled=True)
        full = with_lqer(model, self.params, dataclasses.replace(lqer_settings(cfg), top_k=len(self.params)))
        if not full.lqer:
            return 0.0
        entropy = entropy_bytes([a for f in full.lqer.values() for a in f.values()])
        off = with_lqer(model, self.params, None)
        added = len(artifact_blob(full, cfg)) - len(artifact_blob(off, cfg.replace(lqer_enabled=False)))
        return max(added - self.ratio * entropy, 0.0) / len(full.lqer)

    def lqer(self) -> None:
        """LQER's setting: every (top_k, rank) priced on each kept candidate; the LQER_TRIALS predicted
        lowest in loss that fit, evaluated (on the candidate's own rounding: no new quantization)."""
        self.lqer_each = self.lqer_overhead(*self.best)  # type: ignore[misc]
        self.say(f"LQER: {self.lqer_each:,.0f} B per corrected matrix besides its factors' entropy")
        priced = []
        for t, model in list(self.kept):
            prices = self.lqer_prices(t, model)
            cfg = self.base.replace(**t.changes)
            n = max(k for k, _ in prices)
            own = (min(cfg.lqer_top_k, n), cfg.lqer_rank) if cfg.lqer_enabled and n else (0, 0)
            own_bytes, own_gain = prices.get(own, (0.0, 0.0))
            for (k, rank), (added, taken) in prices.items():
                lqer = (
                    {"lqer_enabled": True, "lqer_top_k": k, "lqer_rank": rank}
                    if k
                    else {"lqer_enabled": False}
                )
                predicted = t.bytes - own_bytes + added
                if (k, rank) != own and predicted <= self.cap:
                    priced.append(
                        (t.loss + own_gain - taken, predicted, t.label, k, rank, t.changes | lqer, model)
                    )
        fitted = 0  # one over the cap costs a compression, not a score: the next is tried
        for _, predicted, *_, changes, model in sorted(priced, key=lambda p: p[:5])[: 2 * LQER_TRIALS]:
            cfg = self.base.replace(**changes)
            t = self.trial(changes, "lqer", predicted, with_lqer(model, self.params, lqer_settings(cfg)))
            fitted += t.fits
            if fitted == LQER_TRIALS:
                break

    # ------------------------------------------------------------ the search
    def run(self) -> Fit:
        started = time.perf_counter()
        float_loss = float(self.loss_of(self.params))
        if not self.groups:
            raise PgolfError(
                "fit: no tensor of this model is large enough to be quantized: nothing to choose"
            )
        self.pick_compression()
        self.price_options()
        base_combo = dict(self.base_option)
        base = self.trial({}, "base", self.predicted_bytes(base_combo))
        if self.hessians:  # GPTQ on or off: decided on the base settings, kept for the rest
            other = self.trial(
                {"gptq_enabled": not self.base.gptq_enabled}, "gptq-base", self.predicted_bytes(base_combo)
            )
            if other.loss < base.loss:
                self.decided, base = {"gptq_enabled": not self.base.gptq_enabled}, other
                self.code = self.code_bytes(self.base.replace(**self.decided)) + CODE_SLACK  # GPTQ's code too
        self.calibrate_losses(base.loss)
        combos = self.combos()
        self.priced = {cls: [len(self.options[cls]), len(self.frontier[cls])] for cls in self.options}
        self.say(
            "priced "
            + ", ".join(f"{cls} {n:,} settings ({f} on its frontier)" for cls, (n, f) in self.priced.items())
            + f"; {len(combos):,} combinations on the joint frontier"
        )
        for b in SEARCH_BITS:  # the uniform settings, at the highest floor the size model says may fit
            for floor in [None, *sorted(SEARCH_FLOORS, reverse=True)] if b != 16 else [None]:
                combo = {c: self.option(c, b, floor) for c in self.options}
                predicted = self.predicted_bytes(combo)
                if predicted <= 1.02 * self.cap:
                    self.trial(self.changes(combo), "uniform", predicted)
                    break
        budget, kind = self.cap, "fit"
        for _ in range(MAX_STEPS_DOWN):
            pick = next((c for c in combos if c[1] <= budget), None)
            if pick is None:
                break
            t = self.trial(self.changes(pick[2]), kind, pick[1])
            if t.fits:
                break
            over = t.bytes - t.predicted_bytes
            budget = min(budget, self.cap - over) - 1
            note = f"the size model was {over:,} B low for {t.label} ({t.bytes - self.cap:,} B over the cap): stepping down"
            self.notes.append(note)
            self.say(note)
            kind = "step-down"
        if self.best is None:  # the smallest artifact the search can make, measured
            smallest = min(combos, key=lambda c: (c[1], c[0]))
            t = self.trial(self.changes(smallest[2]), "smallest", smallest[1])
            if not t.fits:
                raise PgolfError(
                    f"--fit-bytes {self.cap:,}: nothing fits; the smallest artifact of these weights tried "
                    f"({t.label}) is {t.bytes:,} B with its code"
                )
        self.refine()
        winner = self.best[0]  # type: ignore[index]
        if self.hessians:
            gptq = not self.base.replace(**winner.changes).gptq_enabled
            self.decided = {}
            self.trial(winner.changes | {"gptq_enabled": gptq}, "gptq", winner.bytes)
        self.lqer()
        chosen, model = self.best  # type: ignore[misc]
        seconds = time.perf_counter() - started
        self.say(
            f"chosen {chosen.label}: {chosen.bytes:,} B of {self.cap:,}, loss {chosen.loss:.5f} "
            f"(float {float_loss:.5f}); {len(self.trials)} candidates evaluated in {seconds:.0f} s"
        )
        cfg = self.base.replace(**chosen.changes)
        return Fit(
            self.cap,
            float_loss,
            self.trials,
            chosen,
            cfg,
            model,
            self.notes,
            seconds=seconds,
            priced=self.priced,
        )


def default_compression(cfg: Config) -> tuple[tuple[str, int], ...]:
    """The (compressor, byte shuffle) pairs a fit of `cfg` tries besides its own: COMPRESSION, and
    PERGROUP where lrzip is installed; none with `artifact_fit_keep_compressor`."""
    if cfg.artifact_fit_keep_compressor:
        return ()
    return COMPRESSION + ((PERGROUP,) if lrzip_installed() else ())


def fit_cap(cfg: Config) -> int:
    """What the fit aims at: artifact_fit_bytes less artifact_fit_margin (room for other seeds' drift)."""
    cap = cfg.artifact_fit_bytes - cfg.artifact_fit_margin
    if cap <= 0:
        raise PgolfError(
            f"artifact_fit_margin={cfg.artifact_fit_margin:,} leaves nothing of artifact_fit_bytes="
            f"{cfg.artifact_fit_bytes:,} (--fit-margin must be below --fit-bytes)"
        )
    return cap


def fit_artifact(
    params: dict[str, np.ndarray],
    cfg: Config,
    dtypes: dict[str, str],
    cap: int,
    loss: Loss,
    code_bytes: Callable[[Config], int],
    hessians: dict[str, np.ndarray] | None = None,
    log: Log | None = None,
    compression: tuple[tuple[str, int], ...] | None = None,
) -> Fit:
    """The artifact settings with the lowest calibration loss (`loss`: weights -> nats per token)
    whose artifact + code (`code_bytes` of the candidate config) is at most `cap` bytes; `hessians`
    (GPTQ's calibration) weight the rounding errors and allow GPTQ; `compression`: the (compressor,
    byte shuffle) pairs tried besides `cfg`'s (default: `default_compression(cfg)`). See the module docstring; PgolfError when nothing fits."""
    if cap <= 0:
        raise PgolfError(f"--fit-bytes must be positive, got {cap}")
    if compression is None:
        compression = default_compression(cfg)
    return _Search(params, cfg, dtypes, cap, loss, code_bytes, hessians, log, compression).run()
