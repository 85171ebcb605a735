"""`data prepare --docs` beside the challenge's exporter, on a documents file of a chosen size.

    .venv/bin/python bench/prepare_scale.py --size 1G --work /tmp/scale \\
        --exporter PATH/download_hf_docs_and_tokenize.py --tokenizer tests/fixtures/challenge/fineweb_1024_bpe.model

It writes `docs.jsonl` of about `--size` bytes under `--work` (kept, and reused when it is already
there at that size): documents of consecutive paragraphs of the embedded corpus's speeches, their
lengths drawn from a log-normal (median 2 KB, mean about 3.3 KB: the challenge's documents average
about 1,270 sp1024 tokens, some 3 KB), with web-text hazards (tests/golden_data.py's WEB_HAZARDS)
written into about one in three: runs of spaces, newlines, tabs, characters NFKC changes, emoji, CJK,
control characters, zero-width and soft-hyphen characters, and a literal "▁". Then it runs the
exporter (`data/download_hf_docs_and_tokenize.py` of openai/parameter-golf, not part of pgolf: its
`build_sentencepiece_tokenizer` and `export_shards`, offline, the model given as its
`--reuse-sp-model` gives it) and `cli.py data prepare`, one after the other, each in its own process,
and prints each one's wall time, CPU time (user and system, all its threads and the child processes
it waited for), peak memory (`measured`), and whether their shards are identical; with a trained
tokenizer (`--vocab-size`, no `--tokenizer`), whether its pieces, scores and types are too.
`--verify` also times `data verify --bytes` on pgolf's dataset. With `--train-memory N,N,...` it
measures instead the peak memory of training the tokenizer as `data prepare` trains it (the
challenge's settings, `--vocab-size` pieces) on the first N documents, for each N.

Other processes on the machine slow the wall time of both; CPU time is the fair comparison.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import itertools
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_docs(path: Path, size: int, seed: int = 0) -> Path:
    """JSON lines of about `size` bytes from the speeches, as this module's docstring says."""
    from core.datasets.embedded import paragraphs, read_text, speech_files
    from tests.golden_data import with_hazards

    paras = list(paragraphs(read_text(f) for f in speech_files()))
    rng = random.Random(seed)
    written = 0
    tmp = path.with_name(path.name + ".part")
    with tmp.open("w", encoding="utf-8") as f:
        while written < size:
            target = min(int(rng.lognormvariate(7.6, 1.0)), 100_000)  # median e^7.6 = 2 KB
            start = rng.randrange(len(paras))
            parts, length = [], 0
            while length < target:
                parts.append(paras[(start + len(parts)) % len(paras)])
                length += len(parts[-1]) + 1
            text = "\n".join(parts)[: max(target, 1)]
            if rng.random() < 0.35:
                text = with_hazards(text, rng, rng.randint(1, 4))
            line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
            f.write(line)
            written += len(line.encode("utf-8"))
    tmp.replace(path)
    return path


def parse_size(text: str) -> int:
    units = {"K": 10**3, "M": 10**6, "G": 10**9}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


# --------------------------------------------------------------------- the exporter, in a child
def run_exporter_child(args: argparse.Namespace) -> None:
    """The exporter's own functions on the documents (this module re-run as a child process)."""
    spec = importlib.util.spec_from_file_location("challenge_exporter", args.exporter)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    work = Path(args.work)
    tok_spec: dict = {"name": "bench", "vocab_size": args.vocab_size}
    if args.tokenizer:
        tok_spec["reuse_model_path"] = str(Path(args.tokenizer).resolve())
    if args.tokenizer_train_docs is not None:
        tok_spec["tokenizer_train_docs"] = args.tokenizer_train_docs
    docs = work / "docs.jsonl"
    tok = module.build_sentencepiece_tokenizer(
        spec=tok_spec, docs_jsonl=docs, tokenizers_dir=work / "exporter" / "tokenizers"
    )
    module.export_shards(
        docs, tok, work / "exporter" / "datasets" / "bench", num_val_docs=args.val_docs,
        shard_size=args.shard_tokens, docs_total=module.count_docs(docs),
    )  # fmt: skip


