"""Lazy re-exports for the kit's subpackages (PEP 562, module ``__getattr__``).

A subpackage lists ``name -> submodule`` once; the name is imported from its submodule on first
use. This keeps ``import transformer_lab.data`` or ``transformer-lab info`` from paying for
Lightning: nothing heavy is imported until a name that needs it is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Build a package's ``__getattr__`` and ``__dir__`` from ``exports``.

    Args:
        package: the package's ``__name__``.
        exports: public name -> submodule (relative to ``package``) that defines it.

    Returns:
        ``(__getattr__, __dir__)`` to assign at the package's top level.
    """

    def __getattr__(name: str) -> Any:  # noqa: N807 (the PEP 562 hook's name)
        if name in exports:
            return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:  # noqa: N807
        return sorted(set(exports) | set(vars(importlib.import_module(package))))

    return __getattr__, __dir__
