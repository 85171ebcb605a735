"""LoRA adapters for test-time training: their names, shapes and first values, for any framework.

Each adapter is a pair (A, B) per batch row: A (batch, rank, in), B (batch, out, rank), and adds
scale * (x @ A^T) @ B^T to the output of the layer it sits on, scale = alpha / rank (so changing
the rank leaves the learning rate's meaning alone). One set per block visit (a looped layer
counts once per visit) on the queries (`q`), values (`v`) and, as the config says, keys (`k`),
the attention output (`o`, read from the attention's input) and the MLP (`mlp`, read from the
MLP's input); one on the output head (`head`, read from the final hidden state). Rows are
independent: the documents of a batch never share an adapter.

A starts uniform in +-1/sqrt(in) and B at zero, so a fresh adapter changes nothing. The walk
(core/model/walk.py) applies them; core/eval/ttt.py trains them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # names for annotations alone
    from core.config.fields import Config


def adapter_shapes(cfg: Config, batch: int) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """{name: (A shape, B shape)}: "head", then "<target>.<visit>" target by target, visit by visit (the
    loops' too), for the block layers that carry an adapter under this config."""
    d, r, kv = cfg.model_dim, cfg.ttt_lora_rank, cfg.num_kv_heads * cfg.head_dim
    visits = sum(map(len, cfg.layer_layout(True)))
    outputs = {"q": d, "v": kv, "k": kv, "mlp": d, "o": d}  # in the order the adapters are made
    optional = {"k": cfg.ttt_k_lora, "mlp": cfg.ttt_mlp_lora, "o": cfg.ttt_o_lora}
    blocks = {
        f"{target}.{n}": ((batch, r, d), (batch, out, r))
        for target, out in outputs.items()
        if optional.get(target, True)
        for n in range(visits)
    }
    return {"head": ((batch, r, d), (batch, cfg.vocab_size, r)), **blocks}


def initial_a(cfg: Config, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A of each adapter for `batch` rows, float32 uniform in +-1/sqrt(in) (every adapter reads
    model_dim features), drawn in the order of `adapter_shapes`."""
    bound = 1.0 / np.sqrt(cfg.model_dim)
    return {
        name: rng.uniform(-bound, bound, size=a_shape).astype(np.float32)
        for name, (a_shape, _) in adapter_shapes(cfg, batch).items()
    }
