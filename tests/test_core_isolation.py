"""core/ must import and work with neither torch nor mlx available."""

from __future__ import annotations

from tests.support import ROOT
from tests.support.backends import run_blocked


def test_every_core_module_imports_without_frameworks():
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "core").rglob("*.py")
    )
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    code += "assert 'torch' not in sys.modules and 'mlx' not in sys.modules\nprint('ok')"
    result = run_blocked(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_cli_help_works_without_frameworks():
    result = run_blocked(
        f"sys.argv = ['cli.py', '--help']\nimport runpy\nrunpy.run_path({str(ROOT / 'cli.py')!r}, run_name='__main__')"
    )
    assert "train" in result.stdout and "Traceback" not in result.stderr


def test_no_core_module_mentions_a_framework_import():
    for path in (ROOT / "core").rglob("*.py"):
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith(("import torch", "import mlx", "from mlx", "from torch")):
                # Only lazy imports inside functions are allowed (indented lines).
                assert line.startswith((" ", "\t")), f"{path.name}: top-level framework import: {line}"
