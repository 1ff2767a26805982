"""stores: persistence backends for orchestrator States (memory, JSONL files, SQLite, aiosqlite).

The backends land with the stores issue; this package holds their shared protocols and codec.
"""

__all__: tuple[str, ...] = ()
