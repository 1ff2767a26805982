"""`KnownTails`: the stored ends one SQLite connection remembers, and when it forgets them."""

from __future__ import annotations

from stores._known import KnownTails
from stores._memory import Tail


def test_tails_are_kept_while_the_version_stays_and_dropped_when_it_moves() -> None:
    known = KnownTails()
    assert not known.current(7)  # nothing trusted yet: the caller checks the file first
    known.trust(7)
    known.put("a", Tail(1, b"line"))
    assert known.current(7)
    assert known.get("a") == Tail(1, b"line")
    assert not known.current(8)  # another connection wrote: every tail may be stale
    assert known.get("a") is None
    assert not known.current(7)  # and the old version is not trusted again by itself


def test_forget_drops_one_tail() -> None:
    known = KnownTails()
    known.put("a", Tail(1, b"a"))
    known.put("b", Tail(1, b"b"))
    known.forget("a")
    known.forget("absent")
    assert known.get("a") is None
    assert known.get("b") == Tail(1, b"b")


def test_only_the_most_recently_written_are_kept() -> None:
    known = KnownTails(limit=2)
    known.put("a", Tail(1, b"a"))
    known.put("b", Tail(1, b"b"))
    known.put("a", Tail(2, b"a2"))  # written again: now the most recent
    known.put("c", Tail(1, b"c"))
    assert known.get("b") is None
    assert known.get("a") == Tail(2, b"a2")
    assert known.get("c") == Tail(1, b"c")
