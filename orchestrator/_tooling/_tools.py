"""Tools: functions a model can call, and how their results come back.

`@tool` turns a plain or ``async def`` function into a `FunctionTool`; a `Tool` subclass defines
``run(self, ...)`` or ``async def arun(self, ...)`` instead. Either way the tool reads its
signature once (`_tooling._tool_schema`): its `spec` is exactly what the model is shown, and
`bind` checks the model's arguments and fills the hidden parameters (state inputs, the live
`State`, the agent's `Memory`). The agent loop then calls `call` (sync tools, in a worker
thread) or `acall` (async tools) and turns the return value into content blocks and a state
update with `convert`.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, ParamSpec, TypeVar, cast, overload

import anyio.to_thread

from .._base._json import freeze
from .._base._sync import is_async_callable
from .._record._state import State
from .._record._typed import Handler, Schema
from ._memory import Memory
from ._tool_result import (
    Converted,
    OutputMapping,
    ToolResult,
    as_mapping,
    check_outputs,
    convert,
)
from ._tool_schema import Parameters, ToolInputError, parse_docstring

__all__ = (
    "FunctionTool",
    "OutputMapping",
    "Tool",
    "ToolInputError",
    "ToolResult",
    "ToolSpec",
    "as_tool_list",
    "tool",
)

_P = ParamSpec("_P")
_R = TypeVar("_R")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_EMPTY: Mapping[str, Any] = MappingProxyType({})


# -- values ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What the model is shown of a tool: its name, description and JSON input schema.

    The schema is frozen JSON: an object schema with ``"additionalProperties": false``.
    """

    name: str
    description: str
    input_schema: Mapping[str, Any]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not isinstance(self.description, str):
            raise TypeError("ToolSpec.name and ToolSpec.description must be str.")
        if not isinstance(self.input_schema, Mapping):
            raise TypeError("ToolSpec.input_schema must be a JSON schema dict.")
        object.__setattr__(self, "input_schema", freeze(self.input_schema, "input_schema"))


# -- option checks ---------------------------------------------------------------------------------


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise TypeError(
            f"The tool name {name!r} is not valid: use 1 to 64 ASCII letters, digits, '_' or '-',"
            " starting with a letter or '_' (model providers require it). Pass name='...'."
        )
    return name


def _check_flag(tool: str, option: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"Tool {tool!r}: {option} must be True or False, got {value!r}.")
    return value


def _check_timeout(tool: str, value: object) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise TypeError(
            f"Tool {tool!r}: timeout is a number of seconds greater than 0, or None for no"
            f" timeout; got {value!r}."
        )
    return float(value)


def _check_inputs(tool: str, value: object) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise TypeError(
            f"Tool {tool!r}: inputs_from_state maps state keys to parameter names, e.g."
            f" {{'user_name': 'user'}}; got {type(value).__name__}."
        )
    mapping = dict(cast("Mapping[object, object]", value))
    for key, param in mapping.items():
        if not isinstance(key, str) or not isinstance(param, str):
            raise TypeError(
                f"Tool {tool!r}: inputs_from_state maps state keys to parameter names (both"
                f" str), got {key!r}: {param!r}."
            )
    return MappingProxyType(cast("dict[str, str]", mapping))


def _check_not_generator(tool: str, fn: object) -> None:
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"Tool {tool!r} is a generator function, but a tool returns one value. Collect the"
            " items and return a list."
        )


def _snake_case(name: str) -> str:
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


# -- tools -----------------------------------------------------------------------------------------


