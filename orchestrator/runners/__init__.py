"""Runners: where a subagent's child runs execute.

- `LocalRunner` (the default): here, in the parent's task.
- `RayRunner` (``pip install 'orchestrator[ray]'``): on a Ray cluster's async actors, the
  child saved in a store both sides open by URL, its agent rebuilt by name from a registry.

Set one with ``Agent(runner=...)`` (the children of that agent's subagent tools) or
``agent.as_tool(runner=...)``. `orchestrator.runners.contract` tests any runner.
"""

from __future__ import annotations

from .._base._errors import ChildRunError as ChildRunError
from .._base._link import Link as Link
from .._running._runner import ChildJob as ChildJob
from .._running._runner import LocalRunner as LocalRunner
from .._running._runner import Runner as Runner
from ._ray import RayRunner as RayRunner

__all__ = ("ChildJob", "ChildRunError", "Link", "LocalRunner", "RayRunner", "Runner")
