"""CaseOps: the lossless case transform, the byte sidecar, the embedded CaseOps dataset, and scoring
that counts the sidecar's bytes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.common.errors import PgolfError
from core.data.manifest import dataset_settings, read_manifest
from core.data.shards import find_shards, read_shard
from core.data.tables import byte_tables
from core.data.tokenizer import load_tokenizer
from core.datasets import caseops
from core.datasets.caseops import ALLCAPS, CAPNEXT, ESC, OPERATORS, TITLE, decode, encode, fragment_bytes
from core.datasets.embedded import prepare_sotu, read_text, speech_files, split_documents
from core.datasets.writers import write_shard
from core.eval.bpb import EvalData
from core.eval.plain import evaluate
from core.eval.score import load_eval_data
from core.eval.sliding import evaluate_sliding

GOLDEN = Path(__file__).resolve().parent / "golden" / "record_caseops.json"
LIMIT_DOCS = 20  # the first 20 speeches: 2 validation, 18 train
# Characters where the transform has decisions to make, mixed with arbitrary Unicode.
TRICKY = st.sampled_from([*"aAbBzZ' 1\n\té", *OPERATORS, "\ue000", "\ue005", "É", "😀", "ǅ"])
TEXTS = st.one_of(
    st.text(),
    st.text(TRICKY),
    st.lists(st.one_of(st.text(TRICKY, max_size=4), st.text(max_size=3))).map("".join),
)


# ------------------------------------------------------------------------------- the transform
@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(TEXTS)
def test_decode_inverts_encode_on_any_text(text):
    coded = encode(text)
    assert decode(coded) == text
    assert not any("A" <= ch <= "Z" for ch in coded)  # capitals live in the operators only
    assert coded.lower() == coded or not text.isascii()  # ASCII text becomes lowercase


@settings(max_examples=300, deadline=None)
@given(TEXTS, st.data())
def test_the_bytes_of_any_cut_add_up_to_the_original_text(text, data):
    """However the transformed text is cut into pieces, the pieces' original bytes add up to the text's."""
    coded = encode(text)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(coded)), max_size=8)))
    pieces = [coded[a:b] for a, b in zip([0, *cuts], [*cuts, len(coded)], strict=True)]
    counts = fragment_bytes(pieces)
    assert len(counts) == len(pieces) and min(counts, default=0) >= 0
    assert sum(counts) == len(text.encode("utf-8"))
    # A byte-fallback piece is one raw byte of the text: the same count.
    raw = [bytes([b]) for b in coded.encode("utf-8")]
    assert sum(fragment_bytes(raw)) == len(coded.encode("utf-8"))


def test_the_operators_by_example():
    assert encode("The NASA Launch") == f"{TITLE}the {ALLCAPS}nasa {TITLE}launch"
    assert encode("iPhone OpenAI") == f"i{CAPNEXT}phone {TITLE}open{CAPNEXT}a{CAPNEXT}i"
    assert encode(f"a{TITLE}B") == f"a{ESC}{TITLE}{TITLE}b"
    assert fragment_bytes([ESC, TITLE, TITLE, "b", "É"]) == [0, 3, 0, 1, 2]


@pytest.mark.parametrize(
    ("text", "what"),
    [(f"{TITLE} x", "TITLE at character 0"), (f"ab{ESC}", "ESC at character 2"),
     (f"{ALLCAPS}ab{CAPNEXT}c", "CAPNEXT at character 3"), (f"{ESC}x", "ESC at character 0")],
)  # fmt: skip
def test_an_operator_where_encode_never_puts_one_is_refused(text, what):
    with pytest.raises(PgolfError, match=what):
        decode(text)


# ------------------------------------------------------------------ the records' own functions
def test_the_records_transform_and_byte_counts():
    """The records' lossless_caps.py on 54 strings (tests/golden/make_record_caseops.py): the same
    operators, the same transformed text, and the same original bytes for the pieces the records'
    tokenizer cut it into, so pgolf's CaseOps data reads with the records' tokenizer and theirs with pgolf."""
    golden = json.loads(GOLDEN.read_text(encoding="ascii"))
    assert golden["transform"] == caseops.TRANSFORM and golden["controls"] == list(OPERATORS)
    assert golden["control_ids"] == [4, 5, 6, 7]  # as in pgolf's CaseOps tokenizer (below)
    assert len(golden["cases"]) == 54
    for case in golden["cases"]:
        assert encode(case["text"]) == case["encoded"], case["text"]
        assert decode(case["encoded"]) == case["text"]
        assert fragment_bytes(case["surfaces"]) == case["original_bytes"], case["text"]


# ------------------------------------------------------------------ the embedded CaseOps dataset
@pytest.fixture(scope="module")
def caseops_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("caseops")
    prepare_sotu(root, vocab_size=1024, limit_docs=LIMIT_DOCS, shard_tokens=8_000, case_ops=True)
    return root


def test_the_sidecar_adds_up_to_the_text_and_the_tokens_give_it_back(caseops_data):
    """The accounting: over the validation speeches, each document's sidecar bytes add up to the UTF-8
    bytes of its original text, and its tokens decode and invert to that text exactly."""
    settings_ = dataset_settings("sotu_sp1024_caseops", caseops_data)
    sp = load_tokenizer(settings_["tokenizer_path"])
    assert [sp.id_to_piece(i) for i in range(4, 8)] == list(OPERATORS)  # the records' ids
    folder = Path(settings_["data_path"])
    val_shards, sidecar_shards = find_shards(folder, "val"), find_shards(folder, "val_bytes")
    assert len(val_shards) == len(sidecar_shards) > 1  # several shards: documents cross their boundaries
    tokens = np.concatenate([read_shard(p) for p in val_shards])
    sidecar = np.concatenate([read_shard(p) for p in sidecar_shards])
    assert [len(read_shard(p)) for p in val_shards] == [len(read_shard(p)) for p in sidecar_shards]
    starts = [*np.flatnonzero(tokens == sp.bos_id()), len(tokens)]
    texts = [read_text(f) for f in split_documents(speech_files()[:LIMIT_DOCS])[0]]
    assert len(starts) - 1 == len(texts) == 2
    for text, a, b in zip(texts, starts, starts[1:], strict=False):
        assert sidecar[a] == 0  # BOS
        assert int(sidecar[a:b].sum()) == len(text.encode("utf-8"))
        assert decode(sp.decode(tokens[a + 1 : b].tolist())) == text
    assert int(sidecar.sum()) == sum(len(t.encode("utf-8")) for t in texts)
    # Token by token: 0 for BOS and the operators (no speech writes one literally), 1 for a raw byte,
    # else the piece's own UTF-8 bytes ("▁" a space).
    assert not np.isin(tokens, [7]).any()
    expected = [
        0 if t < 8 else 1 if sp.is_byte(t) else len(sp.id_to_piece(t).replace("\u2581", " ").encode())
        for t in tokens.tolist()
    ]
    assert sidecar.tolist() == expected
    assert not (tokens[1:] <= 7).all() and np.isin(tokens, [4, 5, 6]).any()  # operators do occur


def test_the_manifest_names_the_sidecar_and_dataset_turns_caseops_on(caseops_data):
    manifest = read_manifest(caseops_data)
    (dataset,), (tokenizer,) = manifest["datasets"], manifest["tokenizers"]
    assert dataset["val_bytes_glob"] == f"{dataset['path']}/fineweb_val_bytes_*.bin"
    assert (caseops_data / dataset["path"]) == (caseops_data / "datasets" / "sotu_sp1024_caseops").resolve()
    assert tokenizer["text_transform"] == caseops.TRANSFORM
    assert {n for n in dataset["sha256"] if "val_bytes" in n} == {
        p.name for p in find_shards(caseops_data / dataset["path"], "val_bytes")
    }
    assert dataset_settings("sotu_sp1024_caseops", caseops_data)["caseops_enabled"] is True


def caseops_config(root: Path, **changes):
    from core.config.presets import preset

    found = dataset_settings("sotu_sp1024_caseops", root)
    return preset("smoke").replace(**{**found, "eval_seq_len": 64, **changes})


def test_scoring_counts_the_sidecar(caseops_data):
    cfg = caseops_config(caseops_data)
    data = load_eval_data(cfg)
    sidecar = np.concatenate([read_shard(p) for p in find_shards(cfg.data_path, "val_bytes")])
    n = len(data.tokens)
    assert n < len(sidecar)  # cut to whole sequences, as the tokens are
    assert data.target_bytes.dtype == np.int64 and data.target_bytes.tolist() == [0, *sidecar[1:n].tolist()]
    # The tables would count the operators' 3 bytes each: more bytes than the text has (they are not built).
    tables = byte_tables(load_tokenizer(cfg.tokenizer_path), cfg.vocab_size)
    assert data.tables is None and EvalData(data.tokens, tables).target_bytes.sum() > data.target_bytes.sum()

    class Backend:  # every loss 1 nat: the meters then show which targets and bytes were counted
        rank, world_size = 0, 1

        def __init__(self):
            self.cfg = cfg

        def eval_nll(self, x, y):
            return float(y.size)

        def token_losses(self, x, y):
            return np.ones(x.shape)

        def all_reduce_sum(self, values):
            return values

    plain = evaluate(Backend(), data)
    assert (plain.tokens, plain.nbytes) == (n - 1, data.target_bytes.sum())
    backend = Backend()
    backend.cfg = cfg.replace(eval_stride=16)
    sliding = evaluate_sliding(backend, data)
    assert (sliding.tokens, sliding.nbytes) == (n - 1, data.target_bytes.sum())
    assert plain.val_bpb == pytest.approx((n - 1) / np.log(2) / data.target_bytes.sum())


def test_sidecar_and_setting_must_agree(caseops_data, sotu_dataset, tmp_path):
    with pytest.raises(
        PgolfError, match="caseops_enabled is off, but .* has a validation byte sidecar.*--caseops-enabled"
    ):
        load_eval_data(caseops_config(caseops_data, caseops_enabled=False))
    with pytest.raises(PgolfError, match="caseops_enabled is on, but .* has no validation byte sidecar"):
        load_eval_data(sotu_dataset.config("smoke", caseops_enabled=True))
    # A sidecar shard with fewer entries than its tokens, or none for a shard, is refused by name.
    cfg = caseops_config(caseops_data)
    broken = tmp_path / "broken"
    broken.mkdir()
    for p in Path(cfg.data_path).iterdir():
        (broken / p.name).write_bytes(p.read_bytes())
    write_shard(
        broken / "fineweb_val_bytes_000000.bin", read_shard(broken / "fineweb_val_bytes_000000.bin")[:-1]
    )
    with pytest.raises(
        PgolfError,
        match=r"fineweb_val_bytes_000000.bin must hold one entry per token of fineweb_val_000000.bin",
    ):
        load_eval_data(cfg.replace(data_path=str(broken)))
    (broken / "fineweb_val_bytes_000000.bin").unlink()
    with pytest.raises(PgolfError, match="fineweb_val_bytes_000000.bin must hold one entry per token"):
        load_eval_data(cfg.replace(data_path=str(broken)))


def test_a_tokenizer_that_normalizes_is_refused(caseops_data, sotu_dataset):
    """The sidecar needs tokens that give the text back; the plain sotu tokenizer (NFKC, whitespace
    folded) does not, and making the sidecar with it says where."""
    sp = load_tokenizer(sotu_dataset.tokenizer_path)
    text = "Two  spaces"
    with pytest.raises(PgolfError, match="do not give the text back .*character 4"):
        caseops.token_bytes(caseops.piece_fragments(sp), sp.encode(encode(text)), text)
