"""Stores are reached through their protocols, resolved once into one client (DESIGN 19).

No module of the library asks a store what it can do with ``getattr`` or ``hasattr``: the core
talks to a store through `orchestrator._record._store_client.StoreClient`, which asks the protocols
once, with ``isinstance``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "stores")

# A store by any of its names in the library: `store`, `self._store`, `job.store`, `client.store`.
_STORE = re.compile(r"(?<![A-Za-z0-9])_?store\b")


def sniffs(tree: ast.Module) -> list[tuple[int, str]]:
    """The calls of ``getattr``/``hasattr`` on a store in `tree`: (line, source) each."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and node.args
            and _STORE.search(ast.unparse(node.args[0]))
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_pattern_finds_a_sniff_and_nothing_else() -> None:
    found = sniffs(
        ast.parse(
            "getattr(store, 'aload', None)\n"
            "hasattr(self._store, 'url')\n"
            "getattr(job.store, 'url', None)\n"
            "getattr(restore, 'x')\n"
            "getattr(model, 'store')\n"
        )
    )
    assert [line for line, _ in found] == [1, 2, 3]


def test_no_module_sniffs_a_store() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {source}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, source in sniffs(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert found == [], "reach stores through orchestrator._record._store_client:\n" + "\n".join(
        found
    )