class Tool:
    """A function a model can call.

    Subclass it and define ``run(self, <typed parameters>)`` or ``async def arun(self, ...)``;
    set the options as class attributes or pass them to ``super().__init__(...)``. The name
    defaults to the class name in snake case, the description to the class docstring (or the
    method's), and parameter descriptions come from the method's Google-style ``Args:``.

    Example::

        class Search(Tool):
            \"\"\"Search the documents.\"\"\"

            read_only = True

            def run(self, query: str, limit: int = 5) -> list[str]:
                \"\"\"Args:
                query: What to look for.
                \"\"\"
                return index.search(query, limit)

    Attributes:
        name: The name the model calls it by.
        description: What the model is told it does.
        parallel: Whether it may run at the same time as the turn's other calls.
        timeout: Seconds a call may take (None: no limit).
        read_only: Whether it changes nothing (for permissions such as `AllowByReadOnly`).
        inputs_from_state: ``{"state_key": "param"}``: parameters filled from state.
        outputs_to_state: ``{"state_key": {"source": "result_key", "handler": fn}}``.
    """

    name: str
    description: str
    parallel: bool = True
    timeout: float | None = None
    read_only: bool = False
    inputs_from_state: Mapping[str, str] = _EMPTY
    outputs_to_state: Mapping[str, OutputMapping] = _EMPTY

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        run: object = getattr(cls, "run", None)
        arun: object = getattr(cls, "arun", None)
        if run is not None and arun is not None:
            raise TypeError(
                f"{cls.__name__} defines both run and arun: a tool is either sync (run) or"
                " async (arun). Keep one."
            )
        if run is not None and is_async_callable(run):
            raise TypeError(f"{cls.__name__}.run is async: name it arun.")
        if arun is not None and not is_async_callable(arun):
            raise TypeError(f"{cls.__name__}.arun must be `async def`; name a sync method run.")

    def __init__(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        parallel: bool | None = None,
        timeout: float | None = None,
        read_only: bool | None = None,
        inputs_from_state: Mapping[str, str] | None = None,
        outputs_to_state: Mapping[str, OutputMapping] | None = None,
    ) -> None:
        """Check the options and read the signature once.

        Each option left as None takes the class attribute. Raises `TypeError` saying how to
        fix an option or a parameter that cannot work.
        """
        given: dict[str, object] = {
            "name": name,
            "description": description,
            "parallel": parallel,
            "timeout": timeout,
            "read_only": read_only,
            "inputs_from_state": inputs_from_state,
            "outputs_to_state": outputs_to_state,
        }
        self._setup({key: value for key, value in given.items() if value is not None})

    def _setup(self, given: Mapping[str, object]) -> None:
        def option(key: str, default: object = None) -> object:
            return given[key] if key in given else getattr(self, key, default)

        target = self._target()
        given_name = option("name")
        self.name = name = _check_name(self._default_name() if given_name is None else given_name)
        _check_not_generator(name, target)
        text, arg_docs = self._docs()
        description = option("description")
        if description is None:
            description = text
        if not isinstance(description, str):
            raise TypeError(f"Tool {name!r}: description must be a str, got {description!r}.")
        self.description = description
        self.parallel = _check_flag(name, "parallel", option("parallel", True))
        self.read_only = _check_flag(name, "read_only", option("read_only", False))
        self.timeout = _check_timeout(name, option("timeout"))
        self.inputs_from_state = _check_inputs(name, option("inputs_from_state", _EMPTY))
        outputs = check_outputs(name, option("outputs_to_state", _EMPTY))
        self.outputs_to_state = MappingProxyType({out.key: as_mapping(out) for out in outputs})
        self._outputs = outputs
        self._output_handlers: Mapping[str, Handler] = MappingProxyType(
            {out.key: out.handler for out in outputs if out.handler is not None}
        )
        self._is_async = is_async_callable(target)
        self._parameters = Parameters.analyse(
            target, tool=name, inputs_from_state=self.inputs_from_state, descriptions=arg_docs
        )

    def _plan(self) -> Parameters:
        """The parameters; set up here when a subclass's __init__ skipped ``super().__init__()``."""
        if "_parameters" not in self.__dict__:
            self._setup({})
        return self._parameters

    def _target(self) -> Callable[..., Any]:
        for method in ("arun", "run"):
            target = getattr(self, method, None)
            if callable(target):
                return cast("Callable[..., Any]", target)
        raise TypeError(
            f"{type(self).__name__} is a Tool without a run method: define"
            " run(self, <typed parameters>) or async def arun(self, ...)."
        )

    def _default_name(self) -> str:
        return _snake_case(type(self).__name__)

    def _docs(self) -> tuple[str, dict[str, str]]:
        class_text, class_args = parse_docstring(type(self).__dict__.get("__doc__"))
        method_text, method_args = parse_docstring(inspect.getdoc(self._target()))
        return class_text or method_text, {**class_args, **method_args}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {getattr(self, 'name', '?')!r}>"

    @property
    def spec(self) -> ToolSpec:
        """What the model is shown: name, description and the arguments' JSON schema."""
        plan = self._plan()
        return ToolSpec(self.name, self.description, plan.input_schema)

    @property
    def is_async(self) -> bool:
        """Whether the tool is ``async def`` (run it with `acall`), else sync (`call`)."""
        self._plan()
        return self._is_async

    @property
    def output_handlers(self) -> Mapping[str, Handler]:
        """The ``outputs_to_state`` handlers by state key, for the mappings that set one."""
        self._plan()
        return self._output_handlers

    def bind(
        self, args: Mapping[str, Any], state: State | None = None, memory: Memory | None = None
    ) -> dict[str, Any]:
        """Check the model's arguments and return the keyword arguments to call the tool with.

        Arguments are validated like a pydantic model (lax, unknown names refused).
        ``inputs_from_state`` parameters are read from `state` (an unset key takes the
        parameter's default), parameters annotated `State` receive `state`, and parameters
        annotated `Memory` receive `memory` (the agent's).

        Raises:
            ToolInputError: Something is wrong with the arguments: every problem is listed
                with its path, for the model to read. Also when a state key a parameter
                needs is unset and the parameter has no default.
            TypeError: A parameter needs the State and `state` is None, or needs the memory
                and `memory` is None.
        """
        return self._plan().bind(args, state, memory)

    @property
    def needs_memory(self) -> bool:
        """Whether a parameter must receive the agent's memory (annotated `Memory`, not None)."""
        return any(not optional for _, optional in self._plan().memory_params)

    def call(self, kwargs: Mapping[str, Any]) -> Any:
        """Run a sync tool with the keyword arguments from `bind`; return what it returns.

        Raises:
            TypeError: The tool is async (use `acall`), or a sync tool returned an awaitable.
        """
        if self.is_async:
            raise TypeError(f"Tool {self.name!r} is async: use `await tool.acall(kwargs)`.")
        result = self._target()(**kwargs)
        if inspect.isawaitable(result):
            close = getattr(result, "close", None)
            if callable(close):
                close()
            raise TypeError(
                f"Tool {self.name!r} returned an awaitable from a sync function: make it"
                " `async def` so it is awaited."
            )
        return result

    async def acall(self, kwargs: Mapping[str, Any]) -> Any:
        """Run the tool with the keyword arguments from `bind` and return what it returns.

        An async tool is awaited; a sync tool runs in a worker thread.
        """
        if not self.is_async:
            return await anyio.to_thread.run_sync(self.call, kwargs)
        return await self._target()(**kwargs)

    def convert(self, value: Any) -> Converted:
        """Turn a return value into the content the model sees and a state update.

        A str is kept, None reads ``"(done)"``, an `Image` (or a list holding images) becomes
        blocks, a `ToolResult` gives its message, state and error flag, anything else is JSON
        text. ``outputs_to_state`` adds the mapped parts of the result to the update (not for
        an error result); a `ToolResult`'s own `state` wins a clash.

        Raises:
            TypeError: The value is not JSON, or a ``source`` mapping got a result that is
                not a dict. The loop turns it into an error result.
        """
        self._plan()
        return convert(self.name, self._outputs, value)


