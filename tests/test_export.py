"""Documents into shards at scale (core/datasets/export.py): the word-by-word encoding against
SentencePiece's own on web-text hazards, for every kind of tokenizer pgolf makes or is given; the
worker processes; the streamed shard writer; the counts of unknown tokens; and `data verify --bytes`
reading the shards a piece at a time, naming the <unk> tokens and the bytes the challenge's tables
drop for them."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sentencepiece import sentencepiece_model_pb2

from core.common.errors import PgolfError
from core.data.shards import read_shard
from core.data.tokenizer import load_tokenizer
from core.datasets import byte_proof, caseops, export
from core.datasets.byte_counts import SPACE, TokenBytes
from core.datasets.byte_proof import verify_bytes
from core.datasets.embedded import paragraphs, read_text, speech_files
from core.datasets.export import BatchEncoder, export_documents
from core.datasets.prepare import prepare_docs
from core.datasets.writers import ShardWriter, train_tokenizer, write_shard
from tests.golden_data import WEB_HAZARDS, with_hazards

PARAGRAPHS = list(paragraphs(read_text(f) for f in speech_files()[:4]))
WORDS = sorted({w for p in PARAGRAPHS[:200] for w in p.split()})


def hazardous(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [with_hazards(PARAGRAPHS[i % len(PARAGRAPHS)], rng, rng.randint(0, 6)) for i in range(n)]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, challenge_dir) -> dict[str, Path]:
    """The kinds of tokenizer: the challenge's sp1024 (no byte fallback), one trained with the challenge's
    recipe (byte fallback), CaseOps' (no normalization, operators as pieces), and one without a "▁"
    piece (encoded document by document)."""
    folder = tmp_path_factory.mktemp("tok")
    texts = PARAGRAPHS[:400]
    trained = train_tokenizer(texts, 400, folder / "trained")
    case = train_tokenizer(
        [caseops.encode(t) for t in texts],
        400,
        folder / "caseops",
        user_symbols=caseops.OPERATORS,
        lossless=True,
    )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(trained.read_bytes())
    next(p for p in proto.pieces if p.piece == SPACE).piece = "\ue000"
    (folder / "nospace.model").write_bytes(proto.SerializeToString())
    return {
        "sp1024": challenge_dir / "fineweb_1024_bpe.model",
        "trained": trained,
        "caseops": case,
        "nospace": folder / "nospace.model",
    }


def expected(sp, texts: list[str], case_ops: bool = False) -> list[int]:
    out = []
    for text in texts:
        out += [sp.bos_id(), *sp.encode(caseops.encode(text) if case_ops else text)]
    return out


def by_words(model: Path, texts: list[str], case_ops: bool = False, cache_words: int = 1 << 17) -> list[int]:
    sp = load_tokenizer(model)
    encode = BatchEncoder(sp.serialized_model_proto(), sp.bos_id(), case_ops, cache_words)
    stream, lengths = encode(texts)
    assert encode.chunks_whole == 0  # every chunk went word by word (where the tokenizer allows it)
    tokens = np.frombuffer(stream, dtype="<u2")
    assert lengths.tolist() == [len(sp.encode(caseops.encode(t) if case_ops else t)) + 1 for t in texts]
    return tokens.tolist()


@pytest.mark.parametrize("kind", ["sp1024", "trained", "caseops", "nospace"])
def test_word_by_word_is_sentencepieces_encoding(tokenizers, kind):
    sp, texts = load_tokenizer(tokenizers[kind]), hazardous(300)
    case_ops = kind == "caseops"
    encode = BatchEncoder(sp.serialized_model_proto(), sp.bos_id(), case_ops)
    assert (encode.anchor is None) == (kind == "nospace")  # a "▁"-less tokenizer is encoded whole
    assert by_words(tokenizers[kind], texts, case_ops) == expected(sp, texts, case_ops)
    # a cache far too small starts over at every chunk of documents, to the same tokens
    assert by_words(tokenizers[kind], texts, case_ops, cache_words=50) == expected(sp, texts, case_ops)


DOCUMENT = st.lists(st.sampled_from(WORDS + WEB_HAZARDS + [" ", "\n", "▁", ""]), max_size=40).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(st.lists(DOCUMENT, min_size=1, max_size=6))
def test_word_by_word_on_any_text(tokenizers, texts):
    for kind in ("sp1024", "trained"):
        assert by_words(tokenizers[kind], texts) == expected(load_tokenizer(tokenizers[kind]), texts)


def test_the_guard_catches_a_wrong_cache(tokenizers):
    sp = load_tokenizer(tokenizers["sp1024"])
    encode = BatchEncoder(sp.serialized_model_proto(), sp.bos_id(), False)
    encode(["the nation"])
    encode.known["nation"] = encode.known["nation"][:-2]  # a word's tokens gone wrong
    with pytest.raises(PgolfError, match="differ from SentencePiece's own"):
        encode(["the nation", "a nation"])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:the tokenizer has no byte fallback")
def test_workers_give_the_same_shards(tokenizers, tmp_path, monkeypatch):
    sp, texts = load_tokenizer(tokenizers["sp1024"]), hazardous(2500, seed=1)
    monkeypatch.setattr(export, "ENCODE_BATCH", 100)  # 25 batches over 2 workers
    alone = export_documents(texts, sp, tmp_path / "alone", 300, 40_000, exact=True, threads=1)
    monkeypatch.setattr(export, "POOL_MIN_DOCS", 0)
    pooled = export_documents(
        texts, sp, tmp_path / "pool", 300, 40_000, exact=True, threads=2, total_docs=2500
    )
    assert alone == pooled and pooled["files_train"] > 2
    names = sorted(p.name for p in (tmp_path / "alone").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "pool").iterdir())
    assert all((tmp_path / "alone" / n).read_bytes() == (tmp_path / "pool" / n).read_bytes() for n in names)
    shards = [n for split in ("val", "train") for n in names if n.startswith(f"fineweb_{split}_0")]
    flat = np.concatenate([read_shard(tmp_path / "pool" / n) for n in shards])
    assert flat.tolist() == expected(sp, texts)
    assert pooled["unknown"] == int((flat == sp.unk_id()).sum()) > 0  # sp1024 has no byte fallback
    assert 0 < pooled["unknown_docs"] < 2500


def test_a_failing_worker_is_one_line(tokenizers, tmp_path, monkeypatch):
    sp = load_tokenizer(tokenizers["sp1024"])
    monkeypatch.setattr(export, "POOL_MIN_DOCS", 0)
    monkeypatch.setattr(export.sys, "executable", "false")  # a worker that exits at once, 1
    with pytest.raises(PgolfError, match=r"^encoding: a worker process stopped \(exit 1\)$"):
        export_documents(["a b"] * 10, sp, tmp_path / "out", 2, 100, threads=2, total_docs=10)
    assert not list((tmp_path / "out").glob(".*.tmp"))


def test_the_shard_writer_spills_as_one_shard_writer_would(tmp_path):
    rng = np.random.default_rng(0)
    pieces = [rng.integers(0, 65536, size=n).astype(np.uint16) for n in (0, 5, 17, 3, 40, 1)]
    writer = ShardWriter(tmp_path / "a", "train", 16)
    for piece in pieces:
        writer.write(piece)
    writer.close()
    flat = np.concatenate(pieces)
    for k in range(4):
        write_shard(tmp_path / "b" / f"fineweb_train_{k:06d}.bin", flat[16 * k : 16 * (k + 1)])
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert writer.files == 5 and names == [f"fineweb_train_{k:06d}.bin" for k in range(5)]
    assert all((tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes() for n in names[:4])
    assert read_shard(tmp_path / "a" / names[4]).tolist() == flat[64:].tolist()
    stopped = ShardWriter(tmp_path / "c", "val", 16)
    stopped.write(flat[:20])
    stopped.discard()  # an error midway: the whole shard stays, the partial one goes
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["fineweb_val_000000.bin"]


def test_the_shard_writer_names_a_folder_it_cannot_write(tmp_path):
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(PgolfError, match=r"cannot write .*file/fineweb_val_000000.bin"):
        ShardWriter(tmp_path / "file", "val", 8).write(np.arange(3))


def test_unknown_tokens_counted_from_the_text_as_from_the_pieces(tokenizers):
    sp = load_tokenizer(tokenizers["sp1024"])
    counter = TokenBytes(sp)
    for text in hazardous(200, seed=2):
        ids = np.array(sp.encode(text))
        pieces = sp.encode_as_pieces(text)
        truth = [
            counter.spelled[i] if i != sp.unk_id() else len(p.replace(SPACE, " ").encode())
            for i, p in zip(ids, pieces, strict=True)
        ]
        assert counter.document_bytes(text, ids).tolist() == truth


# ----------------------------------------------------- <unk>: prepare's warning, verify's counts
@pytest.fixture(scope="module")
def unknown_data(tmp_path_factory, challenge_dir) -> Path:
    """Hazardous documents made a dataset with the challenge's sp1024 (no byte fallback), small shards."""
    folder = tmp_path_factory.mktemp("unk")
    docs = folder / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in hazardous(400, seed=3)), encoding="utf-8")
    with pytest.warns(
        UserWarning, match=r"^the tokenizer has no byte fallback: [\d,]+ <unk> tokens in [\d,]+ of 400 "
    ):
        prepare_docs(docs, folder / "data", "unk", val_docs=150, shard_tokens=4_000,
                     tokenizer=challenge_dir / "fineweb_1024_bpe.model")  # fmt: skip
    return folder / "data"


