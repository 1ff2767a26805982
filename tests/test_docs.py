"""Every ```python block in docs/ runs.

The blocks of one page run in order in one shared namespace, so a later block can use the names
an earlier one defined. A failure names the page, the block index and its line.
"""

from __future__ import annotations

import re
import sys
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.postgres import drop_schema, postgres_dsn

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# guides/cluster.md starts a Ray cluster: its blocks run inside a loopback-only network
# namespace, with the Ray tests (tests/runners/test_cluster_docs.py), never here.
RAY_PAGES = {DOCS / "guides" / "cluster.md"}
PAGES = [*sorted(set(DOCS.rglob("*.md")) - RAY_PAGES), ROOT / "README.md"]

_FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Block:
    index: int
    line: int  # 1-based line of the opening fence
    code: str


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of a Markdown text, in order (other fences are skipped)."""
    blocks: list[Block] = []
    for match in _FENCE.finditer(text):
        if match.group("info").strip() != "python":
            continue
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(len(blocks), line, match.group("body")))
    return blocks


def test_python_blocks_are_found_in_order() -> None:
    text = "\n".join(
        [
            "# Title",
            "```python",
            "a = 1",
            "```",
            "```text",
            "not python",
            "```",
            "```python",
            "b = a + 1",
            "```",
        ]
    )
    blocks = python_blocks(text)
    assert [(b.index, b.line, b.code) for b in blocks] == [(0, 2, "a = 1\n"), (1, 8, "b = a + 1\n")]


def test_the_docs_have_code() -> None:
    names = {page.relative_to(DOCS).as_posix() for page in PAGES if page.is_relative_to(DOCS)}
    assert {"index.md", "concepts/state.md", "guides/typed-data.md"} <= names
    for name in ("index.md", "concepts/state.md", "guides/typed-data.md"):
        assert python_blocks((DOCS / name).read_text(encoding="utf-8")), f"{name} has no code"


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_page_blocks_run(page: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # a block that writes a file (runs.db) writes it here
    where = page.relative_to(ROOT).as_posix()
    if 'os.environ["DATABASE_URL"]' in page.read_text(encoding="utf-8"):
        # Its PostgreSQL blocks run against the test server, in the default schema, emptied.
        dsn = postgres_dsn()
        monkeypatch.setenv("DATABASE_URL", dsn)
        drop_schema(dsn, "orchestrator")
        try:
            _run_blocks(page, where, monkeypatch)
        finally:
            drop_schema(dsn, "orchestrator")
        return
    _run_blocks(page, where, monkeypatch)


def _run_blocks(page: Path, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real module, so dataclasses and pydantic models defined in a block resolve their module.
    name = "docs_" + re.sub(r"\W", "_", page.relative_to(ROOT).with_suffix("").as_posix())
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    for block in python_blocks(page.read_text(encoding="utf-8")):
        try:
            code = compile(block.code, f"{where}:block{block.index}", "exec", dont_inherit=True)
            exec(code, module.__dict__)
        except Exception:
            pytest.fail(
                f"{where}, python block {block.index} (line {block.line}) failed:\n"
                f"{traceback.format_exc()}"
            )
