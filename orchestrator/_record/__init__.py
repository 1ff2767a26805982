"""The State and its history: entries, the fold, recording, snapshots, typed data, storage.

Above `_base`; the store protocols and the one client the core reaches a store with live here.
"""

__all__ = ()
