"""The store benchmarks as table rows: every backend's appends and loads, and SQLite's size."""

from __future__ import annotations

import tempfile
from pathlib import Path

from .report import Metric
from .sqlite_bench import bench_size
from .stores_bench import backends, bench_append, bench_load, bench_recovering_load

__all__ = ("bench_stores",)


def bench_stores(
    append_entries: int, load_entries: int, size_turns: int, crowd: int = 10_000
) -> list[Metric]:
    """Per backend: µs per saved turn (3 entries), load time, bytes per entry; SQLite's size.

    And a FileStore's recovering load among 10 and `crowd` States, which must cost the same.
    """
    metrics: list[Metric] = []
    few, many = bench_recovering_load(10), bench_recovering_load(crowd)
    ratio = many["ms"] / few["ms"]
    metrics += [
        Metric(
            "store.file.recover.few.ms", "file: recovering load among 10 States", few["ms"], "ms"
        ),
        Metric(
            "store.file.recover.many.ms",
            f"file: recovering load among {crowd:,} States",
            many["ms"],
            "ms",
        ),
        Metric(
            "store.file.recover.ratio",
            f"file: recovering load, {crowd:,} States / 10",
            ratio,
            "x",
            "< 1.5x (the same cost)",
            ratio < 1.5,
        ),
    ]
    for backend in backends():
        name = backend.name
        append = bench_append(backend, append_entries)
        us = append["us_per_save"]
        target = "< 300 µs" if name == "sqlite" else None
        metrics.append(
            Metric(
                f"store.{name}.save_turn.us",
                f"{name}: save a turn of 3 entries ({append_entries:,} entries)",
                us,
                "µs",
                target,
                us < 300 if target else None,
            )
        )
        load = bench_load(backend, load_entries, repeats=1)
        seconds = load["seconds"]
        target = "< 2 s" if name == "sqlite" else None
        metrics.append(
            Metric(
                f"store.{name}.load.s",
                f"{name}: load a State of {int(load['entries']):,} entries",
                seconds,
                "s",
                target,
                seconds < 2 if target else None,
            )
        )
        metrics.append(
            Metric(
                f"store.{name}.bytes_per_entry",
                f"{name}: stored bytes per entry",
                load["bytes_per_entry"],
                "B",
            )
        )
    with tempfile.TemporaryDirectory() as folder:
        size = bench_size(Path(folder), size_turns)
    mb = size["sqlite.size.bytes"] / 1e6
    metrics.append(
        Metric(
            "store.sqlite.size_200_turns.mb",
            f"sqlite: file size after {size_turns} turns of the workload",
            mb,
            "MB",
            "< 1 MB" if size_turns == 200 else None,
            mb < 1 if size_turns == 200 else None,
        )
    )
    return metrics
