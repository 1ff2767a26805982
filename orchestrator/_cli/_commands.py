"""The `orchestrator` command: list, show, draw, export, view and replay saved runs.

Click parses the command line (one small dependency-free package, the most used and best kept
CLI library for Python); rich draws. This is the only module of the library that writes to the
terminal: ``--json`` output and errors go through `click.echo`, the rest through a rich
`Console`.

Exit codes follow diff's: 0 when all went well (and a replay matched), 1 when a replay did
not match, 2 on trouble (a bad store URL, a missing id, a damaged store, a wrong option).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Generator
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn, cast

import click
from rich.console import Console

from orchestrator import OrchestratorError, State, StateInfo
from orchestrator.testing import ReplayModel
from stores import (
    OpenedStore,
    PostgresStore,
    SQLiteStore,
    encode_entry,
    open_store,
    redact_url,
)
from stores.backend import validate_id

from .._viewing._jsontext import dumps
from .._viewing._reading import Readable, agent_of, read_tree
from .._viewing._viewer import HOST, Viewer, serve
from .._viewing._views import info_data, prompt_holders, state_data, status_kind
from ._open import open_existing
from ._render import runs_table, show_view, tree_view
from ._replaying import load_factory, pick_agent, replay

__all__ = ("cli",)

TROUBLE = 2
MISMATCH = 1
_STOPS = ("any", "none", "finish", "until", "limit", "permission")
_AGO = re.compile(r"(\d+)\s*([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_STORE_HELP = (
    "STORE is a URL (sqlite:///runs.db, file:///var/runs, postgresql://user@host/db, memory:) or"
    " a path: a .db file is an SQLite store, a folder a FileStore."
)


class Trouble(click.ClickException):
    """A one-line error on stderr, exit code 2: what went wrong and what to do."""

    exit_code = TROUBLE

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))

    def show(self, file: Any = None) -> None:
        """Print ``orchestrator: error: <message>`` on stderr."""
        click.echo(f"orchestrator: error: {self.format_message()}", err=True, file=file)


def _fail(message: str) -> NoReturn:
    raise Trouble(message)


@contextlib.contextmanager
def _trouble() -> Generator[None]:
    """Turn the errors a store or a bad argument raises into one clear line, no traceback."""
    try:
        yield
    except (LookupError, OrchestratorError, ValueError, OSError) as error:
        _fail(str(error) or type(error).__name__)


@contextlib.contextmanager
def _store(target: str) -> Generator[OpenedStore]:
    """The store `target` names, closed afterwards; its errors made one line."""
    with _trouble():
        store = open_existing(target)
        try:
            yield store
        finally:
            if isinstance(store, SQLiteStore | PostgresStore):  # what holds a connection
                store.close()


def _resolve(store: Readable, target: str, state_id: str) -> str:
    """The full id of the State `state_id` names: itself, or the one id it starts."""
    if not state_id:
        _fail("The State id is empty: `orchestrator runs STORE` lists the ids.")
    validate_id(state_id, "State id")
    infos: list[StateInfo] = store.list()
    ids = [info.id for info in infos]
    if state_id in ids:
        return state_id
    starting = [known for known in ids if known.startswith(state_id)]
    if len(starting) == 1:
        return starting[0]
    if starting:
        shown = ", ".join(starting[:3]) + (", ..." if len(starting) > 3 else "")
        _fail(f"{state_id!r} starts {len(starting)} State ids ({shown}): give more of it.")
    shown = redact_url(target)
    _fail(f"No State {state_id!r} in {shown}: `orchestrator runs {shown}` lists the ids.")


def _load(store: Readable, target: str, state_id: str) -> State:
    """The State `state_id` names: loaded by its id, else by the one id it starts."""
    if state_id:
        validate_id(state_id, "State id")
        with contextlib.suppress(LookupError):
            return store.load(state_id)
    return store.load(_resolve(store, target, state_id))


def _console() -> Console:
    """A console for stdout: 120 columns when it is not a terminal and COLUMNS is not set.

    Rich would take 80, which squeezes the tables of a log file or a pipe.
    """
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, width=120)
    return console


def _echo_json(value: Any) -> None:
    click.echo(dumps(value, indent=2))


def _since(text: str) -> datetime:
    """A moment from ``2026-12-01``, ``2026-12-01T09:30`` (local time unless it says) or ``2h``."""
    ago = _AGO.fullmatch(text.strip())
    if ago is not None:
        amount, unit = ago.groups()
        return datetime.now(UTC) - timedelta(**{_UNITS[unit]: int(amount)})
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a time: give a date (2026-12-01), a date and time"
            " (2026-12-01T09:30, local unless it has an offset) or an age (30m, 2h, 7d, 1w)."
        ) from None
    return moment.astimezone() if moment.tzinfo is None else moment


def _options(
    context: click.Context, param: click.Parameter, text: str | None
) -> dict[str, Any] | None:
    """The JSON object ``--options`` gives, or None when it is not given."""
    if text is None:
        return None
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return cast("dict[str, Any]", value)
    raise click.BadParameter(
        f"{text!r} is not a JSON object: give the options the agents' model sends, as"
        """ the model's .options shows them, e.g. '{"temperature": 0.2}'."""
    )


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=_STORE_HELP,
)
@click.version_option(package_name="orchestrator", prog_name="orchestrator")
def cli() -> None:
    """See and replay the runs saved in an orchestrator store."""


