"""Golden numbers for the Muon weight-decay taper of record 2026-04-18, computed by its own functions.

The record's ``train_gpt.py`` is not part of pgolf and is never copied here: this script imports
it from the path in $RECORD_0418 through the loader and stubs of record_code.py. From a
clone of openai/parameter-golf at commit 4908dc46f21ed3fdd08d2fdca285deb2194b9599:

    M=<clone>; C=4908dc46f21ed3fdd08d2fdca285deb2194b9599; R=records/track_10min_16mb
    git -C $M show $C:$R/2026-04-18_PR1626_CaseOps_Taper/train_gpt.py > /tmp/rec0418.py
    RECORD_0418=/tmp/rec0418.py .venv/bin/python tests/golden/make_record_0418.py

The taper is ``wd_mul(training_frac(step, elapsed_ms))``, two closures inside the record's
``train_model``; they are taken from its source (record_code.nested_functions) and run with
the record's WD_TAPER_START_FRAC 0.70 and WD_TAPER_FINAL_MULT 0.50 and a second setting (0.4, 0.0),
by steps (ITERATIONS 100, no cap) and by the clock (the record's 600 s cap less its GPTQ reserve).

Keys: taper/<setting>/step/{step,mul}, taper/<setting>/wall/{elapsed_ms,mul}; settings in the metadata.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_record_features as base
import record_code

record_code.RECORDS["0418"] = ("2026-04-18_PR1626_CaseOps_Taper", "377a126082f76fe7b7b73dd54b5b2bc6b92c704f")
ITERATIONS = 100
SETTINGS = {"record": (0.70, 0.50), "early": (0.4, 0.0)}  # (WD_TAPER_START_FRAC, WD_TAPER_FINAL_MULT)


def main(out_path: Path) -> None:
    record_code.install_stubs()
    rec = record_code.load_record("0418", {})
    h = rec.Hyperparameters()
    capped_ms = 1e3 * h.max_wallclock_seconds - h.gptq_reserve_seconds * 1e3
    out, meta = {}, {"iterations": ITERATIONS, "cap_ms": capped_ms, "settings": SETTINGS}
    for name, (start, final) in SETTINGS.items():

        def table(max_ms, points, start=start, final=final):
            hp = types.SimpleNamespace(
                iterations=ITERATIONS, wd_taper_start_frac=start, wd_taper_final_mult=final
            )
            fns = record_code.nested_functions(
                rec, "train_model", ("training_frac", "wd_mul"), {"h": hp, "max_wallclock_ms": max_ms}
            )
            return np.array([fns["wd_mul"](fns["training_frac"](step, ms)) for step, ms in points])

        steps = np.arange(ITERATIONS + 1)
        out[f"taper/{name}/step/step"] = steps.astype(np.int64)
        out[f"taper/{name}/step/mul"] = table(None, [(int(s), 0.0) for s in steps])
        elapsed = np.arange(0.0, 620001.0, 5000.0)
        out[f"taper/{name}/wall/elapsed_ms"] = elapsed
        out[f"taper/{name}/wall/mul"] = table(capped_ms, [(0, float(ms)) for ms in elapsed])
    base.save_file(out, str(out_path), metadata={"cases": json.dumps(meta)})
    print(f"wrote {out_path}: {len(out)} tensors")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("record_0418.safetensors"))
