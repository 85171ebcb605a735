"""Byte counts for any tokenizer (core/datasets/byte_counts.py), the known ways byte tables miscount,
each with its truth computed from the text, and every scorer of both backends counting those bytes.

Tiny tokenizers (a few hundred pieces trained on a few speeches) and a few dozen documents: the
failure classes reported on the challenge are a tokenizer without a standalone "▁" (a space spelled
by three byte-fallback tokens), byte-fallback tokens for characters of several bytes, a piece that is
only "▁", documents that start with a space, CaseOps, and the challenge's own sp1024 (exact tables).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sentencepiece import sentencepiece_model_pb2

from core.common.errors import PgolfError
from core.config.presets import preset
from core.data.manifest import dataset_settings, file_sha256, read_manifest
from core.data.shards import read_shard
from core.data.tables import byte_tables, stream_bytes
from core.data.tokenizer import load_tokenizer
from core.datasets.byte_counts import SPACE, TokenBytes, normalized_bytes
from core.datasets.byte_proof import verify_bytes
from core.datasets.embedded import paragraphs, read_text, speech_files
from core.datasets.prepare import prepare_docs
from core.datasets.writers import train_tokenizer
from core.eval.score import evaluators, load_eval_data
from tests.support.backends import BACKENDS, busy_params, make_backend
from tests.support.runs import fake_run

VOCAB = 400
MULTIBYTE = [  # accents, CJK, emoji: characters a tiny tokenizer spells with byte-fallback tokens
    "Café naïve Straße, the élan of São Paulo",
    "世界 你好 and 東京 in one line",
    "emoji 😀 🎉 and a flag 🇫🇷 here",
]


def speech_paragraphs(n: int) -> list[str]:
    return list(paragraphs(read_text(f) for f in speech_files()[:3]))[:n]


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> Path:
    """40 documents (speech paragraphs, three of them multi-byte text): the first 12 are validation."""
    texts = speech_paragraphs(37)
    texts[1:1], texts[5:5], texts[9:9] = [MULTIBYTE[0]], [MULTIBYTE[1]], [MULTIBYTE[2]]
    path = tmp_path_factory.mktemp("docs") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def texts_of(docs: Path, n: int = 12) -> list[str]:
    return [json.loads(line)["text"] for line in docs.read_text(encoding="utf-8").splitlines()[:n]]


def without_space_piece(model: Path, out: Path) -> Path:
    """The model with its "▁" piece renamed to a character no text holds: spaces then take bytes."""
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.read_bytes())
    (space,) = [p for p in proto.pieces if p.piece == SPACE]
    space.piece = "\ue000"
    out.write_bytes(proto.SerializeToString())
    return out


@pytest.fixture(scope="module")
def made(docs, tmp_path_factory) -> Path:
    """One data folder: docs_plain (trained by the challenge's recipe) and docs_nospace (the same
    tokenizer without its "▁" piece)."""
    root = tmp_path_factory.mktemp("data")
    prepare_docs(docs, root, "docs_plain", VOCAB, val_docs=12, shard_tokens=3_000)
    model = without_space_piece(root / "tokenizers" / "docs_plain.model", root / "nospace.model")
    prepare_docs(docs, root, "docs_nospace", val_docs=12, shard_tokens=3_000, tokenizer=model)
    return root


def has_sidecar(root: Path, name: str) -> bool:
    entry = next(d for d in read_manifest(root)["datasets"] if d["name"] == name)
    return "val_bytes_glob" in entry and bool(list((root / entry["path"]).glob("fineweb_val_bytes_*.bin")))


def text_truth(sp, texts: list[str]) -> int:
    """The validation text's bytes as the tokenizer encodes it, from the text alone."""
    return sum(len(sp.normalize(t).replace(SPACE, " ").encode("utf-8")) for t in texts)


# ----------------------------------------------------------------------------- the counter
def test_counts_add_up_to_the_normalized_text_and_a_byte_spelled_space_counts_one(made, docs):
    sp = load_tokenizer(made / "nospace.model")
    counter = TokenBytes(sp)
    e2, x96, x81 = (sp.piece_to_id(f"<0x{b:02X}>") for b in SPACE.encode())
    for text in texts_of(docs):
        ids = sp.encode(text)
        counts = counter.document_bytes(text, ids)
        assert (
            int(counts.sum())
            == normalized_bytes(sp, text)
            == len(sp.normalize(text).replace(SPACE, " ").encode())
        )
    ids = sp.encode("a ~")
    assert ids[1:4] == [e2, x96, x81]  # no "▁" piece: the space takes three byte tokens
    assert counter.counts("a ~", ids).tolist() == [1, 1, 0, 0, 1]


