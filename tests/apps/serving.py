"""An app served by uvicorn on 127.0.0.1 for the length of a block (asyncio: uvicorn has no
trio loop), for the tests that reach it as real clients do."""

from __future__ import annotations

import socket
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager

import anyio
import httpx
import uvicorn
from starlette.types import ASGIApp

__all__ = ("serving",)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@asynccontextmanager
async def serving(app: ASGIApp) -> AsyncGenerator[str]:
    """`app` served on a free port of 127.0.0.1 until the block ends; its base URL.

    The block starts once the server answers (it binds in its own task): at most 10 s.
    """
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    base = f"http://127.0.0.1:{port}"
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve)
        async with httpx.AsyncClient(base_url=base) as client:
            with anyio.fail_after(10):
                while True:
                    try:
                        await client.get("/")
                        break
                    except httpx.ConnectError:
                        await anyio.sleep(0.02)
        try:
            yield base
        finally:
            server.should_exit = True
