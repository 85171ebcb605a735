"""One self-contained `train_gpt.py` for a run: the code the challenge counts, and what `package` writes.

The file holds the source of every pgolf module a PyTorch training run imports, the run's
config as its defaults, and a `main` that trains with it. It runs with `torchrun` or plain
`python` from any folder, pgolf not installed: the modules are served to `import` from the
file itself. Upstream environment variables (`DATA_PATH`, `TOKENIZER_PATH`, `SEED`,
`RUN_ID`, `ITERATIONS`, `MATRIX_LR`, ...) override the defaults, as in pgolf.

Which modules: a declared list, core/config/features.py's. Every run's script holds the training path
(`TRAINING_PATH`: the config, the loop, the data it reads, the model, the run's artifact and its scoring,
the PyTorch backend), and the modules of each feature only some runs use (`FEATURES`: test-time
training, sliding windows, the byte tables, each compressor, quant format and training loader, GPTQ,
LQER, FlashAttention's varlen kernel) when the feature's predicate, which the code that picks the
implementation calls too, says the config uses it. A left-out feature's module is a stand-in in the
script that refuses to be used, and the script refuses, in one line before any work, a config (after
the environment's overrides) that needs it, by the same predicates. A pgolf module that a bundled one
imports at its top level and that is on neither list is refused here, with the chain of imports that
reaches it: nothing ships by accident. Within the bundled modules, the top-level functions, classes and
constants that nothing a run executes can reach are left out (`_pruned`).

Two forms:
- plain: the modules' sources as they are, readable;
- compressed (the default, and the size every report calls the run's code bytes): each module
  minified by python-minifier as the records minify theirs (`pyminify --no-hoist-literals
  --remove-literal-statements --remove-asserts`), local names shortened too (the records keep theirs:
  `--no-rename-locals`), and module-level names but those other code reaches (`reached_names`), after
  dropping what only the CLI reads (the config fields' help texts, sections and resume flags) and what
  nothing reaches (`_pruned`), and the runner after them (`RUNNER`) minified alike; the whole script
  compressed by brotli (quality 11: docs/runs.md#code-bytes has what each step saves), its bytes seven
  bits a character of a string literal in a
  three-line script that runs it (`seven_bits_a_character`: 8/7 of the compressed size, base85's 5/4).

Its errors are one line (`error: ...`, as the CLI's) naming its own environment variables, never a
traceback through the encoded blob.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import brotli
import numpy as np
import python_minifier

from core.common.errors import PgolfError
from core.common.files import write_atomic
from core.config.features import FEATURES, TRAINING_PATH, uses_pergroup, uses_varlen_attention
from core.config.fields import Config

__all__ = ["bundled_modules", "code_bytes", "minify", "script"]

ROOT = Path(__file__).resolve().parents[2]
# What the script's main() imports, (module, names): where the bundle starts.
MAIN_IMPORTS = (
    ("core.config.fields", "Config, from_env"),
    ("core.train.loop", "check_budget, train"),
    ("cuda_train.backend", "check_config, create_backend"),
)
PACKAGES = ("core", "cuda_train")


def _file(module: str) -> Path | None:
    folder = ROOT / module.replace(".", "/")
    if (folder / "__init__.py").is_file():
        return folder / "__init__.py"
    path = folder.with_suffix(".py")
    return path if path.is_file() else None


TYPE_CHECKING_TESTS = ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _top_level(tree: ast.AST) -> list[ast.AST]:
    """The nodes of a module that run when it is imported: everything but the insides of functions
    and of `if TYPE_CHECKING:` blocks (imports for annotations alone)."""
    found, todo = [], [tree]
    while todo:
        node = todo.pop()
        found.append(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.If) and ast.unparse(node.test) in TYPE_CHECKING_TESTS:
            todo += node.orelse
            continue
        todo += ast.iter_child_nodes(node)
    return found


def _imports(tree: ast.AST) -> set[str]:
    """pgolf modules named by the imports a module runs when it is imported (not those in functions)."""
    return _pgolf_modules(_imported(tree))


def _imported(tree: ast.AST) -> set[str]:
    """Every name, with its packages, that the imports a module runs when it is imported name: a module,
    or a name imported from one, which may be a module too."""
    found: set[str] = set()
    for node in _top_level(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found | {m.rsplit(".", n)[0] for m in found for n in range(1, m.count(".") + 1)}


def _pgolf_modules(names: Iterable[str]) -> set[str]:
    return {m for m in names if m.split(".")[0] in PACKAGES and _file(m) is not None}


@functools.lru_cache(maxsize=256)
def _source_imports(source: str) -> frozenset[str]:
    return frozenset(_pgolf_modules(_facts(source)["imported"]))


def _with_packages(modules: Iterable[str]) -> set[str]:
    return {m.rsplit(".", n)[0] for m in modules for n in range(m.count(".") + 1)}


def bundled_modules(cfg: Config) -> dict[str, str]:
    """Module name -> source: exactly the training path's modules and those of the FEATURES `cfg` uses
    (core/config/features.py), with their packages. Every pgolf module their top-level imports name must
    be on those lists: a left-out feature's module is served as a stand-in (`RUNNER`), any other is refused
    with the chain of imports that reaches it (it would ship in no script, or stop the run at its import)."""
    used = [m for _, modules, uses, _ in FEATURES if uses(cfg) for m in modules]
    declared = _with_packages([*TRAINING_PATH, *(m for _, modules, _, _ in FEATURES for m in modules)])
    sources: dict[str, str] = {}
    for name in sorted(_with_packages([*TRAINING_PATH, *used])):
        path = _file(name)
        if path is None:
            raise PgolfError(f"package: module {name} not found under {ROOT}")
        sources[name] = path.read_text(encoding="utf-8")
    importer: dict[str, str] = {}
    for name in sorted(sources):
        for module in sorted(_source_imports(sources[name]) - declared - set(importer)):
            importer[module] = name
    if importer:
        module = min(importer, key=lambda m: (-m.count("."), m))  # the module, not its package
        chain = [module]
        while chain[-1] in importer:
            chain.append(importer[chain[-1]])
        raise PgolfError(
            f"package: {' <- '.join(chain)}: {module} is imported by the training path, but is on neither its "
            "list nor a feature's (core/config/features.py): declare it there, or import it elsewhere"
        )
    return dict(sorted(sources.items()))


def left_out(modules: dict[str, str]) -> tuple[tuple[str, str, Callable[[Config], bool], str], ...]:
    """The FEATURES with a module not in `modules`: (feature, that module, its predicate, field)."""
    out = []
    for what, names, uses, field in FEATURES:
        missing = [m for m in names if m not in modules]
        if missing:
            out.append((what, missing[0], uses, field))
    return tuple(out)


def left_out_modules(modules: dict[str, str]) -> tuple[str, ...]:
    """The FEATURES' modules not in `modules`."""
    return tuple(sorted({name for _, names, _, _ in FEATURES for name in names} - set(modules)))


