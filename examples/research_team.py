"""A research team: a lead splits a question, researchers dig through local files in parallel.

The lead agent splits the question into sub-questions and gives each to a researcher subagent;
the researchers run at the same time, each on its own child State. A researcher searches the
small corpus in ``examples/data/``, reads the files that match (several at once), and its
tools write what they found into the researcher's typed state (`Notes`); the lead's `research`
tool carries those findings up into the lead's typed state, and the lead merges the answers.
Every State of the tree is saved in an SQLite file, which the ``orchestrator`` command reads.

Offline by default: one `FakeModel` plays every agent, deciding each reply from the request
(which tools it offers, what the messages say), never from a fixed script. It pauses
``--latency`` seconds per request (and a quarter of that per tool call), standing in for a real
model's time, so the live tree and the viewer's timeline have something to show. With
``--model openai:gpt-4o-mini`` or ``--model anthropic:claude-haiku-4-5`` (and its API key set)
a real model does the work instead.

    python examples/research_team.py [--question TEXT] [--store runs.db] [--model M]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import anyio
import pydantic_core
from pydantic import BaseModel
from rich.console import Console

from orchestrator import (
    Agent,
    ConsoleReporter,
    Message,
    Reply,
    Reporter,
    RunStartEntry,
    State,
    Tool,
    ToolCall,
    ToolError,
    ToolResult,
    ToolResultEntry,
    Usage,
    tool,
)
from orchestrator.models import Model, Request, TextCallback
from orchestrator.testing import FakeModel, tool_call
from stores import SQLiteStore

DATA = Path(__file__).resolve().parent / "data"
QUESTION = (
    "What was the root cause of the checkout outage on March 12, how was it detected,"
    " and what changed after the outage?"
)
DEFAULT_STORE = Path(tempfile.gettempdir()) / "orchestrator-demo" / "research_team.db"
KEYS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
_STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "did",
        "do",
        "does",
        "for",
        "from",
        "has",
        "have",
        "how",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "the",
        "this",
        "that",
        "to",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "with",
    ]
)


# -- typed state -------------------------------------------------------------------------------


class Finding(BaseModel):
    """A line of a file that answers part of a question."""

    source: str  # file:line
    text: str


def union(current: list[Any] | None, new: list[Any]) -> list[Any]:
    """Merge two lists, keeping each item once, in the order first seen.

    Two researchers may find the same line: the lead keeps it once.
    """
    merged: dict[str, Any] = {}
    for item in [*(current or []), *new]:
        merged.setdefault(json.dumps(pydantic_core.to_jsonable_python(item), sort_keys=True), item)
    return list(merged.values())


class Notes(BaseModel):
    """What a researcher's tools write into its State, and the lead's `research` tool into
    the lead's: the searches made, the files read, and the lines found."""

    queries: list[str] = []
    sources: Annotated[list[str], union] = []
    findings: Annotated[list[Finding], union] = []


# -- the corpus and its tools ------------------------------------------------------------------


_SUFFIXES = ("wards", "ation", "ion", "ing", "ed", "es", "s")


