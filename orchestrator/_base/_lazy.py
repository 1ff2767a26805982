"""Names a package imports at first use: the module ``__getattr__`` of PEP 562, written once.

A plain run should not pay, in memory and start time, for parts it never touches (the event
models, the provider models, rich). Their names stay in the package's ``__all__`` and are typed
through ``TYPE_CHECKING`` imports; this gives them at run time.

The same ``__getattr__`` keeps a name that moved working for one release: it gives the same
object and warns `DeprecationWarning` saying where the name lives now.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ("lazy_names",)


def lazy_names(
    package: str,
    modules: Mapping[str, str],
    moved: Mapping[str, tuple[str, str]] | None = None,
) -> Callable[[str], Any]:
    """The module ``__getattr__`` of `package` that gives each name of `modules` on first use.

    `modules` maps a name to the module defining it, relative to `package` (``"._events"``).
    The first use imports that module and keeps the value in the package, so later uses are
    plain attribute reads.

    `moved` maps a name that left the package's public surface to the module defining it and
    what to use instead. Each use gives the same object and warns `DeprecationWarning` (it is
    not kept in the package, so every use warns, ``from package import name`` included).
    """
    gone = dict(moved or {})

    def __getattr__(name: str) -> Any:
        if name in gone:
            module, instead = gone[name]
            warnings.warn(
                f"{package}.{name} is deprecated and goes in the next release: {instead}.",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(module, package), name)
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(importlib.import_module(package), name, value)
        return value

    return __getattr__
