"""`FileStore`'s agent memory beyond the contract: its files, damage, compaction, processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import Memory, MemoryBackend, Message, State
from stores import FileStore

# Private: the memory log's file layout and its compaction threshold, checked on disk.
from stores._file import LOG, MEMORY, MEMORY_FORMAT
from tests.doubles import mode_of

ROOT = Path(__file__).resolve().parents[2]


def log_lines(root: Path, agent: str) -> list[dict[str, object]]:
    data = (root / MEMORY / agent / LOG).read_bytes()
    return [json.loads(line) for line in data.split(b"\n") if line]


@pytest.fixture
def store(root: Path) -> FileStore:
    return FileStore(root)


def test_memory_is_a_log_per_agent_beside_the_states(store: FileStore, root: Path) -> None:
    assert isinstance(store, MemoryBackend)
    assert store.keeps_memory
    store.save(State(id="s1", messages=[Message.user("hi")]))
    store.memory_put("digest", "kv", "k", "1")
    store.memory_put("digest", "collection:loops", "x", '{"a":1}', effect="s1:c1:0")
    store.memory_put("digest", "kv", "k", None)
    store.memory_put("other", "kv", "k", "2")
    assert sorted(os.listdir(root)) == [MEMORY, "s1"]
    assert sorted(os.listdir(root / MEMORY)) == ["digest", "other"]
    assert sorted(os.listdir(root / MEMORY / "digest")) == ["lock", LOG]
    lines = log_lines(root, "digest")
    assert lines[0]["format"] == MEMORY_FORMAT
    assert lines[1:] == [
        {"space": "kv", "key": "k", "value": "1"},
        {"space": "collection:loops", "key": "x", "value": '{"a":1}', "effect": "s1:c1:0"},
        {"space": "kv", "key": "k", "value": None},
    ]
    assert [info.id for info in store.list()] == ["s1"]


def test_memory_files_are_0600_and_folders_0700(store: FileStore, root: Path) -> None:
    store.memory_put("digest", "kv", "k", "1")
    folder = root / MEMORY / "digest"
    assert mode_of(root / MEMORY) == 0o700
    assert mode_of(folder) == 0o700
    assert mode_of(folder / LOG) == 0o600
    assert mode_of(folder / "lock") == 0o600


def test_nothing_is_written_by_reads(store: FileStore, root: Path) -> None:
    assert store.memory_get("digest", "kv", "k") is None
    assert store.memory_scan("digest", "kv") == []
    assert not root.exists()


def test_memory_outlives_the_store_object(root: Path) -> None:
    Memory.open("digest", None, FileStore(root)).set("lastUid", 1042)
    assert Memory.open("digest", None, FileStore(root)).get("lastUid") == 1042


def test_a_store_reads_what_another_store_appended(root: Path) -> None:
    first, second = FileStore(root), FileStore(root)
    first.memory_put("digest", "kv", "a", "1")
    assert second.memory_get("digest", "kv", "a") == "1"  # second has read the log once
    first.memory_put("digest", "kv", "b", "2", effect="e1")
    first.memory_put("digest", "kv", "a", None)
    assert second.memory_scan("digest", "kv") == [("b", "2")]
    assert second.memory_put("digest", "kv", "b", "3", effect="e1") is False
    second.memory_put("digest", "kv", "c", "4")
    assert first.memory_scan("digest", "kv") == [("b", "2"), ("c", "4")]


def test_a_torn_last_line_is_ignored_then_cut_on_the_next_write(
    store: FileStore, root: Path
) -> None:
    store.memory_put("digest", "kv", "a", "1")
    path = root / MEMORY / "digest" / LOG
    with path.open("ab") as log:
        log.write(b'{"space":"kv","key":"b","val')  # a write cut off by a crash
    fresh = FileStore(root)
    assert fresh.memory_scan("digest", "kv") == [("a", "1")]
    fresh.memory_put("digest", "kv", "c", "3")
    assert path.read_bytes().endswith(b'"key":"c","value":"3"}\n')
    assert b'"val\n' not in path.read_bytes()
    assert FileStore(root).memory_scan("digest", "kv") == [("a", "1"), ("c", "3")]


def test_a_damaged_line_is_an_error_naming_the_file_and_line(store: FileStore, root: Path) -> None:
    store.memory_put("digest", "kv", "a", "1")
    path = root / MEMORY / "digest" / LOG
    with path.open("ab") as log:
        log.write(b"not json\n")
    with pytest.raises(ValueError, match=r"damaged at line 3.*backup"):
        FileStore(root).memory_get("digest", "kv", "a")
    with pytest.raises(ValueError, match="line 3"):
        store.memory_put("digest", "kv", "b", "2")  # nothing is added after damage
    assert path.read_bytes().endswith(b"not json\n")


@pytest.mark.parametrize("found", [MEMORY_FORMAT + 1, 0])
def test_another_format_version_is_refused_naming_both(root: Path, found: int) -> None:
    folder = root / MEMORY / "digest"
    folder.mkdir(parents=True)
    (folder / LOG).write_bytes(json.dumps({"format": found, "log": "x"}).encode() + b"\n")
    with pytest.raises(ValueError, match=f"version {found}.*reads version {MEMORY_FORMAT}"):
        FileStore(root).memory_get("digest", "kv", "a")


def test_an_overwritten_log_is_compacted(
    store: FileStore, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("stores._file.COMPACT_LINES", 20)
    other = FileStore(root)
    store.memory_put("digest", "kv", "keep", "k", effect="first")
    assert other.memory_get("digest", "kv", "keep") == "k"  # other has read the old log
    header = log_lines(root, "digest")[0]
    for i in range(40):
        store.memory_put("digest", "kv", "counter", str(i))
    lines = log_lines(root, "digest")
    assert len(lines) < 20
    assert lines[0]["log"] != header["log"]  # a new log, so readers start over
    assert store.memory_scan("digest", "kv") == [("counter", "39"), ("keep", "k")]
    assert other.memory_scan("digest", "kv") == [("counter", "39"), ("keep", "k")]
    assert other.memory_put("digest", "kv", "keep", "again", effect="first") is False
    assert FileStore(root).memory_get("digest", "kv", "keep") == "k"


def test_a_bad_agent_name_touches_nothing(store: FileStore, root: Path) -> None:
    with pytest.raises(ValueError, match="not valid"):
        store.memory_put("../escape", "kv", "k", "1")
    assert not root.exists()


_WRITER = """
import sys
from stores import FileStore
store = FileStore(sys.argv[1])
worker = int(sys.argv[2])
applied = 0
for i in range(40):
    store.memory_put("digest", "kv", f"w{worker}-{i}", str(i))
    applied += store.memory_put("digest", "kv", f"race-{i}", str(worker), effect=f"race:{i}")
print(applied)
"""


def test_processes_share_one_memory_log(root: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(root), str(worker)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for worker in range(3)
    ]
    outputs = [worker.communicate(timeout=60) for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0, 0], [err for _, err in outputs]
    assert sum(int(out) for out, _ in outputs) == 40  # each race was won exactly once
    rows = dict(FileStore(root).memory_scan("digest", "kv"))
    assert len(rows) == 3 * 40 + 40
    assert all(rows[f"w{w}-{i}"] == str(i) for w in range(3) for i in range(40))
