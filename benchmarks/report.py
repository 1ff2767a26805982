"""Benchmark results: the `Metric` value, the JSON file of a run, and the printed table."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

__all__ = ("FORMAT", "Metric", "Previous", "load_previous", "machine", "render", "save")

FORMAT = 1


@dataclass(frozen=True, slots=True)
class Metric:
    """One measured number. `target` says what the issue asks for; `ok` whether it is met."""

    key: str
    label: str
    value: float
    unit: str
    target: str | None = None
    ok: bool | None = None


@dataclass(frozen=True, slots=True)
class Previous:
    """The previous run's values by key, when it ran, and on what."""

    values: Mapping[str, float]
    created_at: str
    machine: str


def machine() -> str:
    """A one-line description of this interpreter and machine."""
    impl = platform.python_implementation()
    cpus = os.cpu_count() or 0
    return (
        f"{impl} {platform.python_version()}, {platform.system()} {platform.machine()}, {cpus} CPUs"
    )


def save(path: Path, metrics: Iterable[Metric]) -> None:
    """Write the run to `path` as JSON (through a temporary file, so a crash leaves the old one)."""
    payload = {
        "format": FORMAT,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "metrics": {m.key: {"label": m.label, "value": m.value, "unit": m.unit} for m in metrics},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def load_previous(path: Path) -> Previous | None:
    """The run saved at `path`, or None if there is none or it cannot be read."""
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(payload, dict):
        return None
    data = cast("dict[str, Any]", payload)
    if data.get("format") != FORMAT or not isinstance(data.get("metrics"), dict):
        return None
    values: dict[str, float] = {}
    for key, item in cast("dict[str, Any]", data["metrics"]).items():
        value = cast("dict[str, Any]", item).get("value") if isinstance(item, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            values[key] = float(value)
    return Previous(values, str(data.get("created_at", "?")), str(data.get("machine", "?")))


def format_value(value: float, unit: str) -> str:
    """`value` with a precision that suits its size, followed by `unit`."""
    if unit == "x":
        return f"x{value:.2f}"
    if value >= 100:
        text = f"{value:,.0f}"
    elif value >= 10:
        text = f"{value:.1f}"
    elif value >= 1:
        text = f"{value:.2f}"
    elif value >= 0.01:
        text = f"{value:.3f}"
    else:
        text = f"{value:.5f}"
    return f"{text} {unit}"


def format_change(value: float, previous: float | None) -> str:
    """The relative change from `previous`, e.g. ``+4.1%``, or ``-`` when there is none."""
    if previous is None:
        return "-"
    if previous == 0:
        return "-" if value == 0 else "new"
    change = (value - previous) / previous * 100
    return "0.0%" if abs(change) < 0.05 else f"{change:+.1f}%"


def render(metrics: Iterable[Metric], previous: Previous | None) -> str:
    """The table of `metrics`, with the previous value and the change for each."""
    header = ("benchmark", "value", "previous", "change", "target")
    rows: list[tuple[str, ...]] = []
    for m in metrics:
        before = previous.values.get(m.key) if previous is not None else None
        target = ""
        if m.target is not None:
            target = m.target + ("" if m.ok is None else ("  ok" if m.ok else "  MISSED"))
        rows.append(
            (
                m.label,
                format_value(m.value, m.unit),
                "-" if before is None else format_value(before, m.unit),
                format_change(m.value, before),
                target,
            )
        )
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    right = (False, True, True, True, False)

    def line(row: tuple[str, ...]) -> str:
        cells = [
            cell.rjust(width) if align else cell.ljust(width)
            for cell, width, align in zip(row, widths, right, strict=True)
        ]
        return "  ".join(cells).rstrip()

    out = [f"orchestrator benchmarks on {machine()}"]
    if previous is None:
        out.append("previous run: none (this run becomes the baseline)")
    else:
        note = "" if previous.machine == machine() else f", on {previous.machine}"
        out.append(f"previous run: {previous.created_at}{note}")
    out += ["", line(header), line(tuple("-" * w for w in widths))]
    out += [line(row) for row in rows]
    return "\n".join(out)
