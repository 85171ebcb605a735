"""The suite's own rules: a test module imports no other (what they share is in tests/support/,
tests/golden_data.py and tests/conftest.py), and no test reads the checkout's data/ or runs/."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from core.config.presets import PRESETS, preset
from tests.support import ROOT


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


def test_every_test_runs_beside_a_foreign_tokenizer_not_in_the_checkout(challenge_dir):
    """conftest.py's `hermetic`: the data/ a test might read by mistake holds the wrong tokenizer."""
    here = Path.cwd().resolve()
    assert not here.is_relative_to(ROOT)
    for name in PRESETS:
        path = Path(preset(name).tokenizer_path)
        assert path.is_file() and path.read_bytes() == (challenge_dir / "fineweb_1024_bpe.model").read_bytes()
    assert not {"DATA_PATH", "TOKENIZER_PATH", "SEED", "ITERATIONS", "RANK", "WORLD_SIZE"} & set(os.environ)
    assert not Path(os.environ["PGOLF_CACHE_DIR"]).resolve().is_relative_to(Path.home() / ".cache")


def test_no_test_starts_a_process_in_the_checkout():
    """A process started with cwd=ROOT would read the checkout's data/ and runs/ (relative paths)."""
    found = [
        f"{path.name}:{node.lineno}"
        for path in sorted([*(ROOT / "tests").glob("*.py"), *(ROOT / "tests" / "support").glob("*.py")])
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.keyword) and node.arg == "cwd" and "ROOT" in ast.unparse(node.value)
    ]
    assert found == []
