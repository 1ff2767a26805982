"""What SECURITY.md promises that the source itself shows: no code from data, SQL with parameters.

The other promises (ids, file modes, keys, integrity) are proven by the behaviour tests that
SECURITY.md names; the last test here checks that each test it names exists.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = sorted([*(ROOT / "orchestrator").rglob("*.py"), *(ROOT / "stores").rglob("*.py")])
SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|PRAGMA|ALTER|DROP)\b")  # as we write it
# What an SQL f-string may put in its text: constants of the module, and the "?, ?" marks.
SQL_PIECES = {"BUSY_TIMEOUT_MS", "_INFO_COLUMNS", "marks"}
# Modules that turn text into code or objects: none of them is ever used on stored data.
FORBIDDEN_MODULES = {"pickle", "marshal", "shelve", "dill", "cloudpickle"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@pytest.mark.parametrize("path", LIBRARY, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_code_is_made_from_data(path: Path) -> None:
    for node in ast.walk(tree(path)):
        names: set[str] = set()
        if isinstance(node, ast.Import):
            names = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {(node.module or "").split(".")[0]}
        where = f"{path}:{getattr(node, 'lineno', '?')}"
        assert not names & FORBIDDEN_MODULES, f"{where} imports {names}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in FORBIDDEN_CALLS, f"{where} calls {node.func.id}"


@pytest.mark.parametrize("path", LIBRARY, ids=lambda path: str(path.relative_to(ROOT)))
def test_sql_text_never_holds_a_value(path: Path) -> None:
    """Values reach SQLite as parameters: an SQL f-string interpolates only fixed pieces."""
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.JoinedStr):
            text = "".join(
                str(part.value) for part in node.values if isinstance(part, ast.Constant)
            )
            if not SQL.match(text):
                continue
            pieces = {
                ast.unparse(part.value)
                for part in node.values
                if isinstance(part, ast.FormattedValue)
            }
            assert pieces <= SQL_PIECES, f"{path}:{node.lineno} puts {pieces} into SQL text"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
            left = node.left
            if isinstance(left, ast.Constant) and isinstance(left.value, str):
                assert not SQL.match(left.value), f"{path}:{node.lineno} builds SQL with {node.op}"


def test_sql_lives_in_one_module() -> None:
    outside = [
        f"{path}:{node.lineno}"
        for path in LIBRARY
        if path.name not in ("_sql.py", "_postgres_sql.py")  # SQLite's, and PostgreSQL's
        for node in ast.walk(tree(path))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and SQL.match(node.value)
        and re.search(r"\b(FROM|INTO|TABLE|SET)\b", node.value)
    ]
    assert outside == []


def test_the_tests_security_md_names_exist() -> None:
    text = (ROOT / "SECURITY.md").read_text(encoding="utf-8")
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", text)
    assert len(named) >= 10
    for file, name in named:
        source = (ROOT / file).read_text(encoding="utf-8")
        assert re.search(rf"^(async )?def {name}\(|^    (async )?def {name}\(", source, re.M), (
            f"SECURITY.md names {file}::{name}, which does not exist"
        )
