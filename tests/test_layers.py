"""The layers keep to their rooms (DESIGN 13): no module uses another module's underscore names,
and the library has at most one context variable.

A module may use an underscore name on something other than ``self``/``cls`` only when it
defines that name itself (a slot, an attribute it assigns, a method or a module-level name of its
own): `other._hash` inside the class that has `_hash` is fine, `state._folded` in the agent loop
is not. Importing an underscore name from another module is refused too (a private submodule,
such as ``from . import _fold``, is a module, not a name).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
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