def stem(word: str) -> str:
    """A crude stem, enough for a small corpus: 'detected' and 'detection' both give 'detect'."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            word = word[: -len(suffix)]
            break
    return word.removesuffix("e")[:7]


def keywords(text: str) -> list[str]:
    """The words of `text` that carry meaning, in order."""
    words = re.findall(r"[A-Za-z0-9]+", text)
    return [word for word in words if word.lower() not in _STOP_WORDS and len(word) > 1]


def stems(text: str) -> set[str]:
    """The stems of the words of `text` that carry meaning."""
    return {stem(word.lower()) for word in keywords(text)}


class Corpus:
    """The text files of a folder, and how rare each word is in them (rare words weigh more)."""

    def __init__(self, folder: Path) -> None:
        self.files = {path.name: path for path in sorted(folder.glob("*.txt"))}
        self.lines = {
            name: path.read_text(encoding="utf-8").splitlines() for name, path in self.files.items()
        }
        every = [line for lines in self.lines.values() for line in lines]
        counts: dict[str, int] = {}
        for line in every:
            for word in stems(line):
                counts[word] = counts.get(word, 0) + 1
        self.weight = {word: math.log(len(every) / count) for word, count in counts.items()}

    def score(self, query: str, line: str) -> float:
        """How well `line` answers `query`: the weights of the words they share."""
        return sum(self.weight.get(word, 0.0) for word in stems(query) & stems(line))

    def matching(self, name: str, query: str) -> list[tuple[float, int, str]]:
        """``(score, line number, line)`` of each line of file `name` matching, best first.

        A file's first line is its title, not a finding: it is left out.
        """
        found = [
            (self.score(query, line), number, line)
            for number, line in enumerate(self.lines[name][1:], 2)
        ]
        return sorted((hit for hit in found if hit[0] > 0), key=lambda hit: (-hit[0], hit[1]))


CORPUS = Corpus(DATA)


def make_tools(corpus: Corpus, pause: float) -> list[Tool]:
    """The researcher's tools over `corpus`; each call takes `pause` seconds more."""

    @tool
    async def search(query: str) -> ToolResult:
        """Search the team's documents; the files that match best come first.

        Args:
            query: Words to look for.
        """
        await anyio.sleep(pause)
        ranked: list[tuple[float, str, str]] = []
        for name in corpus.files:
            hits = corpus.matching(name, query)
            if hits:
                ranked.append((sum(hit[0] for hit in hits[:3]), name, hits[0][2]))
        ranked.sort(key=lambda item: (-item[0], item[1]))
        lines = [f"{name} (score {score:.1f}): {best}" for score, name, best in ranked[:4]]
        message = "\n".join(lines) if lines else f"Nothing matches {query!r}."
        return ToolResult(message, state={"queries": [query]})

    @tool
    async def read(path: str, focus: str) -> ToolResult:
        """Read one document, with its line numbers.

        Args:
            path: The file's name, as search gave it.
            focus: What you are looking for in it: its best matching lines are kept as findings.
        """
        await anyio.sleep(pause)
        if path not in corpus.files:
            raise ToolError(f"No document {path!r}; there are: {', '.join(corpus.files)}.")
        found = [
            Finding(source=f"{path}:{number}", text=line)
            for _, number, line in corpus.matching(path, focus)[:3]
        ]
        lines = corpus.lines[path]
        numbered = "\n".join(f"{path}:{number}: {line}" for number, line in enumerate(lines, 1))
        return ToolResult(numbered, state={"sources": [path], "findings": found})

    return [search, read]


def make_research(researcher: Agent) -> Tool:
    """The lead's tool: a researcher subagent answers one sub-question on a child State."""

    @tool
    async def research(question: str) -> ToolResult:
        """Give one sub-question to a researcher, who searches and reads the documents.

        Args:
            question: One self-contained sub-question.
        """
        notes = State(messages=[Message.user(question)])
        answer = await researcher.arun(notes)  # linked to this call as its child
        found: dict[str, Any] = {key: notes.get(key) or [] for key in ("sources", "findings")}
        return ToolResult(str(answer), state=found)

    return research


# -- the offline model -------------------------------------------------------------------------


