"""core/ is a stack of rooms: a module imports only from its own room or the rooms below it; and no two
files of pgolf import each other, however indirectly (imports inside functions and type-only imports
under `if TYPE_CHECKING:` count: a reader sees the map the test enforces).

The order, bottom to top (docs/layout.md says what each holds):
common < data < config < model < artifact < eval < train < datasets < runs.
The backends (cuda_train/, mlx_train/) sit on the model room and may use anything up to train;
cli.py sits on top of everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import PGOLF_PACKAGES, ROOT

ROOMS = ("common", "data", "config", "model", "artifact", "eval", "train", "datasets", "runs")


def core_imports(path: Path) -> set[str]:
    """The core modules a file imports, at its top or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("core.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "core":
                found |= {f"core.{a.name}" for a in node.names}
            elif node.module.startswith("core."):
                found.add(node.module)
    return found


def room_of(module: str) -> str:
    return module.split(".")[1]


def test_every_core_module_lives_in_a_room():
    loose = [p.name for p in (ROOT / "core").glob("*.py") if p.name != "__init__.py"]
    assert loose == []
    folders = sorted(p.name for p in (ROOT / "core").iterdir() if (p / "__init__.py").is_file())
    assert folders == sorted(ROOMS)


def test_no_module_imports_from_a_room_above_it():
    upward = []
    for path in sorted((ROOT / "core").rglob("*.py")):
        own = path.relative_to(ROOT / "core").parts[0]
        if own == "__init__.py":
            continue
        for module in core_imports(path):
            if ROOMS.index(room_of(module)) > ROOMS.index(own):
                upward.append(f"{path.relative_to(ROOT)} imports {module}")
    assert upward == []


def test_backends_use_nothing_above_the_training_room():
    limit = ROOMS.index("train")
    upward = [
        f"{path.relative_to(ROOT)} imports {module}"
        for folder in ("cuda_train", "mlx_train")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for module in core_imports(path)
        if ROOMS.index(room_of(module)) > limit
    ]
    assert upward == []


def test_the_room_check_sees_an_upward_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from core.runs.summary import summarize\n    from core import eval\n")
    assert core_imports(probe) == {"core.runs.summary", "core.eval"}
    assert ROOMS.index(room_of("core.runs.summary")) > ROOMS.index("common")


def test_the_layout_page_names_every_module():
    page = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    layout = page.split("```", 2)[1]
    missing = [
        str(p.relative_to(ROOT / "core"))
        for p in sorted((ROOT / "core").rglob("*.py"))
        if p.name != "__init__.py" and p.name not in layout
    ]
    assert missing == []
    assert all(f"{room}/" in layout for room in ROOMS)


# ------------------------------------------------- no two files import each other, however indirectly
PACKAGES = (*PGOLF_PACKAGES, "cli")


def module_files() -> dict[str, Path]:
    """Every module of pgolf's code by its dotted name (a package by its folder's)."""
    paths = [ROOT / "cli.py", *(p for d in PACKAGES[:-1] for p in sorted((ROOT / d).rglob("*.py")))]
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in paths}


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of `known` a file imports: at its top, inside functions, or under `if TYPE_CHECKING:`
    (for annotations alone, but still a dependency a reader follows)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    found = set()
    for name in names:
        while name and name not in known:  # a name imported from a module is that module
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of two or more modules that each reach the others through imports."""
    reach = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        reach[start] = seen
    groups = {frozenset({a} | {b for b in reach[a] if a in reach[b]}) for a in graph if a in reach[a]}
    return sorted(sorted(g) for g in groups if len(g) > 1)


def test_no_two_modules_import_each_other():
    files = module_files()
    graph = {m: imported_modules(p, set(files)) - {m} for m, p in files.items()}
    assert import_cycles(graph) == []


def test_the_cycle_check_sees_one_through_a_function_and_through_type_checking(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import core.b\n")
    known = {"core.a", "core.b"}
    for b_text in (
        "def f():\n    from core.a import x\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from core.a import x\n",
    ):
        b.write_text(b_text)
        graph = {"core.a": imported_modules(a, known), "core.b": imported_modules(b, known)}
        assert import_cycles(graph) == [["core.a", "core.b"]]
    b.write_text("import core\n")
    assert import_cycles({"core.a": imported_modules(a, known), "core.b": imported_modules(b, known)}) == []
