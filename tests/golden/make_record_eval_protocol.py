"""Record 2026-04-27's own `eval_val` at several batch geometries and world sizes, for pgolf's flat protocol.

The record's ``train_gpt.py`` is not part of pgolf: it is imported from the path in ``RECORD_0427`` (its
git blob is checked; see make_record_features.py). The records' training logs give the hyperparameters
each one ran with (their ``Hyperparameters:`` block): ``LOG_0401`` and ``LOG_0427`` name one log of
record 2026-04-01 and one of 2026-04-27:

    R=<clone>/records/track_10min_16mb
    RECORD_0427=/tmp/rec0427.py LOG_0401=$R/2026-04-01_Vocab4096_MLPMult4_WD085/train_seed42.log \
        LOG_0427=$R/2026-04-27_SP8192_LQER_SparseGate_BOSSmearFix_9HpStack_1.0611/train_seed42.log \
        .venv/bin/python tests/golden/make_record_eval_protocol.py

CPU, fp32, one thread, seconds. Not run by CI. It writes record_eval_protocol.json beside itself:
- the model: record_eval_0427.ptz (make_record_eval.py), read by the record's ``deserialize`` with
  make_record_eval.ENV_0427 and scored as make_record_eval.main_0427 scores it (fp32 arithmetic, its RoPE
  buffer in bf16, loops on), FlashAttention's varlen kernel being record_code.py's exact
  per-segment SDPA stub;
- the validation tokens: BOS + one paragraph of the speeches per document (documents from under 20 to
  over 200 tokens, so longer and shorter than a segment), and their byte sidecar by the record's tables;
- `cases`: for each geometry (VAL_BATCH_TOKENS, EVAL_SEQ_LEN, GRAD_ACCUM_STEPS) and WORLD_SIZE 1 and 2,
  the val_loss and val_bpb of the record's ``eval_val`` (its ``Hyperparameters`` attributes set to the
  geometry). World size 2 runs both ranks in this one process: each rank's ``eval_val`` with its
  ``h.rank``, and ``torch.distributed`` in the record replaced by a stand-in whose ``all_reduce`` adds the
  other rank's sums (collected by a first pass over the ranks) to this rank's, as the SUM all-reduce
  would; both ranks' results are checked equal. `tokens` is the count the record scored (the
  all-reduced token sum), showing the batches it left out;
- `logged_env`: each record's logged hyperparameters as environment variables (NAME=value, the log's
  ``name: value`` upper-cased; booleans as 1/0, the way its script reads them), for `cli.py eval` given
  only a record's settings.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_record_eval import ENV_0427, TOKENIZER, documents_tokens, load_record_0427, record_val_data  # noqa: E402

VAL_TOKENS = 2600  # validation tokens, 1 + a multiple of nothing in particular: every geometry drops a tail
# (VAL_BATCH_TOKENS, EVAL_SEQ_LEN, GRAD_ACCUM_STEPS): flat batches of 1,024 tokens cut every 128; of 512 cut
# every 64 (two micro-batches); of 768 cut every 96; of 1,536 cut every 128; two rows of 128 (one a rank).
GEOMETRIES = [(1024, 128, 1), (1024, 64, 2), (768, 96, 1), (3072, 128, 2), (256, 128, 1)]
WORLD_SIZES = (1, 2)


def logged_env(path: Path) -> dict[str, str]:
    """The `Hyperparameters:` block of a record's log as environment variables."""
    env: dict[str, str] = {}
    inside = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() == "Hyperparameters:":
            inside = True
            continue
        match = re.fullmatch(r"  (\w+): ?(.*)", line) if inside else None
        if inside and match is None:
            break
        if match:
            value = {"True": "1", "False": "0"}.get(match[2], match[2])
            env[match[1].upper()] = value
    if not env:
        raise SystemExit(f"{path}: no Hyperparameters block")
    return env


