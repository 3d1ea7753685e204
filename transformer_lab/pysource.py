"""Parse Python source with the garbage collector paused.

CPython 3.11 and 3.12 count the depth of the Python objects ``ast.parse`` builds in one
counter per interpreter. If a collection runs during the build and a finalizer parses Python
itself (asyncio logging a task's unretrieved exception does: 3.11's traceback module
``ast.parse``-s each line for its ``^^^`` carets), the outer parse fails with
``SystemError: AST constructor recursion depth mismatch``. The grader's process meets exactly
that after nbclient leaves such a task behind. Pausing the collector for the parse keeps
finalizers out of it; they run at the next collection instead.
"""

from __future__ import annotations

import ast
import gc
from typing import Any


def parse_python(source: str, filename: str = "<unknown>", mode: str = "exec") -> Any:
    """``ast.parse(source, filename, mode)`` with no finalizer able to run inside it (an
    ``ast.Module``, or an ``ast.Expression`` for ``mode="eval"``)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename=filename, mode=mode)
    finally:
        if paused:
            gc.enable()
