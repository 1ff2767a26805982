"""The Model Context Protocol, both ways (``pip install 'orchestrator[mcp]'``).

Tools from MCP servers: `MCPToolset`. Our tools, or an agent, served to MCP clients:
`serve_tools`, `serve_agent`, then `run_stdio` or `http_app`.

Tools from servers
------------------

An `MCPToolset` names a server, run as a subprocess that speaks over stdio
(`MCPToolset.stdio`) or reached over streamable HTTP (`MCPToolset.http`), and goes in
``Agent(tools=[...])`` like any tool. Built on the official ``mcp`` SDK.

- **Connections.** Each run connects when it starts and closes the connection when it returns
  (a stdio server's process is stopped then). Inside ``async with toolset:`` every run shares
  the one connection the block opened, and the block closes it. Either way the connection
  lives in a task group of its owner, so nothing outlives the run or the block.
- **Tools.** All the server's tools, or the ones named in ``tools=``, each shown to the model
  with the server's description and input schema as they are, under an optional ``prefix``.
  A tool the server marks ``readOnlyHint`` is `read_only`, which `AllowByReadOnly` allows.
- **Results.** Text, images, structured content and embedded text resources become the tool's
  result; a result the server marks as an error is an error result the model reads.
- **Failures.** Arguments that break the input schema give an ``input_error`` result before
  anything is sent. A call that takes longer than ``timeout`` seconds, or a server that fails
  or dies, gives an error result; the run goes on. A cancelled call is cancelled on the server
  too (the SDK sends it ``notifications/cancelled``).

Example:
    ```python
    from orchestrator import Agent
    from orchestrator.mcp import MCPToolset

    time = MCPToolset.stdio("uvx", ["mcp-server-time"], prefix="time_")
    agent = Agent("openai:gpt-4o", tools=[time])
    ```

Serving
-------
`serve_tools` lists ``@tool`` tools (their names, descriptions and input schemas, as a model
sees them) and runs each call through the permissions given: a call they deny or defer is not
run. `serve_agent` serves one tool that runs the agent on a prompt, reporting its model replies,
tool calls and subagents as MCP progress notifications. Wrong arguments and failures are error
results; a client that cancels a call cancels it. Both return the SDK's `mcp.server.Server`.

Example:
    ```python
    from orchestrator import tool
    from orchestrator.mcp import run_stdio, serve_tools

    @tool(description="Add two integers.", read_only=True)
    def add(a: int, b: int) -> int:
        return a + b

    server = serve_tools([add], name="calculator")
    # anyio.run(run_stdio, server)  # or uvicorn.run(http_app(server))
    ```
"""

from ._client import MCPServerError as MCPServerError
from ._client import MCPTool as MCPTool
from ._client import MCPToolset as MCPToolset
from ._serve import http_app as http_app
from ._serve import run_stdio as run_stdio
from ._serve import serve_agent as serve_agent
from ._serve import serve_tools as serve_tools

__all__ = (
    "MCPServerError",
    "MCPTool",
    "MCPToolset",
    "http_app",
    "run_stdio",
    "serve_agent",
    "serve_tools",
)
