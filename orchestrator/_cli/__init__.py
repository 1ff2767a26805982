"""The `orchestrator` console script: see and replay the runs saved in a store.

Installed as ``orchestrator`` (``[project.scripts]``) and runnable as ``python -m orchestrator``.
It is the only part of the library that writes to the terminal, and it is imported only by
those two entry points.
"""

from __future__ import annotations

from ._commands import cli

__all__ = ("cli", "main")


def main() -> None:
    """Run the command line (click ends it quietly when its output pipe closes early)."""
    cli.main(prog_name="orchestrator")
