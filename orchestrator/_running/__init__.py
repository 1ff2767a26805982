"""The run: `Agent`, its settings and `Run`, the loop, thinking, tool execution and `ask`.

Saving, subagent linking and runners too (`orchestrator.runners` re-exports their protocol).
The top layer of the core: it uses every layer below it (and `orchestrator.models`).
"""

__all__ = ()
