"""The documentation points at what exists: every relative link of README.md and docs/*.md resolves
(a file, and a heading where the link names one), and every `cli.py` command and `--flag` the pages
name is one the CLI has (read from typer's own command tree, no subprocess)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

import cli
from tests.support import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
SHELL = ("bash", "sh", "console")  # the fenced blocks that hold command lines
SPAN = re.compile(r"`([^`]+)`")
STOP = {"|", "||", "&&", ";", "#", ">", "<", "2>&1"}  # where a command line's own arguments end


def _slug(heading: str) -> str:
    """The anchor a heading gets on GitHub: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def _commands() -> dict[tuple[str, ...], set[str]]:
    """Every command path (`("train",)`, `("data", "prepare")`) -> the options it takes."""
    found: dict[tuple[str, ...], set[str]] = {}

    def walk(command, path: tuple[str, ...]) -> None:
        found[path] = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(cli.app), ())
    return found


COMMANDS = _commands()
ALL_FLAGS = set().union(*COMMANDS.values())


def _command_lines(text: str) -> list[str]:
    """The text of every code span, and every line of every fenced block (continuations joined)."""
    blocks = [m.group(2).replace("\\\n", " ") for m in FENCE.finditer(text) if m.group(1).strip() in SHELL]
    lines = [line for block in blocks for line in block.splitlines()]
    return lines + [m.group(1).replace("\n", " ") for m in SPAN.finditer(FENCE.sub("", text))]


def _check_invocation(words: list[str]) -> list[str]:
    """Problems with one invocation: `words` start with what follows `cli.py`."""
    path: tuple[str, ...] = ()
    while words and (*path, words[0]) in COMMANDS:
        path, words = (*path, words[0]), words[1:]
    if not path:
        return [f"no command {words[0]!r}"] if words and words[0][0] not in "<[" else []
    problems = []
    for word in words:
        if word in STOP or word.startswith("#"):
            break
        flag = word.split("=", 1)[0]
        if flag.startswith("--") and flag not in COMMANDS[path]:
            problems.append(f"`{' '.join(path)}` has no option {flag}")
    return problems


def _words(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=False)
    except ValueError:  # an unbalanced quote in prose: split on spaces
        return line.split()


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_command_and_flag_the_docs_name_exists():
    problems = []
    for page in PAGES:
        for line in _command_lines(page.read_text(encoding="utf-8")):
            words = _words(line)
            if not words:
                continue
            where = f"{page.relative_to(ROOT)}: {line.strip()}"
            starts = [i for i, w in enumerate(words) if w == "cli.py" or w.endswith("/cli.py")]
            if starts:
                for i in starts:
                    problems += [f"{where}: {p}" for p in _check_invocation(words[i + 1 :])]
            elif (words[0],) in COMMANDS:  # `train --resume RUN`, without the `cli.py`
                problems += [f"{where}: {p}" for p in _check_invocation(words)]
            elif words[0].startswith("--"):
                flag = words[0].split("=", 1)[0]
                if flag not in ALL_FLAGS:
                    problems.append(f"{where}: no command has the option {flag}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "words, complaint",
    [
        (["train", "--no-such-flag"], "no option --no-such-flag"),
        (["data", "prepare", "--preset", "tiny"], "no option --preset"),
        (["trian"], "no command 'trian'"),
    ],
)
def test_the_check_finds_a_wrong_command_or_flag(words, complaint):
    assert any(complaint in p for p in _check_invocation(words))


def test_the_check_accepts_real_invocations():
    assert _check_invocation(["train", "--preset", "tiny", "--ttt-enabled", "|", "head", "--bogus"]) == []
    assert _check_invocation(["data", "download", "--train-shards=80"]) == []
