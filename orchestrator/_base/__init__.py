"""The base layer: values and helpers every other layer uses.

Errors, JSON values, messages, replies, stop reasons, links, logs, threads and the sync bridge,
and the one context variable (`_here`). It imports nothing else of the core.
"""

__all__ = ()
