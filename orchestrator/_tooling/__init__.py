"""Tools: their schema and results, toolsets, permissions, and memory (with its tools).

Above `_record`. What a tool needs of the run in progress it asks through `_base._here`.
"""

__all__ = ()
