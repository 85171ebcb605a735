"""The suite's own rules: a test module imports no other (what they share is in tests/helpers.py,
tests/golden_data.py and tests/conftest.py), and no test reads the checkout's data/ or runs/."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT


def imported_test_modules(path: Path) -> set[str]:
    """The test_* modules a file imports, anywhere in it, or names in code it runs (a string)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value:
            found |= {w.strip(",;") for w in node.value.split() if w.startswith(("tests.test_", "test_"))}
    return {name for name in found if name.rpartition(".")[2].startswith("test_")}


def test_no_test_module_imports_another():
    imports = {
        str(path.relative_to(ROOT)): sorted(names)
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if path.name != "test_suite.py" and (names := imported_test_modules(path))  # its probe names some
    }
    assert imports == {}


def test_the_import_check_sees_one(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        'def f():\n    from tests.test_cli import cli\nCODE = "from tests.test_quant import quantize"\n'
    )
    assert imported_test_modules(probe) == {"tests.test_cli", "tests.test_quant"}