class _HelpTexts(ast.NodeTransformer):
    """Drops what only the CLI reads: the help texts, sections and resume flags of Config's fields
    (`opt(default, check, help=, section=, resume=)`: keyword-only, so that they go by name; every field
    has a help text and a section, which tests/test_config.py checks)."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if isinstance(node.func, ast.Name) and node.func.id == "opt":
            node.keywords = [k for k in node.keywords if k.arg not in ("help", "section", "resume")]
        return self.generic_visit(node)


# Minified sources, what `_facts` reads off each module's syntax, and packed scripts are kept on disk,
# keyed by their input, this file and python-minifier's and brotli's versions: each `train` measures its
# code bytes, and minifying, parsing and compressing every bundled module takes seconds. PGOLF_CACHE_DIR
# moves the folder; a file that cannot be read or written is made again, never an error.
MINIFY_VERSION = hashlib.sha256(
    Path(__file__).read_bytes()
    + importlib.metadata.version("python-minifier").encode()
    + importlib.metadata.version("brotli").encode()
).hexdigest()


def _cache_dir() -> Path:
    root = os.environ.get("PGOLF_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "pgolf"
    )
    return Path(root) / "minified"


def minify(source: str, keep: frozenset[str] | None = None) -> str:
    """The same code without docstrings, comments, asserts or formatting, nor annotations or what `_HelpTexts` drops, its
    local names shortened, and with `keep` its module-level names too, but for those in `keep` (what other
    code may reach them by: `reached_names`); from the disk cache above when it holds it."""
    # Only the module's own names in `keep` change its text: bundles of other features share the entry.
    facts = _facts(source)
    return _minify(source, None if keep is None else keep & (facts["module_names"] | facts["method_names"]))


@functools.lru_cache(maxsize=128)  # the same modules, minified once per process (the artifact fit asks often)
def _minify(source: str, keep: frozenset[str] | None) -> str:
    key = ("" if keep is None else ",".join(sorted(keep))) + "\0" + source
    return _kept(key, ".py", lambda: _minified(source, keep))


def _kept(key: str, suffix: str, make: Callable[[], str]) -> str:
    """The text `make` returns, from the disk cache when it holds it under `key`."""
    cached = _cache_dir() / (hashlib.sha256((MINIFY_VERSION + key).encode()).hexdigest() + suffix)
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return cached.read_text(encoding="utf-8")
    text = make()
    with contextlib.suppress(PgolfError):
        write_atomic(cached, text.encode("utf-8"))
    return text


@functools.lru_cache(maxsize=256)  # an artifact fit packages every candidate it tries
def _facts(source: str) -> dict[str, frozenset[str]]:
    """What the packager reads off a module's syntax tree, parsed once and kept on disk beside its minified
    forms (a `train` in a new process measures its code bytes): the names its top-level imports name
    (`_imported`), those by which it may reach other modules' globals (`reached_names`), those it binds
    at its top level or a function declares `global` (the ones `rename_globals` may change), and the
    names of its top-level classes' methods."""
    with contextlib.suppress(ValueError, KeyError, TypeError):  # an entry that is not what was written
        kept = json.loads(_kept("facts\0" + source, ".json", lambda: json.dumps(_read_facts(source))))
        return {key: frozenset(kept[key]) for key in FACTS}
    return {key: frozenset(names) for key, names in _read_facts(source).items()}


