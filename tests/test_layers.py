"""The layers keep to their rooms (DESIGN 13, 19): no module uses another module's underscore names,
the library has at most one context variable, and no layer imports one above it.

A module may use an underscore name on something other than ``self``/``cls`` only when it
defines that name itself (a slot, an attribute it assigns, a method or a module-level name of its
own): `other._hash` inside the class that has `_hash` is fine, `state._folded` in the agent loop
is not. Importing an underscore name from another module is refused too (a private submodule,
such as ``from . import _fold``, is a module, not a name).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "stores")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _slot_names(node: ast.ClassDef) -> Iterator[str]:
    for item in node.body:
        if isinstance(item, ast.Assign):
            targets, value = item.targets, item.value
        elif isinstance(item, ast.AnnAssign):
            targets, value = [item.target], item.value
        else:
            continue
        if not any(isinstance(t, ast.Name) and t.id == "__slots__" for t in targets):
            continue
        if isinstance(value, ast.Tuple | ast.List | ast.Set):
            for element in value.elts:
                if isinstance(element, ast.Constant) and isinstance(element.value, str):
                    yield element.value
        elif isinstance(value, ast.Constant) and isinstance(value.value, str):
            yield value.value


def owned_names(tree: ast.Module) -> set[str]:
    """The underscore names a module defines: its slots, attributes, methods and globals."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names.update(_slot_names(node))
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if _private(name)}


def _is_submodule(path: Path, node: ast.ImportFrom, name: str, root: Path) -> bool:
    """Whether ``from <node.module> import name`` in `path` imports a module of the package."""
    base = path.parent
    for _ in range(max(0, node.level - 1)):
        base = base.parent
    if node.level == 0:
        base = root
    folder = base.joinpath(*(node.module or "").split(".")) if node.module else base
    return (folder / f"{name}.py").exists() or (folder / name / "__init__.py").exists()


# The public methods of the standard library's named tuples (urllib's SplitResult, ...): their
# underscore keeps them apart from the fields, it does not make them private.
NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})


def foreign_underscore_uses(path: Path, root: Path = ROOT) -> list[str]:
    """Each use in `path` of an underscore name that another module defines."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = owned_names(tree)
    where = path.relative_to(root)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            receiver = node.value
            if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
                continue
            if node.attr not in own and node.attr not in NAMEDTUPLE_API:
                found.append(f"{where}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for alias in node.names:
                if _private(alias.name) and not _is_submodule(path, node, alias.name, root):
                    found.append(f"{where}:{node.lineno}: import {alias.name}")
    return found


def context_variables(path: Path, root: Path = ROOT) -> list[str]:
    """Each ``ContextVar(...)`` made in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "ContextVar":
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_uses_another_modules_underscore_names(package: str) -> None:
    found = [use for path in _modules(package) for use in foreign_underscore_uses(path)]
    assert found == [], "use a public name (add one where a piece is missing):\n" + "\n".join(found)


@pytest.mark.parametrize("package", PACKAGES)
def test_at_most_one_context_variable(package: str) -> None:
    found = [var for path in _modules(package) for var in context_variables(path)]
    assert len(found) <= 1, found


def test_the_scan_finds_what_it_must(tmp_path: Path) -> None:
    # The rules above must be able to fail: a foreign underscore name, its import, and a
    # second context variable are each found; a module's own names and submodules are not.
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "_fold.py").write_text("def _empty() -> None: ...\n", encoding="utf-8")
    probe = package / "_probe.py"
    probe.write_text(
        "import contextvars\n"
        "from ._fold import _empty\n"
        "from . import _fold\n"
        "a = contextvars.ContextVar('a')\n"
        "b = contextvars.ContextVar('b')\n"
        "class Own:\n"
        "    __slots__ = ('_mine',)\n"
        "    def same(self, other: 'Own') -> object:\n"
        "        return other._mine\n"
        "def reach(state: object) -> object:\n"
        "    return state._folded\n",
        encoding="utf-8",
    )
    uses = foreign_underscore_uses(probe, tmp_path)
    assert [use.split(": ", 1)[1] for use in uses] == ["import _empty", "._folded"]
    assert len(context_variables(probe, tmp_path)) == 2


