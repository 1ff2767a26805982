"""Test doubles for agents: run them offline and deterministically."""

from .._fake_model import FakeModel as FakeModel
from .._fake_model import FakeModelExhausted as FakeModelExhausted
from .._fake_model import tool_call as tool_call

__all__ = ("FakeModel", "FakeModelExhausted", "tool_call")