FACTS = ("imported", "reached", "module_names", "method_names")


def _read_facts(source: str) -> dict[str, list[str]]:
    tree = ast.parse(source)
    module_names = {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}
    for node in _top_level(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            module_names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            module_names.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            module_names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    reached: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            reached |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Attribute):
            reached.add(node.attr)
    methods = {
        item.name
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    return {
        "imported": sorted(_imported(tree)),
        "reached": sorted(reached),
        "module_names": sorted(module_names),
        "method_names": sorted(methods),
    }


# Decorators that only wrap or describe what they decorate: a function or class under them that nothing
# reaches may go. Any other decorator may act (register it somewhere): what it decorates stays.
PURE_DECORATORS = (
    "dataclass",
    "functools.lru_cache",
    "functools.cache",
    "contextlib.contextmanager",
    "property",
)


# What a value may be built of for its assignment to go when nothing reads the name: nothing that calls.
PURE_VALUES = (ast.Constant, ast.Name, ast.Attribute, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.Load,
               ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop, ast.Starred, ast.keyword)  # fmt: skip


def _defined(node: ast.stmt) -> set[str]:
    """The names a top-level statement defines, where it may go when nothing reaches them: a function or
    a class (under no decorator that may act), a plain assignment of a pure value; else none."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        pure = all(ast.unparse(d).split("(")[0] in PURE_DECORATORS for d in node.decorator_list)
        return {node.name} if pure else set()
    if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [t for target in targets for t in ast.walk(target)]
        if all(isinstance(t, ast.Name | ast.Tuple | ast.Store) for t in names) and all(
            isinstance(n, PURE_VALUES) for n in ast.walk(node.value)
        ):
            return {t.id for t in names if isinstance(t, ast.Name)}
    return set()


# Methods a framework calls by name, which no bundled code need name: PyTorch's module and autograd hooks.
FRAMEWORK_HOOKS = frozenset({"forward", "backward", "setup_context", "extra_repr", "reset_parameters"})


def _pruned(tree: ast.Module, keep: frozenset[str]) -> ast.Module:
    """The module without what nothing reaches: its top-level functions, classes and constants that are
    neither in `keep` (what the other bundled code may reach: `reached_names`) nor read by the module's
    other statements, and its classes' methods whose names no bundled code reads as an attribute (but a
    dunder or a framework's hook). So a module shared with the CLI ships only what a training run can use."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            node.body = [
                item
                for item in node.body
                if not _defined(item)
                or not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                or item.name in keep
                or item.name in FRAMEWORK_HOOKS
                or (item.name.startswith("__") and item.name.endswith("__"))
            ] or [ast.Pass()]
    while True:
        loaded = [
            {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            for node in tree.body
        ]
        dead = set()
        for i, node in enumerate(tree.body):
            names = _defined(node)
            if (
                names
                and not names & keep
                and not any(names & other for j, other in enumerate(loaded) if j != i)
            ):
                dead.add(i)
        if not dead:
            return tree
        tree.body = [node for i, node in enumerate(tree.body) if i not in dead]


def _minified(source: str, keep: frozenset[str] | None = None) -> str:
    """`minify` without its caches."""
    tree = _HelpTexts().visit(ast.parse(source))
    if keep is not None:
        tree = _pruned(tree, keep)
    return (
        python_minifier.minify(
            ast.unparse(tree),
            rename_locals=True,
            rename_globals=keep is not None,
            preserve_globals=sorted(keep & _facts(source)["module_names"]) if keep else [],
            hoist_literals=False,
            remove_literal_statements=True,
            # A class's annotations go but for dataclasses', which make their fields of them.
            remove_annotations=python_minifier.RemoveAnnotationsOptions(
                remove_class_attribute_annotations=True
            ),
            remove_asserts=True,
        )
        + "\n"
    )


def reached_names(sources: list[str]) -> frozenset[str]:
    """The names by which code in `sources` may reach another module's globals: every name it imports
    `from` a module, and every attribute name it reads or writes (a module reached through an alias or a
    function, `errors.PACKAGED`). A bundled module's other module-level names are its own: renaming them
    changes nothing outside it."""
    return frozenset().union(*(_facts(source)["reached"] for source in sources))


def _literal(source: str) -> str:
    """A Python literal of `source`: a raw triple-quoted string where that is exact, else repr."""
    if "'''" not in source and not source.endswith("\\"):
        return "r'''" + source + "'''"
    return repr(source)


# What follows the modules' sources in train_gpt.py: serves them to `import` and trains. Its fields are
# filled by `script`, which minifies the result in the compressed form, the run's config last: until then
# CONFIG_MARK stands for it (the minifier writes a string as repr() does), so that every config of one
# bundle shares one runner, minified once (an artifact fit packages each candidate it tries).
CONFIG_MARK = "RUN_CONFIG_JSON"
RUNNER = '''
import importlib.abc
import importlib.util
import json
import os
import sys
import traceback

PACKAGES = {packages!r}
RUN_CONFIG = json.loads({config!r})


# The modules of the features this script was packaged without.
LEFT_OUT = {left_out_modules!r}


class LeftOut:
    """Stands for a name of a module of LEFT_OUT: any use is refused in one line (run() refuses a config
    that needs one before it starts)."""

    def __init__(self, module):
        self.module = module

    def __call__(self, *args, **kwargs):
        from core.common.errors import PgolfError

        raise PgolfError(f"this train_gpt.py was packaged without {{self.module}}")

    def __getattr__(self, name):
        self()


class BundledModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the modules above to `import`, and a stand-in for each module of LEFT_OUT."""

    def find_spec(self, name, path=None, target=None):
        if name not in SOURCES and name not in LEFT_OUT:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=name in PACKAGES)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        here = os.path.dirname(os.path.abspath(__file__))
        module.__file__ = os.path.join(here, *name.split(".")) + (os.sep + "__init__.py" if name in PACKAGES else ".py")
        if name in LEFT_OUT:

            def stand_in(attr):
                if attr.startswith("__"):  # what Python itself looks up on any module (inspect, pickle)
                    raise AttributeError(attr)
                return LeftOut(name)

            module.__getattr__ = stand_in
            return
        exec(compile(SOURCES[name], module.__file__, "exec"), module.__dict__)


def main():
    sys.meta_path.insert(0, BundledModules())
    from core.common import errors

    errors.PACKAGED = True  # the messages name this script's environment variables
    try:
        run()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # one line for a user's problem; a bug's traceback, without this file's blob
        line = errors.one_line(exc)
        if line is None:
            traceback.print_exception(exc)  # from main() down: not this file's encoded line
        else:
            print(line, file=sys.stderr)
        sys.exit(getattr(exc, "status", 1))  # 3: over the byte cap


def run():
    from core.common.launch import launch

    launch()  # torchrun's settings checked first: one line for a value set by hand
{config_import}

    cfg = Config.from_dict(RUN_CONFIG).replace(**from_env()).validate()  # before the slow imports
    from core.common.errors import PgolfError, setting
    from core.config import features

    # (module, the predicate of the feature that needs it, the field that asks for it)
    for module, uses, field in {left_out}:
        if uses(cfg):
            raise PgolfError(
                f"this train_gpt.py was packaged without {{module}}: "
                f"{{setting(field, getattr(cfg, field))}} needs a package of a run that uses it"
            )
    for field in features.PGOLF_ONLY:
        if getattr(cfg, field):
            raise PgolfError(
                f"{{setting(field, getattr(cfg, field))}}: only pgolf's train does that, not a packaged train_gpt.py"
            )
{imports}
    check_config(cfg)
    backend = create_backend(cfg)
    try:
        result = train(
            backend,
            log=lambda line: print(line, flush=True),
            code_bytes=os.path.getsize(__file__),
        )
    except BaseException:
        backend.close(failed=True)
        raise
    backend.close()
    check_budget(result, cfg.budget_bytes)


if __name__ == "__main__":
    main()
'''


HEADER = (
    "# train_gpt.py: a pgolf training run in one file (`pgolf package`). Run: torchrun --standalone "
    "--nproc_per_node=8 train_gpt.py, or python train_gpt.py; DATA_PATH, TOKENIZER_PATH, SEED, ... override."
)


def _run_config(cfg: Config) -> dict:
    """The config a packaged run starts from: the run's, writing a freshly named run directory
    under `runs/` beside wherever it is started. Only the fields that differ from the defaults are
    kept: the bundled Config supplies the rest, the same values."""
    defaults = Config().to_dict()
    # Trackers and the stop behind a reference run are the CLI's.
    run = cfg.replace(
        run_id="",
        out_dir=defaults["out_dir"],
        report_to="",
        abort_behind="",
        abort_margin=defaults["abort_margin"],
    ).to_dict()
    return {name: value for name, value in run.items() if value != defaults[name]}


def script(cfg: Config, compressed: bool = True) -> str:
    """The text of `train_gpt.py` for a run of `cfg` (see the module docstring)."""
    modules = bundled_modules(cfg)
    # What the script checks, each left-out feature as (module, its predicate, field): the module names what
    # the script lacks in its refusal.
    missing = "".join(
        f"\n        ({module!r}, features.{uses.__name__}, {field!r}),"
        for _, module, uses, field in left_out(modules)
    )
    runner = RUNNER.format(
        packages=tuple(n for n in modules if _file(n).name == "__init__.py"),
        left_out_modules=left_out_modules(modules),
        config=CONFIG_MARK,
        left_out=f"({missing}\n    )",
        config_import="    from {} import {}".format(*MAIN_IMPORTS[0]),
        imports="\n".join(f"    from {module} import {names}" for module, names in MAIN_IMPORTS[1:]),
    )
    if compressed:
        keep = reached_names([*modules.values(), runner])
        modules = {name: minify(source, keep) for name, source in modules.items()}
    # The plain form's first line says what it is; minified, as a comment, it goes.
    lines = [] if compressed else [HEADER]
    lines.append("SOURCES = {}")
    lines += [f"SOURCES[{name!r}] = {_literal(src)}" for name, src in modules.items()]
    runner = _minify(runner, None) if compressed else runner
    config = json.dumps(_run_config(cfg), sort_keys=True)
    text = "\n".join(lines) + "\n" + runner.replace(repr(CONFIG_MARK), repr(config))
    if not compressed:
        return text
    return _packed(text)


# The 7-bit values a character of the packed script does not stand for alone: the five a "..." literal cannot
# hold (NUL, newline, carriage return, the quote, the backslash) and the four a terminal acts on (escape,
# shift out, shift in, bell), so that `cat train_gpt.py` leaves the terminal as it was.
ESCAPED = b'\0\n\r"\\\x1b\x0e\x0f\x07'


def seven_bits_a_character(data: bytes) -> str:
    """`data` as the text of a "..." literal, seven bits a character (8/7 of its size; base85 gives 5/4).

    Its bits, padded with zeros to a multiple of 7, are read seven at a time: a value below 128 is the
    character with that code, one byte of UTF-8; one of ESCAPED's, with the seven bits after it (zeros
    at the end), is the character 256 + 128 * (its place in ESCAPED) + (those bits): two bytes for
    fourteen bits, from U+0100 to U+057F (Latin, Greek, Cyrillic, Armenian: no right-to-left script, no
    bidirectional control). The text is UTF-8 throughout, as the challenge reads its scripts.
    """
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
    bits = np.concatenate([bits, np.zeros(-len(bits) % 7, dtype=np.uint8)]).reshape(-1, 7)
    groups = [*(bits.astype(np.int64) @ (1 << np.arange(6, -1, -1))).tolist(), 0]
    chars, i = [], 0
    while i < len(groups) - 1:
        if groups[i] in ESCAPED:
            chars.append(chr(256 + 128 * ESCAPED.index(groups[i]) + groups[i + 1]))
            i += 2
        else:
            chars.append(chr(groups[i]))
            i += 1
    return "".join(chars)


# What the packed script runs first: the compressed bytes back from their literal (seven_bits_a_character's
# inverse: the characters' bits, the first 8 * length of them), decompressed, executed.
UNPACK = """import brotli
E={escaped!r};B="".join(f"{{k:07b}}"if k<128 else f"{{E[k//128-2]:07b}}{{k%128:07b}}"for k in map(ord,"{text}"))
exec(brotli.decompress(int(B[:{bits}],2).to_bytes({size},"big")))
"""


@functools.lru_cache(maxsize=8)  # the same script is asked for again (its size, then the file)
def _packed(text: str) -> str:
    """`text` compressed by brotli (quality 11), in a script that runs it (seven_bits_a_character); from
    the disk cache above when it holds it (a run's config, and so its script, is often one seen before)."""

    def pack() -> str:
        blob = brotli.compress(text.encode("utf-8"), quality=11)
        return UNPACK.format(
            escaped=ESCAPED, text=seven_bits_a_character(blob), bits=8 * len(blob), size=len(blob)
        )

    return _kept("packed\0" + text, ".py", pack)


def code_bytes(cfg: Config) -> int:
    """The bytes the challenge counts as a run's code: those of its compressed `train_gpt.py`."""
    return len(script(cfg, compressed=True).encode("utf-8"))


# What a bundle imports by name through importlib (core/common/compress.py's optional compressors,
# cuda_train/varlen.py's FlashAttention), out of `requirements`' sight: (module, whether a run of `cfg` does).
BY_NAME = (
    ("zstandard", lambda cfg: cfg.compressor == "zstd"),
    ("flash_attn_interface", uses_varlen_attention),
)


def requirements(cfg: Config, compressed: bool = True) -> str:
    """requirements.txt for a run's train_gpt.py: every distribution its bundle imports (in any function),
    pinned to the version installed here, and nothing else. A pin leaves out a local label (`+cu128`):
    `torch==2.9.1` accepts any build of 2.9.1. A module imported but not installed here is named in a comment."""
    runner = script(cfg, compressed=False)  # the modules' sources are string literals in it: its own imports
    unpack = UNPACK.format(escaped=ESCAPED, text="", bits=0, size=0)  # the compressed script's own imports
    sources = [*bundled_modules(cfg).values(), runner, *((unpack,) if compressed else ())]
    names: set[str] = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    names -= {*sys.stdlib_module_names, *PACKAGES}
    names |= {module for module, uses in BY_NAME if uses(cfg)}
    installed = importlib.metadata.packages_distributions()
    pins, absent = set(), []
    for name in sorted(names):
        for dist in installed.get(name, ()):
            pins.add(f"{dist}=={importlib.metadata.version(dist).split('+')[0]}")
        if name not in installed:
            absent.append(name)
    lines = sorted(pins, key=str.lower)
    if absent:
        lines.append(
            f"# imported where available, not installed where this was packaged: {', '.join(absent)}"
        )
    if uses_pergroup(cfg):
        lines.append("# the per-group compressor runs the lrzip program (apt-get install lrzip)")
    return "\n".join(lines) + "\n"