def _reply(text: str, calls: list[ToolCall], request: Request) -> Reply:
    """A reply with token counts estimated as a provider would bill them (4 characters each)."""
    seen = sum(len(message.text) + 40 for message in request.messages)
    written = len(text) + sum(len(repr(call.args)) + 20 for call in calls)
    usage = Usage(input_tokens=seen // 4 + 150, output_tokens=written // 4 + 5, requests=1)
    stop = "tool_use" if calls else "end_turn"
    return Reply(Message.assistant(text, calls), usage, stop_reason=stop, model="offline")


def split(question: str) -> list[str]:
    """Sub-questions: the parts of `question` between commas and 'and'."""
    parts = [part.strip(" ?.") for part in re.split(r",\s*(?:and\s+)?|\s+and\s+", question)]
    return [part[0].upper() + part[1:] + "?" for part in parts if part]


def lead_step(request: Request) -> Reply:
    """The lead: ask a researcher per sub-question at once, then merge what they said."""
    question, last = request.messages[0].text, request.messages[-1]
    if not last.tool_results:
        calls = [tool_call("research", question=part) for part in split(question)]
        return _reply(
            f"I split the question in {len(calls)} and ask a researcher each.", calls, request
        )
    asked = request.messages[-2].tool_calls
    sections = [
        f"{call.args['question']}\n{result.text}"
        for call, result in zip(asked, last.tool_results, strict=True)
    ]
    return _reply("\n\n".join(sections), [], request)


def researcher_step(request: Request) -> Reply:
    """A researcher: search, read the two best files at once, then answer from their lines."""
    question, last = request.messages[0].text, request.messages[-1]
    if not last.tool_results:
        return _reply("", [tool_call("search", query=" ".join(keywords(question)))], request)
    called = request.messages[-2].tool_calls
    if called[0].name == "search":
        names = re.findall(r"^(\S+\.txt) \(score", last.tool_results[0].text, re.MULTILINE)
        reads = [tool_call("read", path=name, focus=question) for name in names[:2]]
        return _reply("", reads, request) if reads else _reply("I found nothing.", [], request)
    hits: list[tuple[float, str, str]] = []
    for result in last.tool_results:
        for line in result.text.splitlines():
            source, _, text = line.partition(": ")
            if not source.endswith(":1"):  # a title
                hits.append((CORPUS.score(question, text), source, text))
    hits.sort(key=lambda hit: -hit[0])
    best = [hit for hit in hits[:3] if hits[0][0] > 0 and hit[0] >= hits[0][0] / 2]
    answer = "\n".join(f"- {text} ({source})" for _, source, text in best)
    return _reply(answer or "The documents do not say.", [], request)


def decide(request: Request) -> Reply:
    """Play whichever agent asks: the tools a request offers say who it is."""
    offered = {spec.name for spec in request.tools}
    return lead_step(request) if "research" in offered else researcher_step(request)


class Paced:
    """A model that waits `latency` seconds before `inner` answers, as a real one takes time."""

    def __init__(self, inner: Model, latency: float) -> None:
        self.inner = inner
        self.latency = latency

    @property
    def name(self) -> str:
        """The inner model's name."""
        return self.inner.name

    @property
    def context_window(self) -> int | None:
        """The inner model's context window."""
        return self.inner.context_window

    async def respond(self, request: Request, *, on_text: TextCallback | None = None) -> Reply:
        """Wait, then ask the inner model."""
        await anyio.sleep(self.latency)
        return await self.inner.respond(request, on_text=on_text)


# -- the team ----------------------------------------------------------------------------------


def build(model: Model | str, *, corpus: Corpus = CORPUS, pause: float = 0.0) -> dict[str, Agent]:
    """The team's agents by name, all asking `model` (the shape ``orchestrator replay`` takes)."""
    researcher = Agent(
        model,
        name="researcher",
        description="Answers one sub-question from the team's documents.",
        instructions=(
            "Answer the question from the team's documents. Search first, then read the most"
            " relevant files (several at once), then answer in two or three short bullet points,"
            " each ending with its source as (file:line)."
        ),
        tools=make_tools(corpus, pause),
        state_schema=Notes,
        max_turns=8,
    )
    lead = Agent(
        model,
        name="lead",
        instructions=(
            "Split the user's question into two to four self-contained sub-questions and call"
            " research once for each, all in the same turn. Then answer each part from what the"
            " researchers found, keeping their sources."
        ),
        tools=[make_research(researcher)],
        state_schema=Notes,
        max_turns=4,
    )
    return {"lead": lead, "researcher": researcher}


def offline_model(latency: float) -> Model:
    """The offline model: `decide` for every request (a hundred at most), paced."""
    return Paced(FakeModel([decide] * 100, name="offline"), latency)


def real_model(spec: str) -> str:
    """`spec` if it names a provider whose key is set; else say what is missing and exit."""
    provider = spec.partition(":")[0]
    key = KEYS.get(provider)
    if key is None:
        sys.exit(f"research_team.py: --model takes openai:NAME or anthropic:NAME, not {spec!r}.")
    if not os.environ.get(key):
        sys.exit(f"research_team.py: --model {spec} needs {key} set in the environment.")
    return spec


# -- showing it --------------------------------------------------------------------------------


def agent_of(state: State) -> str:
    """The name of the agent that ran `state` (its first run_start records it)."""
    start = next((e for e in state.history if isinstance(e, RunStartEntry)), None)
    return (start.content.agent if start else None) or "?"


class Lines(Reporter):
    """The run as plain lines, for a log or a pipe (a terminal gets the live tree instead)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    def say(self, state: State, text: str) -> None:
        """Print one line: the time, the State, what happened."""
        depth = "  " if state.parent_id else ""
        elapsed = time.perf_counter() - self.started
        print(f"[{elapsed:5.2f}s] {depth}{agent_of(state)} {state.id[:8]}: {text}", flush=True)

    def on_run_start(self, state: State) -> None:
        """A State starts running."""
        self.say(state, f"starts: {state.messages[0].text[:70]}")

    def on_tool_start(self, state: State, call: ToolCall) -> None:
        """A tool call starts."""
        args = ", ".join(f"{key}={value!r}" for key, value in call.args.items())
        self.say(state, f"calls {call.name}({args[:70]})")

    def on_run_end(self, state: State, error: BaseException | None) -> None:
        """A State's run ends."""
        self.say(state, "done" if error is None else f"failed: {error!r}")


def tree_lines(state: State, depth: int = 0, via: str = "") -> list[str]:
    """`state` and the subagents under it, one line each, with what each found."""
    usage = state.usage
    findings = len(state.get("findings") or [])
    sources = len(state.get("sources") or [])
    lines = [
        f"{'   ' * depth}{via}{agent_of(state)} {state.id[:8]}  turns {state.turn}  tokens"
        f" {usage.input_tokens:,}→{usage.output_tokens:,}  {findings} findings from"
        f" {sources} files"
    ]
    for entry in state.history:
        if isinstance(entry, ToolResultEntry):
            for child_id in entry.child_ids:
                lines += tree_lines(state.child(child_id), depth + 1, f"{entry.call.name} → ")
    return lines


def command() -> str:
    """How to run the ``orchestrator`` command from here."""
    script = Path(sys.executable).with_name("orchestrator")
    if not script.exists():
        return f"{sys.executable} -m orchestrator"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


async def research(question: str, path: Path, model: Model | str, pause: float) -> State:
    """Run the team on `question`, saving every State in the SQLite file `path`."""
    reporter: Reporter = (
        ConsoleReporter(Console(), show_text=False) if sys.stdout.isatty() else Lines()
    )
    lead = build(model, pause=pause)["lead"]
    state = State(messages=[Message.user(question)])
    async with SQLiteStore(path) as store:
        await lead.copy(store=store, reporter=reporter).arun(state)
    return state


def report(state: State, path: Path, took: float) -> None:
    """Print the answer, the tree, and the commands that look at the saved run."""
    children = state.children
    print()
    print(f"question: {state.messages[0].text}")
    print(f"answer ({len(children)} researchers in parallel, {took:.1f} s):")
    for line in str(state.answer).splitlines():
        print(f"  {line}")
    print()
    print("sources the lead's state holds: " + ", ".join(state.get("sources") or []))
    print()
    print("tree:")
    for line in tree_lines(state):
        print(f"  {line}")
    run = command()
    print()
    print(f"saved in {path}; look at it with:")
    print(f"  {run} runs {path}")
    print(f"  {run} tree {path} {state.id}")
    print(f"  {run} show {path} {state.id}")
    print(f"  {run} view {path}")
    if Path.cwd() / "examples" / "research_team.py" == Path(__file__).resolve():
        # build() is importable from here: the run replays offline, tools and all.
        print(f"  {run} replay {path} {state.id} --agents examples.research_team:build")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--question", default=QUESTION, help="What to ask the team.")
    parser.add_argument(
        "--store",
        type=Path,
        default=DEFAULT_STORE,
        help=f"The SQLite file (default {DEFAULT_STORE}).",
    )
    parser.add_argument(
        "--model",
        help="A real model, e.g. openai:gpt-4o-mini or anthropic:claude-haiku-4-5 (its key set).",
    )
    parser.add_argument(
        "--latency",
        type=float,
        default=0.2,
        help="Seconds the offline model takes per request (a quarter of it per tool call).",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse(sys.argv[1:])
    model = real_model(args.model) if args.model else offline_model(args.latency)
    pause = 0.0 if args.model else args.latency / 4
    args.store.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    state = anyio.run(research, args.question, args.store, model, pause)
    report(state, args.store, time.perf_counter() - started)
