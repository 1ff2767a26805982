"""Peak resident memory of a fresh process running one loop: ``python -m benchmarks.peak_rss``.

``python -m benchmarks.peak_rss WHAT TURNS`` prints the process's peak RSS in bytes after:

- ``agent``: `TURNS` turns of the issue 13 exchange through an Agent's default loop, no store;
- ``import``: importing `orchestrator` (and `orchestrator.testing`), nothing run: what the
  library costs before any turn;
- ``floor``: the same exchange in a bare anyio loop (plain dicts for messages, a function for
  the model), importing only anyio: what Python and an event loop cost.

Only the standard library is imported at the top, so each mode holds what it needs and no more.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ("floor_loop", "main", "peak_rss_bytes")


def peak_rss_bytes() -> int:
    """This process's peak resident memory, in bytes (VmHWM, else ``ru_maxrss``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


async def floor_loop(turns: int) -> None:
    """The exchange in a bare loop: a model deciding from the message count, a counting tool."""
    import anyio.lowlevel

    lock = threading.Lock()
    calls = 0

    async def respond(messages: list[dict[str, Any]]) -> dict[str, Any]:
        await anyio.lowlevel.checkpoint()
        size = len(messages)
        if size < 2 * turns:
            call = {"id": f"call_{size}", "name": "count", "args": {"n": size}}
            return {"role": "assistant", "calls": [call]}
        return {"role": "assistant", "text": "done"}

    async def count(n: int) -> str:
        nonlocal calls
        with lock:
            calls += 1
        return "ok"

    messages: list[dict[str, Any]] = [{"role": "user", "text": "go"}]
    while True:
        reply = await respond(messages)
        messages.append(reply)
        if "calls" not in reply:
            break
        for call in reply["calls"]:
            text = await count(**call["args"])
            messages.append({"role": "user", "results": [{"id": call["id"], "text": text}]})
    if calls != turns:
        raise RuntimeError(f"the floor made {calls} tool calls in {turns} turns")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one mode (see the module docstring) and print the peak RSS in bytes."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 2 or args[0] not in ("agent", "import", "floor"):
        print("usage: python -m benchmarks.peak_rss agent|import|floor TURNS", file=sys.stderr)
        return 2
    what, turns = args[0], int(args[1])
    if what == "floor":
        import anyio

        anyio.run(floor_loop, turns)
    elif what == "import":
        import importlib

        importlib.import_module("orchestrator.testing")  # and so `orchestrator`
    else:
        import anyio

        from .exchange import agent_seconds

        anyio.run(agent_seconds, turns, False)
    print(peak_rss_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
