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

import inspect
from collections.abc import Callable
from typing import TypeVar

__all__ = ["GRADED", "LockedAnswerError", "graded", "is_locked"]

T = TypeVar("T", bound=Callable[..., object])

#: ``"module.qualname" -> lab`` for every decorated implementation imported so far.
GRADED: dict[str, str] = {}


class LockedAnswerError(NotImplementedError):
    """The kit's implementation of a graded function is not in this (student) package yet."""


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
        GRADED[f"{obj.__module__}.{obj.__qualname__}"] = lab
        return obj

    return mark


def is_locked(obj: object) -> bool:
    """True when ``obj`` is a locked stub of a student package (its body only raises)."""
    func = getattr(obj, "__init__", None) if isinstance(obj, type) else obj
    func = inspect.unwrap(func) if callable(func) else func
    code = getattr(func, "__code__", None)
    return code is not None and "LockedAnswerError" in code.co_names