# --------------------------------------------------------------------- measuring
def measured(command: list[str], label: str) -> dict:
    """Run `command`, its output to a log beside the work files: wall time; CPU time from wait4 (the
    process and the children it waited for: pgolf's encoding workers); peak memory as the sum of each
    process's own peak (VmHWM, read every 0.2 s while they run): an upper bound of the peak of their
    sum, and exactly the peak of a single process."""
    started = time.monotonic()
    peaks: dict[int, int] = {}  # pid -> its VmHWM in KiB, as last seen
    with open(label + ".log", "w") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        watching = threading.Event()
        watcher = threading.Thread(target=_watch, args=(child.pid, peaks, watching))
        watcher.start()
        _, status, usage = os.wait4(child.pid, 0)
        watching.set()
        watcher.join()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{label} failed (exit {os.waitstatus_to_exitcode(status)}): see {label}.log")
    peaks[child.pid] = max(peaks.get(child.pid, 0), usage.ru_maxrss if len(peaks) <= 1 else 0)
    return {
        "wall_s": time.monotonic() - started,
        "user_s": usage.ru_utime,
        "sys_s": usage.ru_stime,
        "peak_mb": sum(peaks.values()) / 1024,
        "processes": len(peaks),
        "each_mb": [peaks[child.pid] / 1024] + [kib / 1024 for pid, kib in peaks.items() if pid != child.pid],
    }


def _watch(root: int, peaks: dict[int, int], stop: threading.Event) -> None:
    """Record the VmHWM of `root` and of every process below it until `stop`."""
    while not stop.wait(0.2):
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        parent = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(parent, []).append(int(entry))
        tree, i = [root], 0
        while i < len(tree):
            tree += children.get(tree[i], [])
            i += 1
        for pid in tree:
            try:
                with open(f"/proc/{pid}/status") as f:
                    hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
            except (OSError, StopIteration, ValueError):
                continue
            peaks[pid] = max(peaks.get(pid, 0), hwm)


def shard_digests(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.glob("fineweb_*.bin"))
        if "_bytes_" not in p.name
    }


def pieces(model: Path) -> list[tuple]:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    kinds = (sp.is_control, sp.is_unknown, sp.is_byte, sp.is_unused)
    return [(sp.id_to_piece(i), sp.get_score(i), *(k(i) for k in kinds)) for i in range(sp.vocab_size())]


TRAIN_CHILD = """
import itertools, sys, tempfile
from core.datasets.prepare import read_documents, training_texts
from core.datasets.writers import train_tokenizer
with tempfile.TemporaryDirectory() as tmp:
    texts = itertools.islice(read_documents(sys.argv[1]), int(sys.argv[2]))
    train_tokenizer(training_texts(texts), int(sys.argv[3]), tmp + "/t", exporter_limits=True)
"""


