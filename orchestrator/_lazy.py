"""Names a package imports at first use: the module ``__getattr__`` of PEP 562, written once.

A plain run should not pay, in memory and start time, for parts it never touches (the event
models, the provider models, rich). Their names stay in the package's ``__all__`` and are typed
through ``TYPE_CHECKING`` imports; this gives them at run time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ("lazy_names",)


def lazy_names(package: str, modules: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of `package` that gives each name of `modules` on first use.

    `modules` maps a name to the module defining it, relative to `package` (``"._events"``).
    The first use imports that module and keeps the value in the package, so later uses are
    plain attribute reads.
    """

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(importlib.import_module(package), name, value)
        return value

    return __getattr__
