"""Issue 31's measured number: what serving a tool over MCP costs a call, beside a bare SDK tool.

The same `add(a, b)` is served twice: by `orchestrator.mcp.serve_tools` (permissions decided,
arguments bound by the tool's pydantic plan, the result converted) and by the SDK's own
`MCPServer` (the floor: its decorator's validation and result). One SDK client connects to each
in the process (no transport in between, so the servers' own work is what differs) and the two
are called in turns, call by call, so the machine's noise falls on both alike. Rows: p50 µs per
call of each, for a sync tool (a worker thread in both) and an async one, and the ratio of the
p50s.

``python -m benchmarks.mcp_bench`` prints only these rows (``--quick``: tiny sizes).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import anyio
import mcp
from mcp.server.mcpserver import MCPServer

from orchestrator import tool
from orchestrator.mcp import serve_tools
from orchestrator.permissions import AllowByName

from .report import Metric, render

__all__ = ("bench_mcp", "main")


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def add_async(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _bare() -> MCPServer:
    server = MCPServer("bare")
    server.tool(name="add")(add)
    server.tool(name="add_async")(add_async)
    return server


def _ours() -> Any:
    return serve_tools([tool(add), tool(add_async)], permissions=[AllowByName("add*")])


async def _timed(client: mcp.Client, name: str, index: int) -> float:
    start = time.perf_counter()
    result = await client.call_tool(name, {"a": index, "b": 1})
    elapsed = time.perf_counter() - start
    text = result.content[0]
    assert isinstance(text, mcp.types.TextContent), result
    assert text.text == str(index + 1), result
    return elapsed


async def _measure(calls: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    async with mcp.Client(_ours()) as ours, mcp.Client(_bare()) as bare:
        for name in ("add", "add_async"):
            for client in (ours, bare):  # warm up: first calls build caches
                await _timed(client, name, 0)
            for index in range(calls):
                # Each pair starts with the other server every other call.
                order = (ours, bare) if index % 2 == 0 else (bare, ours)
                for client in order:
                    key = f"{name}.{'ours' if client is ours else 'bare'}"
                    times.setdefault(key, []).append(await _timed(client, name, index))
    return times


def bench_mcp(calls: int) -> list[Metric]:
    """p50 µs per call of a served tool and of the bare SDK tool, sync and async; the ratio."""
    times = anyio.run(_measure, calls)
    metrics: list[Metric] = []
    for name, kind in (("add", "sync"), ("add_async", "async")):
        ours = statistics.median(times[f"{name}.ours"]) * 1e6
        bare = statistics.median(times[f"{name}.bare"]) * 1e6
        metrics += [
            Metric(
                f"mcp.{kind}.serve_tools.p50_us",
                f"MCP call, {kind} tool, serve_tools, p50",
                ours,
                "µs",
            ),
            Metric(
                f"mcp.{kind}.bare.p50_us",
                f"MCP call, {kind} tool, bare MCPServer, p50 (floor)",
                bare,
                "µs",
            ),
            Metric(
                f"mcp.{kind}.ratio",
                f"MCP call, {kind} tool: serve_tools / bare MCPServer, p50",
                ours / bare,
                "x",
            ),
        ]
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    """Print these rows (not saved: ``python -m benchmarks`` keeps the results)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mcp_bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check that it runs")
    args = parser.parse_args(argv)
    print(render(bench_mcp(50 if args.quick else 2_000), None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