def test_byte_fallback_characters_count_their_bytes(made):
    sp = load_tokenizer(made / "tokenizers" / "docs_plain.model")
    counter, tables = TokenBytes(sp), byte_tables(sp, sp.vocab_size())
    for text in MULTIBYTE:
        ids = sp.encode(text)
        assert any(sp.is_byte(i) for i in ids)  # the tiny tokenizer spells some characters by bytes
        counts = counter.document_bytes(text, ids)
        assert int(counts.sum()) == len(text.encode("utf-8"))  # NFKC leaves these as they are
        stream = np.array([sp.bos_id(), *ids])
        assert stream_bytes(stream, tables)[1:].tolist() == counts.tolist()  # the tables are right here


def test_unknown_tokens_count_the_text_they_cover(challenge_dir):
    sp = load_tokenizer(challenge_dir / "fineweb_1024_bpe.model")  # no byte fallback: <unk>
    text = "naïve 世界 ½"
    ids = sp.encode(text)
    assert sp.unk_id() in ids
    counts = TokenBytes(sp).document_bytes(text, ids)
    assert int(counts.sum()) == len(
        sp.normalize(text).replace(SPACE, " ").encode()
    )  # "½" is "1⁄2" after NFKC


# --------------------------------------------------------------------- the failure classes
def test_a_tokenizer_without_a_space_piece_gets_a_sidecar_and_the_stock_tables_overcount(made, docs):
    texts = texts_of(docs)
    sp = load_tokenizer(made / "tokenizers" / "docs_nospace.model")
    proof = verify_bytes(made, "docs_nospace")
    assert proof.exact and proof.scoring == proof.text == text_truth(sp, texts)
    assert proof.tables > proof.text  # each byte-spelled space counted as 3: BPB too good
    assert has_sidecar(made, "docs_nospace")
    assert "challenge tables" in proof.lines[2] and "+" in proof.lines[2]


def test_a_tokenizer_with_exact_tables_needs_no_sidecar(made, docs):
    sp = load_tokenizer(made / "tokenizers" / "docs_plain.model")
    proof = verify_bytes(made, "docs_plain")
    assert proof.exact and proof.scoring == proof.tables == proof.text == text_truth(sp, texts_of(docs))
    assert not has_sidecar(made, "docs_plain")
    assert proof.lines[0] == f"bytes: scoring {proof.text} documents {proof.text}"


def test_a_space_only_piece_and_documents_starting_with_a_space(tmp_path):
    """A tokenizer that keeps whitespace (no NFKC, no folding): a document that opens with spaces starts
    with a piece that is only "▁", whose byte the tables drop after BOS."""
    texts = [" " + t if i % 2 == 0 else "  " + t for i, t in enumerate(speech_paragraphs(24))]
    model = train_tokenizer(texts, 360, tmp_path / "keep", lossless=True, exporter_limits=True)
    sp = load_tokenizer(model)
    assert sp.encode("  We")[0] == sp.piece_to_id(SPACE)  # a piece that is only "▁"
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, text in enumerate(texts):
        (docs / f"{i:03d}.txt").write_text(text, encoding="utf-8")
    prepare_docs(docs, tmp_path / "data", "kept", val_docs=8, shard_tokens=2_000, tokenizer=model)
    proof = verify_bytes(tmp_path / "data", "kept")
    truth = sum(len(t.encode("utf-8")) for t in texts[:8])  # nothing normalized: the raw bytes
    assert proof.exact and proof.scoring == proof.text == proof.raw == truth
    assert proof.tables == truth - 8  # one space dropped at each document's start
    assert has_sidecar(tmp_path / "data", "kept")


def test_caseops_documents(docs, tmp_path):
    prepare_docs(docs, tmp_path, "cased", 320, val_docs=12, shard_tokens=3_000, case_ops=True)
    proof = verify_bytes(tmp_path, "cased")
    assert proof.exact and proof.sidecar
    assert proof.scoring == proof.text == sum(len(t.encode("utf-8")) for t in texts_of(docs))


# prepare warns: some of the training documents hold characters sp1024 has no piece for
@pytest.mark.filterwarnings("ignore:the tokenizer has no byte fallback")
def test_the_challenge_sp1024_on_text_it_covers_needs_no_sidecar(challenge_dir, tmp_path):
    texts = speech_paragraphs(30)
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    model = challenge_dir / "fineweb_1024_bpe.model"
    prepare_docs(docs, tmp_path, "ch", val_docs=10, shard_tokens=5_000, tokenizer=model)
    proof = verify_bytes(tmp_path, "ch")
    sp = load_tokenizer(model)
    assert proof.exact and not proof.sidecar and proof.tables == proof.text == text_truth(sp, texts[:10])


