"""`tool_call` ids: fresh each time, whatever the app does to `random`, and after a fork."""

from __future__ import annotations

import multiprocessing
import os
import random
from multiprocessing.connection import Connection

import pytest

from orchestrator.testing import tool_call


def test_ids_are_fresh_even_when_random_is_seeded_again() -> None:
    random.seed(7)
    first = tool_call("step").id
    random.seed(7)  # as hypothesis does before each example
    second = tool_call("step").id
    assert first != second
    assert len({tool_call("step").id for _ in range(10_000)}) == 10_000


def _child_id(pipe: Connection) -> None:
    pipe.send(tool_call("step").id)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork exists on Unix only")
def test_a_forked_child_draws_other_ids_than_its_parent() -> None:
    context = multiprocessing.get_context("fork")
    theirs, ours = context.Pipe(duplex=False)
    child = context.Process(target=_child_id, args=(ours,))
    child.start()
    child_id = theirs.recv()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert child_id != tool_call("step").id  # the parent's next id, had the child not reseeded
