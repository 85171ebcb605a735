"""Scoring weights on the validation tokens: the data, and the figures a run reports (`evaluators`).

Each backend scores a span (`eval_nll`) or gives per-token losses (`token_losses`); the plain figure's
two protocols (core/eval/plain.py), sliding windows (core/eval/sliding.py) and
test-time training (core/eval/ttt.py) cut the validation tokens, count their bytes and sum over ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from core.common.errors import PgolfError, hint, setting
from core.config.features import uses_byte_tables, uses_sliding_windows, uses_ttt
from core.data.shards import find_shards, load_val_bytes, load_val_tokens
from core.data.tables import byte_tables
from core.data.tokenizer import check_vocab, load_tokenizer
from core.eval.bpb import BPBMeter, EvalData
from core.eval.plain import evaluate, evaluate_flat
from core.eval.sliding import evaluate_sliding
from core.eval.ttt import evaluate_ttt

if TYPE_CHECKING:  # only annotations name these
    from core.config.fields import Config


def load_eval_data(cfg: Config) -> EvalData:
    """The validation tokens of `cfg.data_path`, with the byte sidecar beside them when
    `caseops_enabled`; a sidecar there without it, or none with it, is refused (either way the
    bytes would not be the text's)."""
    sp = load_tokenizer(cfg.tokenizer_path)
    check_vocab(sp, cfg.vocab_size, cfg.tokenizer_path)
    if (cfg.smear_gate_enabled or cfg.varlen_attn_enabled) and sp.bos_id() != cfg.bos_id:
        what = "SmearGate would smear" if cfg.smear_gate_enabled else "attention would reach"
        raise PgolfError(
            f"bos_id={cfg.bos_id}, but the tokenizer {cfg.tokenizer_path} starts documents with {sp.bos_id()}: "
            f"{what} across document starts (set {setting('bos_id')})"
        )
    files = find_shards(cfg.data_path, "val")
    tokens = load_val_tokens(files, cfg.eval_window, cfg.val_max_tokens, cfg.vocab_size)
    has = any(Path(cfg.data_path).glob("fineweb_val_bytes_*.bin"))
    if has != cfg.caseops_enabled:
        fix = (
            f"set {setting('caseops_enabled', True)}"
            if has
            else hint("data prepare --caseops makes one", "set DATA_PATH to data with one")
        )
        raise PgolfError(
            f"caseops_enabled is {'off' if has else 'on'}, but {cfg.data_path} has {'a' if has else 'no'} "
            f"validation byte sidecar (fineweb_val_bytes_*.bin: each token's bytes, which scoring counts): {fix}"
        )
    if not uses_byte_tables(cfg):  # (the sidecar's there, as checked above)
        return EvalData(tokens, None, load_val_bytes(files, len(tokens)))

    return EvalData(tokens, byte_tables(sp, cfg.vocab_size))


Evaluator = Callable[..., BPBMeter]  # (backend, data, progress=None, sink=None)


def figure_protocol(name: str, cfg: Config) -> str:
    """How figure `name` of `evaluators` was computed, for the logs: rows:<len>, flat:<batch>/<len>
    (record 2026-04-27's batches of <batch> tokens cut every <len>), sliding:<len>/<stride>, ttt."""
    if name == "sliding_window":
        return f"sliding:{cfg.eval_window}/{cfg.eval_stride}"
    if name != "plain":
        return name
    if cfg.eval_protocol == "flat":
        return f"flat:{cfg.val_batch_size // cfg.grad_accum_steps}/{cfg.eval_window}"
    return f"rows:{cfg.eval_window}"


def evaluators(cfg: Config) -> dict[str, Evaluator]:
    """The figures a final score reports: "plain" (non-overlapping sequences: pgolf's rows, or with
    `eval_protocol` flat record 2026-04-27's flat batches), "sliding_window" when `eval_stride` makes the
    windows overlap, and "ttt" with `ttt_enabled`."""
    plain = evaluate_flat if cfg.eval_protocol == "flat" else evaluate
    out: dict[str, Evaluator] = {"plain": plain}
    if uses_sliding_windows(cfg):
        out["sliding_window"] = evaluate_sliding
    if uses_ttt(cfg):
        out["ttt"] = evaluate_ttt
    return out