class FunctionTool(Tool, Generic[_P, _R]):
    """A function made into a tool by `@tool`; calling it calls the function.

    It keeps the function's ``__name__``, ``__doc__`` and ``__wrapped__``.
    """

    __wrapped__: Callable[_P, _R]
    __name__: str

    def __init__(
        self,
        fn: Callable[_P, _R],
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        parallel: bool | None = None,
        timeout: float | None = None,
        read_only: bool | None = None,
        inputs_from_state: Mapping[str, str] | None = None,
        outputs_to_state: Mapping[str, OutputMapping] | None = None,
    ) -> None:
        """Make `fn` a tool; the options are those of `tool`."""
        if isinstance(fn, Tool):
            raise TypeError(f"{fn!r} is already a tool: use it as it is.")
        if isinstance(fn, type):
            raise TypeError(
                f"@tool takes a function, got the class {fn.__name__}: subclass Tool and define"
                " run(self, ...), then pass an instance."
            )
        if not callable(fn):
            raise TypeError(f"@tool takes a function, got {type(fn).__name__}.")
        functools.update_wrapper(self, fn)
        self._fn = fn
        super().__init__(
            name=name,
            description=description,
            parallel=parallel,
            timeout=timeout,
            read_only=read_only,
            inputs_from_state=inputs_from_state,
            outputs_to_state=outputs_to_state,
        )

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """Call the function, as if it were not a tool."""
        return self._fn(*args, **kwargs)

    def _target(self) -> Callable[..., Any]:
        return self._fn

    def _default_name(self) -> str:
        name = getattr(self._fn, "__name__", None)
        if not isinstance(name, str):
            raise TypeError(f"{self._fn!r} has no __name__: give the tool a name with name='...'.")
        return name

    def _docs(self) -> tuple[str, dict[str, str]]:
        fn: Any = self._fn
        while isinstance(fn, functools.partial):
            fn = cast("functools.partial[Any]", fn).func
        return parse_docstring(getattr(fn, "__doc__", None))