def test_verify_names_where_scoring_and_text_part(made):
    folder = Path(dataset_settings("docs_nospace", made)["data_path"])
    sidecar = sorted(folder.glob("fineweb_val_bytes_*.bin"))[0]
    original, manifest = sidecar.read_bytes(), (made / "manifest.json").read_text()
    try:
        values = read_shard(sidecar).copy()
        values[5] += 1
        from core.datasets.writers import write_shard

        write_shard(sidecar, values)  # as if made so: the manifest records the miscounting sidecar
        entry = json.loads(manifest)
        next(d for d in entry["datasets"] if d["name"] == "docs_nospace")["sha256"][sidecar.name] = (
            file_sha256(sidecar)
        )
        (made / "manifest.json").write_text(json.dumps(entry))
        proof = verify_bytes(made, "docs_nospace")
        assert not proof.exact and proof.scoring == proof.text + 1
        assert proof.difference.startswith("first difference: validation document 0, token 4 (id ")
    finally:
        sidecar.write_bytes(original)
        (made / "manifest.json").write_text(manifest)


# ------------------------------------------------------------------------------- the scorers
SCORING = dict(
    eval_seq_len=16, val_max_tokens=256, ttt_lora_rank=4, ttt_lora_alpha=8.0, ttt_lora_lr=0.01,
    ttt_chunk_size=64, ttt_eval_seq_len=64, ttt_batch_size=4, ttt_grad_steps=1, phased_ttt_prefix_docs=2,
    phased_ttt_num_phases=0, global_ttt_lr=0.05, global_ttt_chunk_tokens=32, global_ttt_batch_seqs=2,
)  # fmt: skip
SCORERS = {  # each scorer (the figure it gives, its settings): plain rows, plain flat, sliding windows, TTT
    "rows": ("plain", {}),
    "flat": (
        "plain",
        dict(eval_protocol="flat", varlen_attn_enabled=True, val_batch_size=128, grad_accum_steps=1),
    ),
    "sliding": ("sliding_window", dict(eval_stride=8)),
    "ttt": ("ttt", dict(ttt_enabled=True)),
}


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_every_scorer_counts_the_texts_bytes(made, docs, backend_name):
    """Every scorer of the backend divides by the validation text's bytes, not by the tables' figure."""
    found = dataset_settings("docs_nospace", made)
    assert found["caseops_enabled"]  # the manifest names the sidecar: scoring counts it
    sp = load_tokenizer(found["tokenizer_path"])
    counter = TokenBytes(sp)
    truth = np.concatenate([[0, *counter.document_bytes(t, sp.encode(t))] for t in texts_of(docs)])
    base = preset("smoke").replace(**found, **SCORING)
    params = busy_params(base, seed=2)
    for name, (figure, changes) in SCORERS.items():
        cfg = base.replace(**changes)
        data = load_eval_data(cfg)
        assert data.tables is None
        backend = make_backend(backend_name, cfg)
        try:
            backend.load_params(params)
            meter = evaluators(cfg)[figure](backend, data)
        finally:
            backend.close()
        n = int(meter.tokens)
        assert n > 100, name
        assert meter.nbytes == truth[1 : n + 1].sum(), name
        tables = byte_tables(sp, cfg.vocab_size)
        assert meter.nbytes < stream_bytes(data.tokens[: n + 1], tables).sum(), name  # the tables' figure


# ------------------------------------------------------------------------------- package
@pytest.mark.slow
def test_package_writes_the_byte_proof_into_the_compliance_section(made, tmp_path):
    from core.config.fields import Config
    from core.runs.package import write_record

    run = fake_run(tmp_path / "run", Config(**dataset_settings("docs_nospace", made)), artifact=10, log="log")
    folder, _ = write_record([run], tmp_path / "rec", "x")
    section = (folder / "README.md").read_text().split("## Compliance", 1)[1]
    proof = verify_bytes(made, "docs_nospace")
    assert "`cli.py data verify docs_nospace --bytes`" in section and "\n".join(proof.lines) in section


def test_data_that_does_not_name_its_documents_is_verified_with_docs_given(made, docs):
    """As for the challenge's published datasets: the documents come with --docs (and --val-docs)."""
    path = made / "manifest.json"
    original = path.read_text()
    manifest = json.loads(original)
    for entry in manifest["datasets"]:
        entry.pop("docs", None)
    try:
        path.write_text(json.dumps(manifest))
        with pytest.raises(PgolfError, match="does not name the documents that made it.*--docs FILE"):
            verify_bytes(made, "docs_plain")
        proof = verify_bytes(made, "docs_plain", docs, 12)
        assert proof.exact and proof.documents == 12
        with pytest.raises(
            PgolfError, match="shards hold 12 documents .* the documents' first 13 were expected"
        ):
            verify_bytes(made, "docs_plain", docs, 13)
    finally:
        path.write_text(original)
