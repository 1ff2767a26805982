"""``python -m orchestrator``: the `orchestrator` command line."""

from orchestrator._cli import main

main()