class AllReduceStandIn:
    """`torch.distributed` as the record's eval_val uses it, for ranks run one after the other: pass
    "collect" keeps each rank's tensors in call order; pass "sum" adds the other ranks' to this one's."""

    ReduceOp = torch.distributed.ReduceOp

    def __init__(self, world_size: int):
        self.world_size, self.rank, self.mode = world_size, 0, "collect"
        self.kept: dict[int, list[torch.Tensor]] = {r: [] for r in range(world_size)}
        self.calls = 0

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def all_reduce(self, tensor: torch.Tensor, op=None) -> None:
        assert op == self.ReduceOp.SUM
        if self.mode == "collect":
            self.kept[self.rank].append(tensor.clone())
        else:
            for other in range(self.world_size):
                if other != self.rank:
                    tensor += self.kept[other][self.calls]
        self.calls += 1


def main() -> None:
    torch.set_num_threads(1)
    rec = load_record_0427()
    sp = spm.SentencePieceProcessor(model_file=str(TOKENIZER))
    rec.BOS_ID = sp.bos_id()
    val = documents_tokens(sp, VAL_TOKENS)
    luts = rec.build_sentencepiece_luts(sp, 1024, torch.device("cpu"))
    data = record_val_data(luts, val)
    starts = [*np.flatnonzero(val == sp.bos_id()).tolist(), len(val)]
    doc_lengths = np.diff(starts).tolist()

    def scored_model(h) -> torch.nn.Module:
        model = rec.deserialize(h, torch.device("cpu")).float()
        for module in model.modules():
            if isinstance(module, rec.Rotary):
                module.inv_freq = module.inv_freq.bfloat16()
        model.looping_active = True
        return model

    cases = []
    real_dist = rec.dist
    try:
        for batch_tokens, seq_len, accum in GEOMETRIES:
            for world in WORLD_SIZES:
                h = rec.Hyperparameters()
                h.quantized_model_path = str(HERE / "record_eval_0427.ptz")
                h.val_batch_tokens, h.eval_seq_len, h.grad_accum_steps = batch_tokens, seq_len, accum
                h.world_size, h.distributed = world, world > 1
                stand_in = AllReduceStandIn(world)
                rec.dist = stand_in
                results = []
                for mode in ("collect", "sum"):
                    stand_in.mode = mode
                    for rank in range(world):
                        stand_in.rank, stand_in.calls = rank, 0
                        h.rank, h.is_main_process = rank, rank == 0
                        results.append(rec.eval_val(h, torch.device("cpu"), data, scored_model(h)))
                summed = results[world:]
                assert all(r == summed[0] for r in summed), summed
                tokens = sum(float(stand_in.kept[r][1]) for r in range(world))
                case = {
                    "val_batch_tokens": batch_tokens, "eval_seq_len": seq_len, "grad_accum_steps": accum,
                    "world_size": world, "tokens": tokens, "val_loss": summed[0][0], "val_bpb": summed[0][1],
                }  # fmt: skip
                print(case)
                cases.append(case)
    finally:
        rec.dist = real_dist

    logs = {key: Path(os.environ[f"LOG_{key}"]) for key in ("0401", "0427") if os.environ.get(f"LOG_{key}")}
    golden = {
        "env": ENV_0427,
        "val_tokens": val.tolist(),
        "val_bytes": data.val_bytes.tolist(),
        "document_lengths": doc_lengths,
        "cases": cases,
        "logged_env": {key: logged_env(path) for key, path in logs.items()},
        "logs": {key: f"{path.parent.name}/{path.name}" for key, path in logs.items()},
        "sources": {"record": "2026-04-27_SP8192_LQER_SparseGate_BOSSmearFix_9HpStack_1.0611",
                    "torch": torch.__version__},
    }  # fmt: skip
    (HERE / "record_eval_protocol.json").write_text(json.dumps(golden, indent=1) + "\n")


if __name__ == "__main__":
    main()