@overload
def tool(fn: Callable[_P, _R], /) -> FunctionTool[_P, _R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    parallel: bool = True,
    timeout: float | None = None,
    read_only: bool = False,
    inputs_from_state: Mapping[str, str] | None = None,
    outputs_to_state: Mapping[str, OutputMapping] | None = None,
) -> Callable[[Callable[_P, _R]], FunctionTool[_P, _R]]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parallel: bool = True,
    timeout: float | None = None,
    read_only: bool = False,
    inputs_from_state: Mapping[str, str] | None = None,
    outputs_to_state: Mapping[str, OutputMapping] | None = None,
) -> Any:
    """Make a plain or ``async def`` function a tool; use it bare (``@tool``) or with options.

    The JSON schema comes from the type hints, the description from the docstring (its
    Google-style ``Args:`` describe the parameters; ``Annotated[T, "text"]`` works too).

    Args:
        fn: The function, when used bare.
        name: The name the model calls it by (default: the function's name).
        description: What the model is told (default: the docstring without its sections).
        parallel: Whether it may run at the same time as the turn's other calls.
        timeout: Seconds a call may take; None for no limit.
        read_only: Whether the tool changes nothing.
        inputs_from_state: ``{"state_key": "param"}``: parameters filled from state, hidden
            from the model.
        outputs_to_state: ``{"state_key": {"source": "result_key", "handler": fn}}``: parts
            of the result written to state (without ``source``, the whole result).

    Returns:
        A `FunctionTool`, still callable like the function; or, with options only, a decorator.

    Raises:
        TypeError: An option or a parameter cannot work; the message says how to fix it.
    """
    options: dict[str, Any] = {
        "name": name,
        "description": description,
        "parallel": parallel,
        "timeout": timeout,
        "read_only": read_only,
        "inputs_from_state": inputs_from_state,
        "outputs_to_state": outputs_to_state,
    }
    if isinstance(fn, str):
        raise TypeError(f"@tool takes options by keyword: write @tool(name={fn!r}).")
    if fn is not None:
        return FunctionTool(fn, **options)

    def decorate(function: Callable[_P, _R]) -> FunctionTool[_P, _R]:
        return FunctionTool(function, **options)

    return decorate


# -- tool lists ------------------------------------------------------------------------------------


def _tool_class_name(item: object) -> str | None:
    if isinstance(item, type) and issubclass(item, Tool):
        return item.__name__
    return None


def _as_tool(item: object, index: int) -> Tool:
    if isinstance(item, Tool):
        return item
    name = _tool_class_name(item)
    if name is not None:
        raise TypeError(f"tools[{index}] is the class {name}: pass an instance, {name}().")
    if not callable(item):
        raise TypeError(
            f"tools[{index}] is a {type(item).__name__}, not a tool: pass functions (made into"
            " tools) or Tool objects."
        )
    return FunctionTool(item)


def as_tool_list(tools: Iterable[Tool | Callable[..., Any]]) -> tuple[Tool, ...]:
    """The tools as a tuple of `Tool`, plain functions made into tools.

    Raises:
        TypeError: `tools` is not a list of tools, or an item is not a tool or function.
        ValueError: Two tools have the same name.
    """
    if isinstance(tools, str | Tool) or not isinstance(tools, Iterable):
        raise TypeError(
            f"tools takes a list of tools, e.g. tools=[search], got {type(tools).__name__}."
        )
    result: list[Tool] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(cast("Iterable[object]", tools)):
        made = _as_tool(item, index)
        name = made.spec.name
        if name in seen:
            raise ValueError(
                f"Two tools are named {name!r} (tools[{seen[name]}] and tools[{index}]): tool"
                " names must be unique. Rename one with @tool(name='...')."
            )
        seen[name] = index
        result.append(made)
    return tuple(result)


def check_outputs_against_schema(tool: Tool, schema: Schema | None) -> None:
    """Check that every ``outputs_to_state`` key of `tool` is declared by the state schema.

    Raises:
        ValueError: A key is not declared; the message names it and the declared keys.
    """
    if schema is None:
        return
    declared = list(schema.fields)
    for key in tool.outputs_to_state:
        if key not in schema.fields:
            close = difflib.get_close_matches(key, declared, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"Tool {tool.name!r} writes the state key {key!r} (outputs_to_state), which the"
                f" state schema does not declare (declared: {', '.join(declared) or 'none'})."
                f"{hint} Add it to the schema or fix the key."
            )
