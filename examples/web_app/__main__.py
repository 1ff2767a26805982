"""Serve the web app: ``python -m examples.web_app --store runs.db --port 8000``."""

from __future__ import annotations

import argparse
from pathlib import Path

import uvicorn

from examples.web_app.agents import build_agent
from examples.web_app.app import create_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", default="runs.db", help="the SQLite file runs are saved in")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--latency", type=float, default=0.3, help="seconds per model step")
    parser.add_argument("--outbox", default="outbox.tsv", help="where sent mail is written")
    args = parser.parse_args()
    outbox = Path(args.outbox)
    app = create_app(args.store, [build_agent(outbox, args.latency)])
    # Open event streams end within 2 s of a stop, then the lifespan cancels and saves the runs.
    uvicorn.run(app, host="127.0.0.1", port=args.port, timeout_graceful_shutdown=2)


if __name__ == "__main__":
    main()
