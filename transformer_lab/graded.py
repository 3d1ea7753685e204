"""Marks the kit's own implementation of every function or class that a lab grades.

The kit holds one implementation of each component, and the labs ask students to write some of
them. While a lab is open, the package students install must not contain that lab's answers, or
a student could read them (or call them). Every graded implementation is therefore decorated
with the lab that grades it::

    @graded("02_self_attention")
    def softmax(x: Tensor, dim: int = -1) -> Tensor: ...

At run time the decorator only records the name (``GRADED``) and returns the object unchanged.
The instructor's ``transformer-lab labs build --student`` reads the decorators from the source
(:mod:`transformer_lab.grading.student`) and replaces the body of every implementation of a
still-locked lab by a ``raise LockedAnswerError(...)`` that names the lab and tells the student
to use their own version; once the lab's deadline has passed, a rebuilt package holds the
answer again, so later labs can build on it.

A decorated name is "the answer": helpers that compute the same thing must live inside it (or
be decorated too), otherwise the student package still gives the answer away. The test of
``tests/test_student_package.py`` scans the built package for that.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = [
    "GRADED",
    "HOW_TO_GET",
    "KIT_ORIGINALS",
    "LockedAnswerError",
    "LockedAnswerExit",
    "exit_on_locked",
    "graded",
    "is_locked",
    "locked_line",
]

T = TypeVar("T", bound=Callable[..., object])

#: ``"module.qualname" -> lab`` for every decorated implementation imported so far.
GRADED: dict[str, str] = {}
#: ``"module.qualname" -> object`` as the kit's module defined it: the kit's own code, known by
#: identity wherever it is, even where a student's saved answer now sits in its place
#: (:mod:`transformer_lab.answers`), for the bans of the checks (``judge.bans``).
KIT_ORIGINALS: dict[str, object] = {}


#: Set by :func:`exit_on_locked`: the command whose run a locked answer ends.
_COMMAND: list[str] = []
_MESSAGE = re.compile(r"^(?P<name>\S+) is the answer to lab (?P<lab>\d\d_\w+),")


class LockedAnswerError(NotImplementedError):
    """The kit's implementation of a graded function is not in this (student) package yet.

    Under :func:`exit_on_locked` (the ``transformer-lab`` commands), one raised while
    jsonargparse builds the command's classes ends the command instead: a
    :class:`LockedAnswerExit` with the line of :func:`locked_line`, since jsonargparse would
    hide it behind "Does not validate against any of the Union subtypes". Raised anywhere else
    it stays an exception (code that expects it still catches it).
    """

    def __new__(cls, *args: object) -> LockedAnswerError:
        if _COMMAND and cls is LockedAnswerError and _inside_jsonargparse():
            return LockedAnswerExit(_COMMAND[-1], str(args[0]) if args else "")  # type: ignore[return-value]
        return super().__new__(cls, *args)


def _inside_jsonargparse() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if str(frame.f_globals.get("__name__", "")).startswith("jsonargparse"):
            return True
        frame = frame.f_back
    return False


class LockedAnswerExit(SystemExit):
    """A command stopped by a locked answer: exit status 2, one line on stderr (printed once)."""

    def __init__(self, command: str, message: str) -> None:
        super().__init__(2)
        self.line = locked_line(command, message)
        print(self.line, file=sys.stderr)


def locked_line(command: str, message: str) -> str:
    """The one line a command prints for a locked answer: what is missing, which lab, what to do."""
    found = _MESSAGE.match(message)
    if not found:
        return f"{command}: {message}"
    name = found["name"]
    return f"{command}: needs {name}, the answer to lab {found['lab']}, " + _how_to_get(
        name.rpartition(".")[2]
    )


#: Who can say how a student gets a locked answer (a line, or None to pass): the module that
#: carries answers (:mod:`transformer_lab.answers`) adds itself when imported, so this lowest
#: module of the kit imports nothing above it.
HOW_TO_GET: list[Callable[[str], str | None]] = []


def _how_to_get(name: str) -> str:
    """What a student can do about a missing answer ``name``."""
    for advice in HOW_TO_GET:
        said = advice(name)
        if said:
            return said
    return "which the student package holds once that lab's deadline has passed: reinstall then."


@contextlib.contextmanager
def exit_on_locked(command: str) -> Iterator[None]:
    """Inside, a locked answer ends ``command`` with status 2 and one line naming its lab."""
    _COMMAND.append(command)
    try:
        yield
    finally:
        _COMMAND.pop()


def graded(lab: str) -> Callable[[T], T]:
    """Record that ``lab`` (e.g. ``"02_self_attention"``) grades the decorated function or class.

    Args:
        lab: the lab's folder name, ``NN_name``.

    Returns:
        A decorator that returns its argument unchanged.

    Raises:
        ValueError: ``lab`` is not of the form ``NN_name``.
    """
    head, _, tail = lab.partition("_")
    if len(head) != 2 or not head.isdigit() or not tail:
        raise ValueError(f"lab={lab!r} is not a lab folder name such as '02_self_attention'")

    def mark(obj: T) -> T:
        dotted = f"{obj.__module__}.{obj.__qualname__}"
        GRADED[dotted] = lab
        KIT_ORIGINALS[dotted] = obj
        return obj

    return mark


def is_locked(obj: object) -> bool:
    """True when ``obj`` is a locked stub of a student package (its body only raises)."""
    func = getattr(obj, "__init__", None) if isinstance(obj, type) else obj
    func = inspect.unwrap(func) if callable(func) else func
    code = getattr(func, "__code__", None)
    return code is not None and "LockedAnswerError" in code.co_names
