"""The artifact fit scores each artifact once (core/artifact/fit.py): candidates whose settings differ but
whose artifact is one already made (every tensor under the floor stays fp16 at any bits) are skipped."""

from __future__ import annotations

from core.artifact.fit import fit_artifact
from core.config.presets import preset
from core.model.params import storage_dtypes
from tests.support.artifacts import NUMPY_CODE_BYTES, stand_in_loss
from tests.support.backends import busy_params


def test_a_candidate_making_an_artifact_already_made_is_not_made_again():
    """Just under the base's bytes the uniform settings at the base's floor keep every smoke tensor in
    fp16 whatever their bits: five candidates identical to the base were listed (and, fitting, scored)."""
    cfg = preset("smoke").replace(compressor="zlib")
    params, dtypes = busy_params(cfg), storage_dtypes(cfg, False)
    lines: list[str] = []
    fit = fit_artifact(params, cfg, dtypes, 265_000, stand_in_loss(params), lambda c: NUMPY_CODE_BYTES,
                       log=lines.append, compression=())  # fmt: skip
    base = fit.trials[0]
    assert base.kind == "base" and base.bytes > 265_000  # the base is over: the search goes on
    assert [t for t in fit.trials if t.label == base.label] == [base]
    assert sum(base.label in line for line in lines) == 1
    made = [(t.label, t.bytes) for t in fit.trials]
    assert len(made) == len(set(made)) and fit.chosen.bytes <= 265_000
