"""`FallbackModel`: models tried in order, the next one answering when one fails."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .._base._errors import ProviderError
from .._base._logs import get_log
from .._base._reply import Reply
from ._base import Model, Request, TextCallback, options_of, resolve_model

__all__ = ("FallbackModel",)

_log = get_log("models")


class FallbackModel:
    """Models tried in order: when one fails before anything visible streamed, the next answers.

    A model fails over on a `ProviderError` (a server error, a rate limit, an auth or context
    error, a dropped connection) or a `TimeoutError` (an ``anyio.fail_after`` inside it), once
    its own retries are spent. Once a model has streamed text to ``on_text``, its failure is
    raised: the caller saw part of that reply. The reply records which model answered
    (`Reply.model`: the model's own report, else its name). When every model fails, the last
    error's kind is raised, naming each failure.

    Args:
        models: The models, first choice first (`Model` objects or ``"provider:model"``
            strings); at least one.

    Raises:
        ValueError: No model is given, or a string names no known provider.
        TypeError: An item is not a model.

    Example:
        ```python
        model = FallbackModel([OpenAIModel("gpt-4o"), AnthropicModel("claude-sonnet-4-5")])
        ```
    """

    __slots__ = ("_models",)

    def __init__(self, models: Sequence[Model | str]) -> None:
        if isinstance(models, str) or not isinstance(models, Sequence) or not models:
            raise ValueError(
                "FallbackModel(models) takes a non-empty list of models, first choice first,"
                f" e.g. FallbackModel([primary, secondary]); got {models!r}."
            )
        self._models = tuple(resolve_model(model) for model in models)

    @property
    def models(self) -> tuple[Model, ...]:
        """The models, in the order they are tried."""
        return self._models

    @property
    def name(self) -> str:
        """The first model's name: the one a request goes to first."""
        return self._models[0].name

    @property
    def options(self) -> dict[str, Any]:
        """The first model's request options (none if it tells none): what a run records.

        A request's prompt is recorded before it is sent, when which model will answer is not
        known yet; the first model is the one every request goes to. A reply from a later
        model says so (`Reply.model`): its own options applied to that request.
        """
        return options_of(self._models[0])

    @property
    def context_window(self) -> int | None:
        """The smallest known context window of the models (a request must fit each)."""
        windows = [m.context_window for m in self._models if m.context_window is not None]
        return min(windows) if windows else None

    def __repr__(self) -> str:
        return f"FallbackModel([{', '.join(repr(model) for model in self._models)}])"

    async def respond(self, request: Request, *, on_text: TextCallback | None = None) -> Reply:
        """Ask each model in turn until one answers.

        Raises:
            ProviderError: Every model failed (the last one's kind), or one failed after its
                text had streamed.
            TimeoutError: The last model timed out.
        """
        streamed = False

        def seen(chunk: str) -> None:
            nonlocal streamed
            streamed = True
            if on_text is not None:
                on_text(chunk)

        failures: list[str] = []
        for index, model in enumerate(self._models):
            try:
                reply = await model.respond(request, on_text=seen)
            except (ProviderError, TimeoutError) as error:
                if streamed:
                    raise
                failures.append(f"{model.name}: {type(error).__name__}: {error}")
                if index == len(self._models) - 1:
                    if len(failures) == 1:
                        raise
                    raise type(error)(
                        "Every model of FallbackModel failed: " + "; ".join(failures)
                    ) from error
                _log.warning(
                    "model.fallback",
                    failed=model.name,
                    next=self._models[index + 1].name,
                    error=f"{type(error).__name__}: {error}",
                )
                continue
            if reply.model is None:
                reply = dataclasses.replace(reply, model=model.name)
            return reply
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover
