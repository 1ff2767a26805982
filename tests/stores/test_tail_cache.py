"""`TailCache`: what a store remembers of the stored ends of its States, and how long."""

from __future__ import annotations

from stores.backend import Tail, TailCache


def test_states_are_kept_while_the_version_stays_and_dropped_when_it_moves() -> None:
    known = TailCache()
    assert not known.current(7)  # nothing trusted yet: the caller checks the file first
    assert known.trusted is None
    known.trust(7)
    known.put("a", Tail(1, b"line"))
    assert known.current(7)
    assert known.trusted == 7  # what a save checks the file's version against as it writes
    assert known.get("a") == Tail(1, b"line")
    assert not known.current(8)  # another connection wrote: all it knew may be stale
    assert known.get("a") is None
    assert known.trusted is None
    assert not known.current(7)  # and the old version is not trusted again by itself


def test_forget_drops_one_state() -> None:
    known = TailCache()
    known.put("a", Tail(1, b"a"))
    known.put("b", Tail(1, b"b"))
    known.forget("a")
    known.forget("absent")
    assert known.get("a") is None
    assert known.get("b") == Tail(1, b"b")


def test_only_the_most_recently_written_are_kept() -> None:
    known = TailCache(limit=2)
    known.put("a", Tail(1, b"a"))
    known.put("b", Tail(1, b"b"))
    known.put("a", Tail(2, b"a2"))  # written again: now the most recent
    known.put("c", Tail(1, b"c"))
    assert known.get("b") is None
    assert known.get("a") == Tail(2, b"a2")
    assert known.get("c") == Tail(1, b"c")


def test_a_state_whose_last_entry_is_long_is_not_kept() -> None:
    known = TailCache()
    known.put("image", Tail(1, b"x" * 70_000))
    known.put("text", Tail(1, b"x" * 1_000))
    assert known.get("image") is None  # read back from the file at its next save
    assert known.get("text") is not None
