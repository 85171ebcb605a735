"""One self-contained `train_gpt.py` for a run: the code the challenge counts, and what `package` writes.

The file holds the source of every pgolf module a PyTorch training run imports (found
by following the imports from `ENTRY`: no CLI, corpus, download, plots or MLX), the
run's config as its defaults, and a `main` that trains with it. It runs with `torchrun`
or plain `python` from any folder, pgolf not installed: the modules are served to
`import` from the file itself. Upstream environment variables (`DATA_PATH`,
`TOKENIZER_PATH`, `SEED`, `RUN_ID`, `ITERATIONS`, `MATRIX_LR`, ...) override the
defaults, as in pgolf.

Two forms:
- plain: the modules' sources as they are, readable;
- compressed (the default, and the size every report calls the run's code bytes):
  each module minified (docstrings and comments dropped by a round trip through
  `ast`), the whole script lzma-compressed and base85-encoded in a two-line script
  that decompresses and runs it.
"""

from __future__ import annotations

import ast
import base64
import json
import lzma
from pathlib import Path

from core.config import Config
from core.errors import PgolfError

__all__ = ["ENTRY", "bundled_modules", "code_bytes", "minify", "script"]

ROOT = Path(__file__).resolve().parent.parent
ENTRY = ("core.loop", "cuda_train.backend")  # what main() imports; the rest follows from their imports
PACKAGES = ("core", "cuda_train")
LEAVE_OUT = ("core.package",)  # pgolf's own use only: a packaged run knows its size


def _file(module: str) -> Path | None:
    if module in PACKAGES:
        return ROOT / module / "__init__.py"
    path = ROOT / (module.replace(".", "/") + ".py")
    return path if path.is_file() else None


def _imports(tree: ast.AST) -> set[str]:
    """pgolf modules named by the imports of a module (at the top or inside functions)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {m for m in found if m.split(".")[0] in PACKAGES and _file(m) is not None}


def bundled_modules() -> dict[str, str]:
    """Module name -> source, for every module a training run imports."""
    sources: dict[str, str] = {}
    todo = [*PACKAGES, *ENTRY]
    while todo:
        name = todo.pop()
        if name in sources or name in LEAVE_OUT:
            continue
        path = _file(name)
        if path is None:
            raise PgolfError(f"package: module {name} not found under {ROOT}")
        sources[name] = path.read_text(encoding="utf-8")
        todo += sorted(_imports(ast.parse(sources[name])))
    return dict(sorted(sources.items()))


def minify(source: str) -> str:
    """The same code without docstrings, comments or formatting."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(tree) + "\n"


def _literal(source: str, readable: bool) -> str:
    """A Python literal of `source`: a raw triple-quoted string where that is exact, else repr."""
    if readable and "'''" not in source and not source.endswith("\\"):
        return "r'''" + source + "'''"
    return repr(source)


RUNNER = '''
import importlib.abc
import importlib.util
import json
import os
import sys

PACKAGES = {packages!r}
RUN_CONFIG = json.loads({config!r})


class BundledModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the modules above to `import`."""

    def find_spec(self, name, path=None, target=None):
        if name not in SOURCES:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=name in PACKAGES)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        here = os.path.dirname(os.path.abspath(__file__))
        module.__file__ = os.path.join(here, *name.split(".")) + (os.sep + "__init__.py" if name in PACKAGES else ".py")
        exec(compile(SOURCES[name], module.__file__, "exec"), module.__dict__)


def main():
    sys.meta_path.insert(0, BundledModules())
    from core.backend import create
    from core.config import Config, from_env
    from core.loop import train

    cfg = Config.from_dict(RUN_CONFIG).replace(**from_env()).validate()
    backend = create("cuda", cfg)
    try:
        train(backend, log=lambda line: print(line, flush=True), code_bytes=os.path.getsize(__file__))
    except BaseException:
        backend.close(failed=True)
        raise
    backend.close()


if __name__ == "__main__":
    main()
'''


def _run_config(cfg: Config) -> dict:
    """The config a packaged run starts from: the run's, with a fresh run name each time it runs."""
    return cfg.replace(run_id="").to_dict()


def script(cfg: Config, compressed: bool = True) -> str:
    """The text of `train_gpt.py` for a run of `cfg` (see the module docstring)."""
    modules = bundled_modules()
    if compressed:
        modules = {name: minify(source) for name, source in modules.items()}
    lines = [
        "# train_gpt.py: a pgolf training run in one file (`pgolf package`). Run: torchrun --standalone "
        "--nproc_per_node=8 train_gpt.py, or python train_gpt.py; DATA_PATH, TOKENIZER_PATH, SEED, ... override.",
        "SOURCES = {}",
    ]
    lines += [f"SOURCES[{name!r}] = {_literal(src, not compressed)}" for name, src in modules.items()]
    config = json.dumps(_run_config(cfg), sort_keys=True)
    text = "\n".join(lines) + "\n" + RUNNER.format(packages=PACKAGES, config=config)
    if not compressed:
        return text
    blob = base64.b85encode(lzma.compress(text.encode("utf-8"), preset=9 | lzma.PRESET_EXTREME)).decode(
        "ascii"
    )
    return f'import lzma,base64\nexec(lzma.decompress(base64.b85decode("{blob}")))\n'


def code_bytes(cfg: Config) -> int:
    """The bytes the challenge counts as a run's code: those of its compressed `train_gpt.py`."""
    return len(script(cfg, compressed=True).encode("utf-8"))