_json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON instead of text, for programs."
)


@cli.command(epilog=_STORE_HELP)
@click.argument("store")
@click.option("--parent", metavar="ID", help="Only the subagent States that State ID started.")
@click.option("--roots", is_flag=True, help="Only the States no tool call started.")
@click.option("--agent", metavar="NAME", help="Only the States the agent NAME ran.")
@click.option(
    "--stopped",
    type=click.Choice(_STOPS),
    help="Only the States with this stop (any: stopped at all; none: no stop recorded).",
)
@click.option(
    "--since",
    metavar="WHEN",
    help="Only the States updated since WHEN: 2026-12-01, 2026-12-01T09:30, or an age: 2h, 7d.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=0),
    default=50,
    show_default=True,
    help="Show at most this many, the most recently updated first (0: all).",
)
@_json_option
def runs(
    store: str,
    parent: str | None,
    roots: bool,
    agent: str | None,
    stopped: str | None,
    since: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List the States saved in STORE, the most recently updated first."""
    moment = None if since is None else _since(since)
    with _store(store) as opened:
        parent_id = None if parent is None else _resolve(opened, store, parent)
        infos: list[StateInfo] = opened.list(parent_id=parent_id)
        if roots:
            infos = [info for info in infos if info.parent_id is None]
        if moment is not None:
            infos = [info for info in infos if info.updated_at and info.updated_at >= moment]
        if stopped == "any":
            infos = [info for info in infos if info.stopped is not None]
        elif stopped is not None:
            infos = [info for info in infos if status_kind(info.stopped) == stopped]
        # The agent's name is in the history, not in a State's info: each State shown is read.
        names: dict[str, str | None] = {}
        if agent is not None:
            names = {info.id: agent_of(opened, info) for info in infos}
            infos = [info for info in infos if names[info.id] == agent]
        total = len(infos)
        shown = infos[:limit] if limit else infos
        rows = [
            (info, names[info.id] if info.id in names else agent_of(opened, info)) for info in shown
        ]
    if as_json:
        _echo_json([info_data(info, agent=name) for info, name in rows])
        return
    console = _console()
    if not rows:
        console.print("No States match.", style="dim")
        return
    console.print(runs_table(rows))
    if total > len(rows):
        console.print(
            f"{len(rows)} of {total} States shown: --limit {total} shows all.", style="dim"
        )


@cli.command(epilog=_STORE_HELP)
@click.argument("store")
@click.argument("state_id", metavar="ID")
@click.option(
    "--full", is_flag=True, help="Show long texts whole (they are cut at 300 characters)."
)
@_json_option
def show(store: str, state_id: str, full: bool, as_json: bool) -> None:
    """Show one State: its conversation, tool calls and results, usage, cost, timings, stop.

    ID is a State's id, or the start of one that no other id starts with.
    """
    with _store(store) as opened:
        state = _load(opened, store, state_id)
        holders = prompt_holders(state, opened.load) if as_json else {}
    if as_json:
        _echo_json(state_data(state, holders=holders))
        return
    _console().print(show_view(state, None if full else 300))


@cli.command(epilog=_STORE_HELP)
@click.argument("store")
@click.argument("state_id", metavar="ID")
@_json_option
def tree(store: str, state_id: str, as_json: bool) -> None:
    """Draw the tree of subagents under one State, with status, turns, tokens and cost.

    Each subagent is shown under the tool call that started it; usage and cost include the
    subagents below.
    """
    with _store(store) as opened:
        full_id = _resolve(opened, store, state_id)
        root = next(info for info in opened.list() if info.id == full_id)
        node = read_tree(opened, root)
    if as_json:
        _echo_json(node.data())
        return
    _console().print(tree_view(node))


@cli.command(epilog=_STORE_HELP)
@click.argument("store")
@click.argument("state_id", metavar="ID")
@click.option(
    "--json", "as_json", is_flag=True, help="Accepted like on every read command: always JSON."
)
def export(store: str, state_id: str, as_json: bool) -> None:
    """Print the history of one State as JSON lines, one entry a line, in the stored format.

    `stores.decode_entry` reads each line back; `State(history=...)` rebuilds the State.
    """
    with _store(store) as opened:
        state = _load(opened, store, state_id)
    for entry in state.history:
        click.echo(encode_entry(entry))


@cli.command(epilog=_STORE_HELP)
@click.argument("store")
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=0,
    show_default=True,
    help="The port to listen on, on 127.0.0.1 (0: a free one the system picks).",
)
def view(store: str, port: int) -> None:
    """Serve a read-only web page on 127.0.0.1 showing the runs in STORE.

    The page lists the runs and shows, for the one picked, the tree of its subagents, a
    timeline where tool calls and subagents that ran at once are bars side by side, and each
    State's messages. It only reads the store; reload the page to see a run that is still
    going. Ctrl+C stops it.
    """
    with _store(store) as opened:
        with _trouble():
            opened.list(limit=1)  # a damaged store is said now, not on the page
        viewer = Viewer(opened, store)

        def ready(url: str) -> None:
            click.echo(f"Serving {viewer.name} read-only at {url}")
            click.echo("Press Ctrl+C to stop.")

        try:
            serve(viewer, port, ready)
        except OSError as error:
            _fail(
                f"Cannot listen on {HOST}:{port}: {error.strerror or error}. Give another"
                " --port, or --port 0 for a free one."
            )
    click.echo("Stopped.")


@cli.command("serve")
@click.option(
    "--agents",
    "factory",
    metavar="MODULE:FUNCTION",
    required=True,
    help="A function that takes nothing and returns the agents to serve (a list of named"
    " agents, or a dict of name -> Agent), e.g. myapp.agents:build.",
)
@click.option(
    "--store", "target", metavar="STORE", required=True, help="Where runs are saved. " + _STORE_HELP
)
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=8000,
    show_default=True,
    help="The port to listen on (0: a free one the system picks).",
)
@click.option(
    "--token",
    envvar="ORCHESTRATOR_TOKEN",
    help="The bearer token every request must send (or ORCHESTRATOR_TOKEN); needed to listen"
    " on anything but this machine.",
)
@click.option(
    "--allow-host",
    "hosts",
    multiple=True,
    metavar="NAME",
    help="A Host name clients reach the service by (repeat it). Default: 127.0.0.1 and"
    " localhost, or any name when listening beyond this machine (the token guards it).",
)
@click.option(
    "--allow-origin",
    "origins",
    multiple=True,
    metavar="ORIGIN",
    help="A browser origin, besides the service's own, whose pages may start and decide runs.",
)
@click.option(
    "--max-runs",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="How many runs run at once; more are refused (429) until one ends.",
)
@click.option(
    "--lease",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="Seconds after this process dies before another may take its runs over (a store"
    " with run leases: SQLite, PostgreSQL); cancels from elsewhere are seen within a fifth.",
)
@click.option(
    "--a2a",
    "a2a",
    is_flag=True,
    help="Also serve each agent over A2A 1.0 at /a2a/<name>/ (its card at"
    " /a2a/<name>/.well-known/agent-card.json); needs pip install 'orchestrator[a2a]'.",
)
def serve_command(
    factory: str,
    target: str,
    host: str,
    port: int,
    token: str | None,
    hosts: tuple[str, ...],
    origins: tuple[str, ...],
    max_runs: int,
    lease: float,
    a2a: bool,
) -> None:
    """Serve agents over HTTP: start, follow, approve and cancel runs (REST, SSE, AG-UI, Vercel).

    Runs are saved in STORE as they go, so another process sharing it can follow them, and a
    run that waits for approval can be decided after a restart. Ctrl+C stops the service: each
    run still going is cancelled and saved.
    """
    from orchestrator.apps import DEFAULT_HOSTS

    from ._serving import is_loopback, load_agents, serve_runs

    if not is_loopback(host) and not token:
        _fail(
            f"Listening on {host} lets other machines run agents: give a token (--token or"
            " ORCHESTRATOR_TOKEN, e.g. from python -c 'import secrets;"
            " print(secrets.token_urlsafe())'), or listen on 127.0.0.1."
        )
    with _trouble():
        agents = load_agents(factory)
    allowed = hosts or (DEFAULT_HOSTS if is_loopback(host) else ("*",))
    with _trouble():
        opened = open_store(target)  # a new store is made: the service writes runs there

    def ready(url: str) -> None:
        click.echo(f"Serving {len(agents)} agent(s) at {url} (runs saved in {redact_url(target)})")
        click.echo("Press Ctrl+C to stop.")

    try:
        with _trouble():
            serve_runs(
                agents,
                opened,
                host=host,
                port=port,
                token=token,
                hosts=allowed,
                origins=origins,
                max_runs=max_runs,
                lease=lease,
                ready=ready,
                a2a=a2a,
            )
    finally:
        opened.close()
    click.echo("Stopped.")


@cli.command("replay", epilog=_STORE_HELP)
@click.argument("store")
@click.argument("state_id", metavar="ID")
@click.option(
    "--agents",
    "factory",
    metavar="MODULE:FUNCTION",
    required=True,
    help="A function that takes the model and returns the agents by name, e.g."
    " myapp.agents:build (imported from the working folder too).",
)
@click.option(
    "--agent",
    metavar="NAME",
    help="The agent to run the State with (default: the one its first run recorded).",
)
@click.option(
    "--options",
    metavar="JSON",
    callback=_options,
    help="The request options of the model the agents would use (its .options, a JSON object),"
    """ compared with the recorded ones, e.g. '{"temperature": 0.2}' (default: not compared).""",
)
@_json_option
def replay_command(
    store: str,
    state_id: str,
    factory: str,
    agent: str | None,
    options: dict[str, Any] | None,
    as_json: bool,
) -> None:
    """Run a saved State and its subagents again, offline, and say whether it matched.

    The model is a ReplayModel: each request gets the reply recorded for it, and the first
    request that differs is reported. The tools run for real. FUNCTION(model) must return a
    dict of agent name -> Agent, every agent (subagents too) built with that model.

    The instructions and tool specs of each request are compared with the recorded prompt;
    the options too when --options gives those of the model the agents would use.

    Exit code 0 when the replay matched, 1 when it did not (the first difference is shown).
    """
    with _store(store) as opened:
        root = _load(opened, store, state_id)
        with _trouble():
            model = ReplayModel(root, options=options)
    with _trouble():
        build = load_factory(factory)
        name, chosen = pick_agent(build(model), root, agent, factory)
        outcome = replay(root, model, chosen, name)
    if as_json:
        _echo_json(outcome.data())
    elif outcome.matched:
        _console().print(
            f"matched: {outcome.requests} requests of {outcome.states} States answered from"
            f" the recording ({outcome.runs} run{'s' if outcome.runs != 1 else ''} of agent"
            f" {name!r})",
            style="green",
        )
    else:
        console = _console()
        console.print("did not match", style="bold red")
        click.echo(outcome.difference)
    if not outcome.matched:
        raise SystemExit(MISMATCH)


@cli.command("mcp-serve")
@click.argument("factory", metavar="MODULE:FUNCTION")
@click.option("--http", "over_http", is_flag=True, help="Serve streamable HTTP, not stdio.")
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=8000,
    show_default=True,
    help="With --http: the port on 127.0.0.1 (0: a free one the system picks).",
)
@click.option("--path", default="/mcp", show_default=True, help="With --http: the endpoint.")
def mcp_serve_command(factory: str, over_http: bool, port: int, path: str) -> None:
    """Serve an agent, or tools, to MCP clients over stdio or streamable HTTP.

    FUNCTION takes nothing and returns an Agent (one tool that runs it on a prompt), a list of
    tools, or a server made with orchestrator.mcp.serve_tools / serve_agent. Over HTTP it
    listens on 127.0.0.1 only and prints the endpoint's URL.
    """
    from ._mcp import load_server, serve_http, serve_stdio

    with _trouble():
        server = load_server(factory)
    if not over_http:
        serve_stdio(server)
        return

    def ready(url: str) -> None:
        click.echo(f"Serving MCP at {url}", nl=True)

    with _trouble():
        serve_http(server, port=port, path=path, ready=ready)
    click.echo("Stopped.")
