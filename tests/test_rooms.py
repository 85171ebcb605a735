"""core/ is a stack of rooms: a module imports only from its own room or the rooms below it.

The order, bottom to top (docs/layout.md says what each holds):
common < data < config < model < artifact < eval < train < datasets < runs.
The backends (cuda_train/, mlx_train/) sit on the model room and may use anything up to train;
cli.py sits on top of everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

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