# -- the layer order (DESIGN 19) ---------------------------------------------------------------

# The core's folders, bottom-up: a module imports only from its own folder and those before it,
# not even under TYPE_CHECKING nor inside a function (a lower layer owns a protocol instead).
LAYERS = ("_base", "_record", "_tooling", "_apps", "models", "_running")

# Above every layer: the public surface. The package's own modules (its __init__ and the public
# modules beside it) and the packages that serve users, which may import any layer.
SURFACE_MODULES = frozenset({"__init__", "__main__", "otel", "permissions"})
SURFACE_PACKAGES = frozenset({"_cli", "_viewing", "a2a", "apps", "mcp", "runners", "testing"})
TOP = len(LAYERS)


@dataclass(frozen=True)
class Import:
    """One import in a module of the package: `where` imports `target` (a dotted module)."""

    where: str  # the importing module's path, relative to the root
    line: int
    target: str
    at_load: bool  # at module level and not under TYPE_CHECKING: runs when the module loads


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def imports_of(path: Path, root: Path = ROOT) -> list[Import]:
    """Every import in `path`: at module level, under TYPE_CHECKING, and inside functions."""
    name, is_package = _module_name(path, root)
    package = name if is_package else name.rpartition(".")[0]
    where = str(path.relative_to(root))
    found: list[Import] = []

    def resolve(node: ast.ImportFrom) -> list[str]:
        if node.level == 0:
            base = node.module or ""
        else:
            parts = package.split(".")
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join([*parts, *([node.module] if node.module else [])])
        # `from . import _fold` imports a module; `from ._fold import x` a name of one.
        return [
            f"{base}.{alias.name}" if _is_submodule(path, node, alias.name, root) else base
            for alias in node.names
        ]

    def visit(nodes: list[ast.stmt], at_load: bool) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.extend(Import(where, node.lineno, a.name, at_load) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                found.extend(Import(where, node.lineno, t, at_load) for t in resolve(node))
            elif isinstance(node, ast.If) and _type_checking(node.test):
                visit(node.body, at_load=False)
                visit(node.orelse, at_load)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(node.body, at_load=False)  # runs when called, not when the module loads
            else:
                children = [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
                visit(children, at_load)

    visit(ast.parse(path.read_text(encoding="utf-8")).body, at_load=True)
    return found


def unit_of(module: str, root: Path = ROOT) -> str | None:
    """The folder (or the top module) a module of `orchestrator` is in; `stores`; else None."""
    parts = module.split(".")
    if parts[0] != "orchestrator":
        return "stores" if parts[0] == "stores" else None
    # A folder; a module beside the package's __init__ (mcp, __main__, ...) stands alone.
    return parts[1] if len(parts) > 1 else "orchestrator"  # the package's own __init__


def rank(unit: str) -> int:
    """The height of `unit`: its place in LAYERS, or above them all (the surface, `stores`)."""
    return LAYERS.index(unit) if unit in LAYERS else TOP


def upward_imports(root: Path = ROOT) -> list[str]:
    """Each import of a layer module from a higher layer (or from the surface, or `stores`)."""
    found: list[str] = []
    for path in _modules_under(root / "orchestrator"):
        own = unit_of(_module_name(path, root)[0], root)
        if own not in LAYERS:
            continue
        for item in imports_of(path, root):
            target = unit_of(item.target, root)
            if target is not None and rank(target) > rank(own):
                found.append(f"{item.where}:{item.line}: {own} imports {item.target}")
    return found


def _modules_under(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*.py") if "viewer" not in path.parts)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of `edges` with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            part: list[str] = []
            while True:
                other = stack.pop()
                part.append(other)
                if other == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def folder_cycles(root: Path = ROOT) -> list[list[str]]:
    """Cycles between the folders of `orchestrator` (any import counts, TYPE_CHECKING too)."""
    edges: dict[str, set[str]] = {}
    for path in _modules_under(root / "orchestrator"):
        own = unit_of(_module_name(path, root)[0], root)
        assert own is not None
        for item in imports_of(path, root):
            target = unit_of(item.target, root)
            if target not in (None, own, "stores"):
                edges.setdefault(own, set()).add(target)
    return _cycles(edges)


def load_cycles(root: Path = ROOT) -> list[list[str]]:
    """Cycles of imports that run when modules load, across `orchestrator` and `stores`."""
    modules = {
        _module_name(path, root)[0]: path
        for package in PACKAGES
        for path in _modules_under(root / package)
    }
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        for item in imports_of(path, root):
            if item.at_load and item.target in modules and item.target != name:
                edges.setdefault(name, set()).add(item.target)
    return _cycles(edges)


def modules_outside_layers(root: Path = ROOT) -> list[str]:
    """Modules of `orchestrator` in no layer folder and not part of the public surface."""
    found: list[str] = []
    for path in sorted((root / "orchestrator").iterdir()):
        if path.is_dir() and (path / "__init__.py").exists():
            if path.name not in LAYERS and path.name not in SURFACE_PACKAGES:
                found.append(f"{path.name}/ (a folder in no layer)")
        elif path.suffix == ".py" and path.stem not in SURFACE_MODULES:
            found.append(path.name)
    return found


def test_no_layer_imports_a_layer_above_it() -> None:
    found = upward_imports()
    assert found == [], "a lower layer owns a protocol instead:\n" + "\n".join(found)


def test_no_cycle_between_the_folders() -> None:
    assert folder_cycles() == []


def test_no_import_cycle_at_load() -> None:
    assert load_cycles() == []


def test_every_core_module_is_in_a_layer() -> None:
    found = modules_outside_layers()
    assert found == [], "put a new module in the folder of its layer:\n" + "\n".join(found)


def test_the_layer_scan_finds_what_it_must(tmp_path: Path) -> None:
    # An upward import is found at module level, under TYPE_CHECKING and inside a function; a
    # cycle between folders and a cycle at load are found; a private module outside the layer
    # folders is found. Imports downward, within a folder, or in a TYPE_CHECKING circle are not.
    core = tmp_path / "orchestrator"
    for folder in ("", *LAYERS, "testing"):
        (core / folder).mkdir(exist_ok=True)
        (core / folder / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "stores").mkdir()
    (tmp_path / "stores" / "__init__.py").write_text("", encoding="utf-8")
    files = {
        "_base/_low.py": (
            "from typing import TYPE_CHECKING\n"
            "from .._record import _state\n"  # upward, at load
            "if TYPE_CHECKING:\n"
            "    from .._running._run import Run\n"  # upward, for types
            "def f():\n"
            "    import orchestrator._apps._events\n"  # upward, in a function
            "    from stores import x\n"  # the surface's neighbour: upward too
        ),
        "_record/_state.py": "from .._base import _low\nfrom . import _fold\n",
        "_record/_fold.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n"
            "    from ._state import State\n"  # a circle in one folder, for types: allowed
        ),
        "_running/_run.py": "from .._record._state import State\nfrom ._agent import A\n",
        "_running/_agent.py": "from ._run import Run\n",  # a cycle at load
        "testing/__init__.py": "from .. import _stray\n",
        "_stray.py": "from .testing import x\n",  # the surface and testing import each other
    }
    for name, text in files.items():
        (core / name).write_text(text, encoding="utf-8")
    assert [line.split(": ", 1)[1] for line in upward_imports(tmp_path)] == [
        "_base imports orchestrator._record._state",
        "_base imports orchestrator._running._run",
        "_base imports orchestrator._apps._events",
        "_base imports stores",
    ]
    assert folder_cycles(tmp_path) == [["_base", "_record", "_running"], ["_stray", "testing"]]
    assert load_cycles(tmp_path) == [
        ["orchestrator._base._low", "orchestrator._record._state"],
        ["orchestrator._running._agent", "orchestrator._running._run"],
        ["orchestrator._stray", "orchestrator.testing"],
    ]
    assert modules_outside_layers(tmp_path) == ["_stray.py"]