def test_verify_names_the_unknown_tokens_and_the_bytes_the_tables_drop(unknown_data, challenge_dir):
    sp = load_tokenizer(challenge_dir / "fineweb_1024_bpe.model")
    texts = [
        json.loads(line)["text"] for line in (unknown_data.parent / "docs.jsonl").read_text().splitlines()
    ]
    unknown = docs_with = text = spaces = 0
    for t in texts[:150]:  # the truth from SentencePiece's pieces
        pieces = sp.encode_as_pieces(t)
        runs = [j for j, p in enumerate(pieces) if sp.piece_to_id(p) == sp.unk_id()]
        unknown, docs_with = unknown + len(runs), docs_with + bool(runs)
        text += sum(len(pieces[j].encode()) for j in runs)
        spaces += sum(
            pieces[j + 1].startswith(SPACE) for j in runs if j + 1 < len(pieces) and j + 1 not in runs
        )
    proof = verify_bytes(unknown_data, "unk")
    assert proof.exact and unknown > 20
    assert (proof.unknown, proof.unknown_docs, proof.unknown_text, proof.unknown_spaces) == (
        unknown,
        docs_with,
        text,
        spaces,
    )
    assert proof.tables == proof.text - text - spaces  # <unk> is all the tables get wrong here
    share = -(text + spaces) / proof.text
    assert proof.lines[3] == (
        f"<unk>: {unknown} tokens in {docs_with} documents stand for {text} bytes of characters the tokenizer "
        "has no piece for (no byte fallback); the challenge's tables count them as 0 and drop the space of the "
        f"token after: {text + spaces} bytes, {share:+.2%} against the documents"
    )


def test_verify_reads_the_shards_a_piece_at_a_time(unknown_data, monkeypatch):
    whole = verify_bytes(unknown_data, "unk")
    monkeypatch.setattr(byte_proof, "STORED_PIECE", 7)  # documents across pieces and across shards
    assert verify_bytes(unknown_data, "unk") == whole
    monkeypatch.setattr(export, "POOL_MIN_DOCS", 0)  # encoded by worker processes
    assert verify_bytes(unknown_data, "unk") == whole


def test_no_warning_with_byte_fallback(tokenizers, tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in hazardous(60)), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepare_docs(
            docs, tmp_path / "data", "bf", val_docs=20, shard_tokens=4_000, tokenizer=tokenizers["trained"]
        )
    proof = verify_bytes(tmp_path / "data", "bf")
    assert proof.exact and proof.unknown == 0 and len(proof.lines) == 3