def train_memory(docs: Path, counts: list[int], vocab_size: int, work: Path) -> None:
    """Peak memory of training the tokenizer as `data prepare` does on the first N documents, for each N."""
    print(f"{'documents':>10} {'their bytes':>12} {'wall s':>7} {'peak MB':>8}")
    for n in counts:
        with docs.open("rb") as f:
            size = sum(len(line) for line in itertools.islice(f, n))
        row = measured(
            [sys.executable, "-c", TRAIN_CHILD, str(docs), str(n), str(vocab_size)], str(work / f"train_{n}")
        )
        print(f"{n:10,} {size:12,} {row['wall_s']:7.1f} {row['peak_mb']:8.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="100M", help="documents file size: bytes, or with K, M, G")
    parser.add_argument("--work", type=Path, default=Path("/tmp/prepare_scale"))
    parser.add_argument("--exporter", help="the challenge's data/download_hf_docs_and_tokenize.py")
    parser.add_argument("--tokenizer", help="encode with this .model (both sides) instead of training one")
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--tokenizer-train-docs", type=int)
    parser.add_argument("--val-docs", type=int, default=50_000)
    parser.add_argument("--shard-tokens", type=int, default=10**8)
    parser.add_argument("--verify", action="store_true", help="also time data verify --bytes")
    parser.add_argument(
        "--train-memory",
        help="instead: the peak memory of training the tokenizer on the first N documents, for each N of "
        "this comma-separated list",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.child:
        run_exporter_child(args)
        return
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    docs = work / "docs.jsonl"
    size = parse_size(args.size)
    if not docs.is_file() or abs(docs.stat().st_size - size) > max(size // 100, 200_000):
        started = time.monotonic()
        make_docs(docs, size, args.seed)
        print(f"wrote {docs}: {docs.stat().st_size:,} bytes in {time.monotonic() - started:.0f} s")
    with docs.open("rb") as f:
        count = sum(1 for _ in f)
    print(f"documents: {docs} ({docs.stat().st_size:,} bytes, {count:,} documents, {os.cpu_count()} CPUs)")
    if args.train_memory:
        train_memory(docs, [int(n) for n in args.train_memory.split(",")], args.vocab_size, work)
        return
    settings = ["--val-docs", str(args.val_docs), "--shard-tokens", str(args.shard_tokens)]
    tok_flags = ["--tokenizer", str(Path(args.tokenizer).resolve())] if args.tokenizer else []
    tok_flags += ["--vocab-size", str(args.vocab_size)] if not args.tokenizer else []
    if args.tokenizer_train_docs is not None:
        tok_flags += ["--tokenizer-train-docs", str(args.tokenizer_train_docs)]
    rows = {}
    if args.exporter:
        subprocess.run(["rm", "-rf", str(work / "exporter")], check=True)
        rows["exporter"] = measured(
            [sys.executable, __file__, "--child", "--exporter", str(Path(args.exporter).resolve()),
             "--work", str(work), *settings, *tok_flags],
            str(work / "exporter"),
        )  # fmt: skip
    subprocess.run(["rm", "-rf", str(work / "pgolf")], check=True)
    rows["pgolf"] = measured(
        [sys.executable, "cli.py", "data", "prepare", "--docs", str(docs), "--out", str(work / "pgolf"),
         "--name", "bench", *settings, *tok_flags],
        str(work / "pgolf"),
    )  # fmt: skip
    if args.verify:
        rows["pgolf verify --bytes"] = measured(
            [sys.executable, "cli.py", "data", "verify", "bench", "--bytes", "--out", str(work / "pgolf")],
            str(work / "verify"),
        )
    ours = shard_digests(work / "pgolf" / "datasets" / "bench")
    tokens = sum(
        (p.stat().st_size - 1024) // 2
        for p in (work / "pgolf" / "datasets" / "bench").glob("fineweb_*.bin")
        if p.name in ours
    )
    print(f"tokens: {tokens:,} in {len(ours)} shards")
    print(
        f"{'':22} {'wall s':>8} {'user s':>8} {'sys s':>7} {'peak MB':>8} {'processes':>9} {'CPU ns/token':>13}"
    )
    for label, row in rows.items():
        cpu = row["user_s"] + row["sys_s"]
        print(
            f"{label:22} {row['wall_s']:8.1f} {row['user_s']:8.1f} {row['sys_s']:7.1f} {row['peak_mb']:8.0f} "
            f"{row['processes']:9} {1e9 * cpu / tokens:13.1f}"
        )
    for label, row in rows.items():
        if row["processes"] > 1:
            print(
                f"{label}: peak MB of each process, the first its own: "
                + ", ".join(f"{mb:.0f}" for mb in row["each_mb"])
            )
    if args.exporter:
        theirs = shard_digests(work / "exporter" / "datasets" / "bench")
        print(f"shards identical: {ours == theirs} ({len(theirs)} from the exporter, {len(ours)} from pgolf)")
        if not args.tokenizer:
            same = pieces(
                work / "exporter" / "tokenizers" / f"fineweb_{args.vocab_size}_bpe.model"
            ) == pieces(work / "pgolf" / "tokenizers" / "bench.model")
            print(f"tokenizer identical (pieces, scores, types): {same}")


if __name__ == "__main__":
    main()
