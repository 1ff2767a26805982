"""The docs site builds with ``mkdocs build --strict``, offline, with every page and API name."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
API = {
    "orchestrator": "api/orchestrator",
    "orchestrator.a2a": "api/a2a",
    "orchestrator.models": "api/models",
    "orchestrator.permissions": "api/permissions",
    "orchestrator.runners": "api/runners",
    "orchestrator.runners.contract": "api/runners-contract",
    "orchestrator.testing": "api/testing",
    "stores": "api/stores",
    "stores.backend": "api/stores-backend",
    "stores.contract": "api/stores-contract",
}
# A script, style sheet or font taken from another site: a page that would not work offline.
_FOREIGN = re.compile(
    r"<script[^>]+src=\"(?:https?:)?//|<link[^>]+rel=\"stylesheet\"[^>]+href=\"(?:https?:)?//"
    r"|@import\s+url\((?:https?:)?//|url\(\"?(?:https?:)?//"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr}"
    assert "WARNING" not in done.stderr, done.stderr
    return folder


def test_every_page_is_in_the_nav() -> None:
    nav = re.findall(r":\s*(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    pages = sorted(page.relative_to(DOCS).as_posix() for page in DOCS.rglob("*.md"))

    assert sorted(nav) == pages


def test_the_home_page_lists_every_guide_in_the_nav_order() -> None:
    nav = re.findall(r":\s*(guides/\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    listed = re.findall(r"\]\((guides/[^)#]+\.md)\)", (DOCS / "index.md").read_text())
    guides = sorted(page.relative_to(DOCS).as_posix() for page in (DOCS / "guides").glob("*.md"))

    assert sorted(nav) == guides
    assert listed == nav, "docs/index.md lists the guides in the order of the nav, each once"


def test_every_page_is_built(site: Path) -> None:
    for page in DOCS.rglob("*.md"):
        name = page.relative_to(DOCS).with_suffix("").as_posix()
        built = site / ("index.html" if name == "index" else f"{name}/index.html")
        assert built.is_file(), f"{page} was not built"


@pytest.mark.parametrize("module", sorted(API))
def test_the_api_pages_have_every_public_class_and_function(site: Path, module: str) -> None:
    html = (site / API[module] / "index.html").read_text(encoding="utf-8")
    documented = set(re.findall(rf'id="{re.escape(module)}\.([A-Za-z_]\w*)"', html))
    imported = importlib.import_module(module)
    public = {
        name
        for name in imported.__all__
        if inspect.isclass(getattr(imported, name)) or inspect.isfunction(getattr(imported, name))
    }

    assert public, f"{module} has no public classes or functions"
    assert public <= documented, f"{module}: not on its API page: {sorted(public - documented)}"


def test_the_api_pages_show_the_docstrings(site: Path) -> None:
    html = (site / "api/orchestrator/index.html").read_text(encoding="utf-8")

    assert "Constructing an Agent never touches the network." in html  # Agent's docstring


def test_agent_comes_first_on_the_api_page(site: Path) -> None:
    html = (site / "api/orchestrator/index.html").read_text(encoding="utf-8")
    names = re.findall(r'<h2 id="orchestrator\.([A-Za-z_]\w*)"', html)

    assert names[:2] == ["Agent", "State"], names[:5]


def test_no_page_loads_anything_from_another_site(site: Path) -> None:
    for file in [*site.rglob("*.html"), *site.rglob("*.css")]:
        found = _FOREIGN.search(file.read_text(encoding="utf-8", errors="replace"))
        assert found is None, f"{file.relative_to(site)} loads {found.group(0)!r}"
