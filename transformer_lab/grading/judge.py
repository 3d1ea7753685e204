"""The judge: every autograded point decided in the grader's process, from data the kernel returns.

A test cell's trusted source (from ``solutions/``, hidden tests included) runs *here*, in the
grader, never in the student's kernel. Its names that the notebook defines (``causal_mask``,
``CharTokenizer``, ``session``) are bound to :class:`Remote` stand-ins: calling one sends a
request to the kernel (:mod:`transformer_lab.judge.kernel`), which runs the student's code and
returns the result as data (:mod:`transformer_lab.judge.wire`: JSON and safetensors, exact
``torch.Tensor`` s, never a pickle or a subclass). The checks, oracles, tolerances and named
mistakes compare those values on this side, so

* the kernel never sees an expected value, a tolerance, a key or a verdict: nothing in it can
  forge a pass, and code that rewrites the kernel's side can only return other values;
* a hidden check's code, seeds and oracles are never in the kernel, so they cannot be read,
  disassembled or raised into the feedback;
* a request that never returns (a hang, a dead kernel) scores 0 with the reason.

A check that asks for a ban (what the answer may not call) forwards it with each call; the
kernel enforces it as help for review, and the judge trusts only the values.

:func:`judge_cell` is the verdict step, testable without a notebook (any :class:`Link`);
``BudgetedExecute`` (:mod:`transformer_lab.grading.sandbox`) links it to the kernel after each
test cell. Labs whose checks use only what :class:`Remote` carries are listed in
:data:`JUDGED_LABS`; the others are still confirmed by the in-kernel guard's log.

Reference: the checker design of programming-contest judges (DMOJ, Kattis problemtools), where
the submission only produces outputs and a separate process decides.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch

from transformer_lab.checks._bans import ForbiddenCallError, active_ban
from transformer_lab.graded import LockedAnswerError
from transformer_lab.judge import wire

__all__ = [
    "JUDGED_LABS",
    "JudgeError",
    "JudgeSession",
    "Link",
    "Remote",
    "Verdict",
    "grader_namespace",
    "judge_cell",
    "student_names",
]

#: Labs whose every autograded cell is decided by the judge.
JUDGED_LABS = frozenset({"01_positional_encoding"})

#: Exception types a student's code may raise that the checks word themselves; anything else
#: comes back as :class:`RemoteError` naming its type.
_KNOWN_ERRORS: dict[str, type[BaseException]] = {
    "ForbiddenCallError": ForbiddenCallError,
    "LockedAnswerError": LockedAnswerError,
    "NotImplementedError": NotImplementedError,
    "AssertionError": AssertionError,
    "IndexError": IndexError,
    "KeyError": KeyError,
    "ValueError": ValueError,
    "TypeError": TypeError,
    "ZeroDivisionError": ZeroDivisionError,
    "AttributeError": AttributeError,
    "NameError": NameError,
    "RuntimeError": RuntimeError,
}


class JudgeError(Exception):
    """The kernel did not answer a request, or answered with something that is not data."""


class RemoteError(Exception):
    """An exception raised by the student's code of a type the checks do not name."""


class Link(Protocol):
    """Carries one request text to the kernel and its reply text back."""

    def exchange(self, text: str, timeout: float) -> str:
        """Send ``text``; return the reply (:class:`JudgeError` on a timeout or dead kernel)."""
        ...


@dataclass
class Verdict:
    """The judge's decision on one test cell.

    Attributes:
        grade_id: the test cell.
        passed: whether its checks passed on the values the kernel returned.
        message: why not (the check's message), or ``""``.
        requests: how many requests the kernel answered.
        seconds: time the judgement took.
    """

    grade_id: str
    passed: bool
    message: str = ""
    requests: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class JudgeSession:
    """Requests to one kernel: each reply decoded strictly, objects kept behind handles."""

    def __init__(self, link: Link, timeout: float) -> None:
        self.link, self.timeout, self.requests = link, timeout, 0

    def request(self, message: dict[str, Any]) -> Any:
        """Send one request; the decoded value, or the student's exception raised here."""
        try:
            text = self.link.exchange(wire.dumps(message), self.timeout)
            reply = wire.loads(text)
        except wire.WireError as exc:
            raise JudgeError(f"the kernel's reply is not data the judge reads ({exc})") from None
        self.requests += 1
        if reply.get("ok") is True:
            try:
                return wire.decode(reply.get("value"), self._remote)
            except wire.WireError as exc:
                raise JudgeError(
                    f"the kernel's reply is not data the judge reads ({exc})"
                ) from None
        raise _student_error(reply)

    def lookup(self, name: str) -> Any:
        """The notebook's ``name``: data, or a :class:`Remote` for an object."""
        return self.request({"op": "lookup", "name": name})

    def _remote(self, data: dict[str, Any]) -> Remote:
        return Remote(self, data["$handle"], str(data.get("type", "object")))


