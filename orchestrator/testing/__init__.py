"""Test doubles for agents: run them offline and deterministically."""

from .._fake_model import FakeModel as FakeModel
from .._fake_model import FakeModelExhausted as FakeModelExhausted
from .._fake_model import tool_call as tool_call
from .._replay import ReplayMismatch as ReplayMismatch
from .._replay import ReplayModel as ReplayModel

__all__ = ("FakeModel", "FakeModelExhausted", "ReplayMismatch", "ReplayModel", "tool_call")
