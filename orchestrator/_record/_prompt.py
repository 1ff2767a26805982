"""What the model was told: the instructions, tool specs and options of a request.

A `Prompt` is recorded once per State (a `PromptEntry`) before the first request that uses it;
each request names it by its `digest`. The digest is the BLAKE2b hash of the prompt's canonical
JSON, so the same prompt always has the same digest, and a changed prompt never passes as the
recorded one (it is checked whenever a prompt is made, a stored one included).
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from .._base._json import (
    FrozenDict,
    FrozenList,
    freeze,
    freeze_values,
    thaw,
    valid_fields,
    valid_text,
)

__all__ = ("DIGEST_CHARS", "Prompt", "SpecLike", "prompt_difference")

DIGEST_CHARS = 16
"""Hex characters of a prompt's digest (BLAKE2b-64): unique among the prompts of one State."""

_DIFF_LINES = 12


class SpecLike(Protocol):
    """What `Prompt.of` reads of a tool spec (an `orchestrator.ToolSpec` is one)."""

    @property
    def name(self) -> str:
        """The tool's name."""
        ...

    @property
    def description(self) -> str:
        """What the model is told the tool does."""
        ...

    @property
    def input_schema(self) -> Mapping[str, Any]:
        """The JSON schema of the tool's arguments."""
        ...


def _canonical(instructions: str | None, tools: Sequence[Any], options: Mapping[str, Any]) -> str:
    # Plain dicts and lists: json's C encoder takes the frozen ones the slow way (4x).
    return json.dumps(
        {"instructions": instructions, "options": thaw(options), "tools": thaw(tools)},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def _digest(text: str) -> str:
    data = text.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=DIGEST_CHARS // 2).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class Prompt:
    """The instructions, tool specs (as the model got them, JSON) and options of a request.

    Make one with `Prompt.of`; `digest` must be the digest of the other three, or making it
    raises `ValueError` (a stored prompt that was changed does not load).
    """

    instructions: str | None = None
    tools: Sequence[Mapping[str, Any]] = ()
    options: Mapping[str, Any] = field(default_factory=dict[str, Any])
    digest: str = ""

    def __post_init__(self) -> None:
        valid_fields(self, "instructions", "digest")
        tools = freeze(list(self.tools), "the prompt's tools")
        if not all(isinstance(item, dict) for item in cast("list[object]", tools)):
            raise TypeError("Prompt.tools must be tool specs as JSON dicts: use Prompt.of(...).")
        object.__setattr__(self, "tools", tools)
        object.__setattr__(self, "options", freeze_values(self.options, "the prompt's options"))
        expected = _digest(_canonical(self.instructions, self.tools, self.options))
        if self.digest != expected:
            raise ValueError(
                f"Prompt digest {self.digest!r} is not the digest of its instructions, tools and"
                f" options ({expected!r}): make prompts with Prompt.of(...), and never edit one."
            )

    @classmethod
    def of(
        cls,
        instructions: str | None,
        specs: Iterable[SpecLike | Mapping[str, Any]] = (),
        options: Mapping[str, Any] | None = None,
    ) -> Prompt:
        """The prompt of a request: `specs` are `ToolSpec`s or JSON dicts, `options` JSON.

        Raises:
            TypeError: A value is not JSON (the message names where).
        """
        tools: list[Any] = [
            dict(spec) if isinstance(spec, Mapping) else _spec_dict(spec) for spec in specs
        ]
        frozen_tools: FrozenList[Any] = freeze(tools, "the prompt's tools")
        frozen_options: FrozenDict[str, Any] = freeze_values(options or {}, "the prompt's options")
        if instructions is not None and not isinstance(instructions, str):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"instructions must be a str, got {type(instructions).__name__}.")
        if instructions is not None and not instructions.isascii():
            instructions = valid_text(instructions)
        digest = _digest(_canonical(instructions, frozen_tools, frozen_options))
        # Made here from its content, so its digest holds: no second check (half the cost).
        prompt = object.__new__(cls)
        for name, value in (
            ("instructions", instructions),
            ("tools", frozen_tools),
            ("options", frozen_options),
            ("digest", digest),
        ):
            object.__setattr__(prompt, name, value)
        return prompt

    @property
    def tool_names(self) -> tuple[str, ...]:
        """The names of the tools, in the order the model got them."""
        return tuple(str(tool.get("name", "?")) for tool in self.tools)


def _spec_dict(spec: SpecLike) -> dict[str, Any]:
    return {
        "name": spec.name,
        "description": spec.description,
        "input_schema": spec.input_schema,
    }


def _lines(value: Any) -> list[str]:
    if isinstance(value, str):
        return value.splitlines()
    return json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False).splitlines()


def _diff(what: str, recorded: Any, now: Any) -> str:
    lines = list(
        difflib.unified_diff(_lines(recorded), _lines(now), "recorded", "now", n=1, lineterm="")
    )
    shown = lines[: _DIFF_LINES + 2]
    if len(lines) > len(shown):
        shown.append(f"... ({len(lines) - len(shown)} more diff lines)")
    return f"the {what} differ:\n" + "\n".join(shown)


def prompt_difference(recorded: Prompt | None, now: Prompt | None) -> str | None:
    """How `now` differs from `recorded`, as a short unified diff per part; None if the same.

    A prompt that was not recorded (None, an old history) differs from none.
    """
    if recorded is None or now is None or recorded.digest == now.digest:
        return None
    parts: list[str] = []
    if recorded.instructions != now.instructions:
        parts.append(_diff("instructions", recorded.instructions or "", now.instructions or ""))
    if recorded.tools != now.tools:
        before = {str(tool.get("name")): tool for tool in recorded.tools}
        after = {str(tool.get("name")): tool for tool in now.tools}
        if before.keys() != after.keys():
            gone, added = sorted(before.keys() - after.keys()), sorted(after.keys() - before.keys())
            parts.append(f"the tools differ: removed {gone}, added {added}")
        else:
            changed = [name for name in before if before[name] != after[name]]
            if changed:
                name = changed[0]
                parts.append(_diff(f"specs of the tool {name!r}", before[name], after[name]))
            else:
                parts.append("the tools differ: their order changed")
    if recorded.options != now.options:
        parts.append(_diff("options", dict(recorded.options), dict(now.options)))
    return "\n".join(parts) or "the prompts differ"