def _student_error(reply: dict[str, Any]) -> BaseException:
    message = str(reply.get("message", ""))[:2000]
    bases = reply.get("bases") if isinstance(reply.get("bases"), list) else []
    for name in [reply.get("type"), *bases]:
        if isinstance(name, str) and name in _KNOWN_ERRORS:
            return _KNOWN_ERRORS[name](message)
    return RemoteError(f"{str(reply.get('type', 'an exception'))[:80]}: {message}")


class Remote:
    """An object of the student's kernel (a function, class or instance), seen from the judge.

    Calls and attribute reads become requests; what comes back is data or another
    :class:`Remote`. Passing one back in a request sends only its handle.
    """

    def __init__(self, session: JudgeSession, handle: int, type_name: str) -> None:
        self.__judge_handle__ = handle
        self._session, self._type = session, type_name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = {
            "op": "call",
            "target": self.__judge_handle__,
            "args": wire.encode(list(args)),
            "kwargs": wire.encode(dict(kwargs)),
        }
        ban = active_ban()
        if ban is not None:
            request["ban"] = ban
        return self._session.request(request)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_session", "_type"):
            raise AttributeError(name)
        return self._session.request(
            {"op": "getattr", "target": self.__judge_handle__, "name": name}
        )

    def __iter__(self) -> Any:
        return iter(self._session.request({"op": "iter", "target": self.__judge_handle__}))

    def __len__(self) -> int:
        return len(list(self))

    def __repr__(self) -> str:
        return f"<your {self._type}>"


def student_names(source: str, namespace: dict[str, Any]) -> list[str]:
    """The names a test cell reads that neither it, the judge's namespace nor Python defines."""
    tree = ast.parse(source)
    loaded: list[str] = []
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            loaded.append(node.id)
        elif isinstance(node, ast.Name):
            bound.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    free = [n for n in dict.fromkeys(loaded) if n not in bound and n not in namespace]
    return [n for n in free if not hasattr(builtins, n)]


def grader_namespace() -> dict[str, Any]:
    """What a test cell's trusted source may use besides the notebook's names."""
    from torch import nn
    from torch.nn import functional

    namespace: dict[str, Any] = {
        "__name__": "__judge__",
        "torch": torch,
        "nn": nn,
        "F": functional,
        "math": math,
        "lab": importlib.import_module("transformer_lab.lab"),
        "print": lambda *args, **kwargs: None,  # a test cell's "passed" line is the kernel's
    }
    for number in range(1, 9):
        namespace[f"lab{number:02d}"] = importlib.import_module(
            f"transformer_lab.checks.lab{number:02d}"
        )
    return namespace


def judge_cell(
    grade_id: str,
    source: str,
    session: JudgeSession,
    namespace: Callable[[], dict[str, Any]] = grader_namespace,
) -> Verdict:
    """Run a test cell's trusted ``source`` here, on the student's values; its verdict."""
    started = time.monotonic()
    verdict = Verdict(grade_id, passed=False)
    try:
        env = namespace()
        for name in student_names(source, env):
            try:
                env[name] = session.lookup(name)
            except NameError:
                verdict.message = (
                    f"`{name}` is not defined in your notebook when this cell runs: run the "
                    "cell that defines it first (and keep its name)."
                )
                return verdict
        exec(compile(source, f"<test cell {grade_id}>", "exec"), env)  # trusted: solutions/
        verdict.passed = True
    except AssertionError as exc:
        verdict.message = str(exc) or "the check failed"
    except JudgeError as exc:
        verdict.message = f"The grader's judge got no usable answer from your notebook: {exc}"
    except Exception as exc:  # the check itself could not run on what the kernel returned
        verdict.message = f"The check could not run on your answer: {type(exc).__name__}: {exc}"
    finally:
        verdict.requests, verdict.seconds = session.requests, time.monotonic() - started
    return verdict
