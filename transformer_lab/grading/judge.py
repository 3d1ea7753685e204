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
test cell of every lab.

Reference: the checker design of programming-contest judges (DMOJ, Kattis problemtools), where
the submission only produces outputs and a separate process decides.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import importlib
import itertools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch
from torch import nn

from transformer_lab.checks._common import named_mistakes
from transformer_lab.checks.spec import SpecError, all_specs
from transformer_lab.graded import LockedAnswerError
from transformer_lab.grading import drawn
from transformer_lab.judge import mirror, wire
from transformer_lab.judge.bans import ForbiddenCallError, active_ban, forwarded, refusal
from transformer_lab.pysource import parse_python

__all__ = [
    "HIDDEN_ERROR_TEXT",
    "HIDDEN_FAILURE",
    "JudgeError",
    "JudgeSession",
    "Judgements",
    "Link",
    "Remote",
    "Verdict",
    "grader_namespace",
    "hidden_message",
    "judge_cell",
    "lab_check_modules",
    "stand_ins_for",
    "student_names",
]

#: What a hidden check says in place of the text of an exception raised in the kernel.
HIDDEN_ERROR_TEXT = "a hidden check does not show the error's own text"

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

    def exchange(self, text: str, timeout: float, answer: Callable[[str], str]) -> str:
        """Send ``text``; return the reply, passing the kernel's calls back to ``answer``.

        ``timeout`` is what is left of the judged cell's one deadline (:class:`JudgeSession`):
        the link gives up when it has passed, checking it while it waits.

        Raises:
            JudgeError: a timeout or a dead kernel.
        """
        ...


@dataclass
class Verdict:
    """The judge's decision on one test cell.

    Attributes:
        grade_id: the test cell.
        passed: whether its checks passed on the values the kernel returned.
        message: why not (the check's message), or ``""``.
        mistake: the typical mistake of the lab's catalogue the answer made, in a few words
            (its hint up to the first colon or full stop), when a check named one.
        requests: how many requests the kernel answered.
        seconds: time the judgement took.
    """

    grade_id: str
    passed: bool
    message: str = ""
    mistake: str | None = None
    requests: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


#: What the student's code may not do to an object of the grader's it is handed.
_REFUSED_ON_GRADER_OBJECTS = frozenset(
    {
        "add_module", "apply", "bfloat16", "cpu", "cuda", "double", "float", "half",
        "load_state_dict", "register_buffer", "register_forward_hook",
        "register_forward_pre_hook", "register_full_backward_hook", "register_module",
        "register_parameter", "requires_grad_", "set_extra_state", "share_memory", "to",
        "type", "zero_grad",
    }
)  # fmt: skip


_GRADER_HANDLES = itertools.count(1)


class JudgeSession:
    """Requests to one kernel: replies decoded strictly; objects on each side behind handles."""

    def __init__(
        self, link: Link, timeout: float, *, hidden: bool = False, draws: bool = True
    ) -> None:
        """``timeout``: seconds the whole judged cell may take, all its requests together (one
        deadline, from now: each exchange gets only the time left, and checks it while it
        waits). ``hidden``: the session judges a hidden test cell, whose message never carries
        the text of an exception raised in the kernel, nor anything else the answer produced
        (see :func:`hidden_message`). ``draws``: a visible cell that passes is also judged on
        cases drawn at grading time (:mod:`transformer_lab.grading.drawn`); off only in tests
        that show what the worked examples alone would pass."""
        self.link, self.timeout, self.requests, self.hidden = link, timeout, 0, hidden
        self.draws = draws and not hidden
        #: The calls of the judged cell to the student's functions, while it runs.
        self.recorder: drawn.Recorder | None = None
        #: The cases drawn at grading time that the cell was judged on (a visible cell's).
        self.drawn: list[drawn.Drawn] = []
        self.deadline = time.monotonic() + timeout
        #: The texts of the exceptions the kernel reported (a hidden cell's message drops them).
        self.kernel_texts: set[str] = set()
        self._remotes: dict[int, Remote] = {}
        self._mirrors: dict[int, MirrorModule] = {}  # the student's modules, by root handle
        # What was last sent of each mirror's parameters (root -> name -> value), so that a
        # call that cannot differentiate sends only what changed since (see :meth:`sync`).
        self._sent: dict[int, dict[str, torch.Tensor]] = {}
        self._parts: dict[int, nn.Module] = {}  # every module of their trees, by handle
        self._gmodules: dict[int, nn.Module] = {}  # the grader's modules mirrored in the kernel
        self._objects: dict[int, Any] = {}  # the grader's objects the kernel may call back
        self._handles: dict[int, int] = {}
        # differentiable calls back: number -> (their inputs, their outputs), for "grad"
        self._callbacks: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        self._kernel_rng: torch.Tensor | None = None  # the kernel's random state after a call
        self._judge_rng = torch.empty(0, dtype=torch.uint8)  # ours when it was returned

    def rng_for_call(self) -> torch.Tensor:
        """The CPU random state the kernel's next call draws from.

        A check seeds torch's generator and calls the student's code as if in one process, so
        the call draws from the judge's state; consecutive calls go on where the kernel's stream
        stopped, unless the check drew or re-seeded in between. The judge's own generator is
        never set from the kernel's reply: the kernel cannot choose the check's random numbers.
        """
        current = torch.random.get_rng_state()
        if self._kernel_rng is not None and torch.equal(current, self._judge_rng):
            return self._kernel_rng
        return current

    def request(self, message: dict[str, Any]) -> Any:
        """Send one request; the decoded value, or the student's exception raised here."""
        return self.request_reply(message)[0]

    def request_reply(self, message: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """:meth:`request`, with the whole reply beside the value."""
        out_of_time = JudgeError(
            f"{_OUT_OF_TIME}{self.timeout:.0f} s (the time of the whole "
            "judged cell, all its calls together)"
        )
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise out_of_time
        try:
            text = self.link.exchange(wire.dumps(message), left, self.answer)
            reply = wire.loads(text)
        except wire.WireError as exc:
            raise JudgeError(f"the kernel's reply is not data the judge reads ({exc})") from None
        except JudgeError:
            if time.monotonic() >= self.deadline:
                raise out_of_time from None
            raise
        self.requests += 1
        if reply.get("ok") is True:
            try:
                if "changes" in reply:
                    self._apply_changes(self.decode(reply["changes"]), self._mirrors)
                if "grader_changes" in reply:
                    changes = self.decode(reply["grader_changes"])
                    self._apply_changes(changes, self._gmodules)
                if "rng" in reply:  # where the kernel's stream stands for its next call
                    self._kernel_rng = _rng_state(self.decode(reply["rng"]))
                    torch.rand(())  # our stream moves on too: a re-seed then differs from it
                    self._judge_rng = torch.random.get_rng_state()
                return self.decode(reply.get("value")), reply
            # Whatever the reply says that does not fit what the judge holds (a parameter,
            # a module or a view it never sent) fails the cell with the reason, never the grader.
            except (
                wire.WireError, AttributeError, IndexError, KeyError, RuntimeError, TypeError,
                ValueError,
            ) as exc:  # fmt: skip
                raise JudgeError(
                    f"the kernel's reply is not data the judge reads ({exc})"
                ) from None
        error = _student_error(reply, message, hidden=self.hidden)
        self.kernel_texts.add(str(reply.get("message", ""))[:2000])
        raise error

    def run(self, func: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """A check's :func:`~transformer_lab.checks._common.kernel_side` harness, run in the
        kernel on ``args`` (the student's objects as themselves); what it returns, as data."""
        if not getattr(func, "judge_kernel_side", False):
            raise JudgeError(f"{func.__qualname__} is not a harness the kernel may run")
        request: dict[str, Any] = {
            "op": "run",
            "function": f"{func.__module__}:{func.__qualname__}",
            "args": self.encode(list(args)),
            "kwargs": self.encode(dict(kwargs)),
            "sync": self.sync([], reuse=True),
            "rng": self.encode(self.rng_for_call()),
        }
        ban = active_ban()
        if ban is not None:
            request["ban"] = ban
        return self.request(request)

    def lookup(self, name: str) -> Any:
        """The notebook's ``name``: data, or a :class:`Remote` for an object."""
        return self.request({"op": "lookup", "name": name})

    def _grader_handle(self, obj: Any) -> int:
        handle = self._handles.get(id(obj))
        if handle is None or self._objects.get(handle) is not obj:
            handle = next(_GRADER_HANDLES)  # never reused: a kernel outlives a session
            self._objects[handle], self._handles[id(obj)] = obj, handle
        return handle

    def keep(self, obj: Any) -> dict[str, Any] | None:
        """Send one of the grader's objects (a model, a step function) as a reference.

        A module is mirrored in the kernel (its parameters there, its forward here), so that
        the student's code can read and write its weights as it would locally.
        """
        if isinstance(obj, nn.Parameter):
            return None  # the mirrors' parameters go as values
        if isinstance(obj, nn.Module):
            root = self._grader_handle(obj)
            if root in self._gmodules:
                return {"$grader": root}
            self._gmodules[root] = obj
            return mirror.spec(obj, self._grader_handle, "$gmodule")
        return {"$grader": self._grader_handle(obj), "type": type(obj).__name__}

    def encode(self, value: Any, grads: list[Any] | None = None) -> Any:
        """``value`` for the kernel: data, references to the grader's objects and Remotes."""
        return wire.encode(value, keep=self.keep, grads=grads)

    def decode(self, data: Any, grads: list[torch.Tensor] | None = None) -> Any:
        """The kernel's wire data as values: its objects as Remotes and mirrors."""
        return wire.decode(data, self._reference, grads)

    def answer(self, text: str) -> str:
        """Answer the kernel's call back to one of the grader's objects (as a reply text)."""
        try:
            message = wire.loads(text)
            op = message.get("op")
            if op == "grad":
                return self._callback_grad(message)
            target = self._objects[int(message.get("target", 0))]
            if op == "call" and message.get("differentiable"):
                return self._differentiable_callback(target, message)
            if op == "call":
                args = self.decode(message.get("args", []))
                kwargs = self.decode(message.get("kwargs", {"$dict": []}))
                value = target(*args, **kwargs)
            elif op == "getattr":
                name = str(message.get("name"))
                if name.startswith("_") or name in _REFUSED_ON_GRADER_OBJECTS:
                    raise AttributeError(
                        f"the check's {type(target).__name__} has no `{name}` for you"
                    )
                value = getattr(target, name)
            elif op == "iter":
                value = list(target)
            else:
                raise ValueError(f"unknown call back {op!r}")
            return wire.dumps({"ok": True, "value": self.encode(value)})
        except Exception as exc:  # the student's code gets the error, as it would locally
            return wire.dumps({"ok": False, "type": type(exc).__name__, "message": str(exc)})

    def _differentiable_callback(self, target: Any, message: dict[str, Any]) -> str:
        """A call back whose tensors carry the kernel's graph: kept here for its "grad"."""
        inputs: list[torch.Tensor] = []
        args = self.decode(message.get("args", []), inputs)
        kwargs = self.decode(message.get("kwargs", {"$dict": []}), inputs)
        with torch.enable_grad():
            value = target(*args, **kwargs)
        outputs, _ = wire.result_tensors(value)
        number = next(_callback_numbers)
        self._callbacks[number] = (inputs, outputs)
        for old in [n for n in self._callbacks if n <= number - 64]:  # a bounded memory
            del self._callbacks[old]
        needs = [o.requires_grad for o in outputs]
        reply = {"ok": True, "value": self.encode(value), "call": number, "needs": needs}
        return wire.dumps(reply)

    def _callback_grad(self, message: dict[str, Any]) -> str:
        """The gradients of a differentiable call back's inputs, for the kernel's backward."""
        # kept, not popped: the student's code may differentiate one call again (a Jacobian)
        inputs, outputs = self._callbacks[int(message.get("call", 0))]
        grads = self.decode(message.get("grads", []))
        pairs = [
            (o, g)
            for o, g in zip(outputs, grads, strict=False)
            if o.requires_grad and g is not None
        ]
        found: list[Any] = [None] * len(inputs)
        if pairs and inputs:
            found = list(
                torch.autograd.grad(
                    [o for o, _ in pairs],
                    inputs,
                    [g for _, g in pairs],
                    allow_unused=True,
                    retain_graph=True,
                )
            )
        return wire.dumps({"ok": True, "value": self.encode(found)})

    def sync(self, grads: list[Any], *, reuse: bool = False) -> list[Any]:
        """The mirrors' parameters and modes, for the kernel's modules before a call.

        Parameters that require grad are listed in ``grads`` (the call is differentiable in
        them: a loss on its output trains the mirror, as it would train the module). With
        ``reuse`` (a call that cannot differentiate: grad mode off, or a harness), a parameter
        equal to what was last sent goes by name only, and the kernel puts back the value it
        received then (a model decoded step by step is not sent again at every step).
        """
        payload = []
        for root, module in self._mirrors.items():
            sent = self._sent.setdefault(root, {})
            params, kept = [], []
            for name, param in module.named_parameters():
                last = sent.get(name)
                if reuse and last is not None and _unchanged(last, param):
                    kept.append(name)
                    continue
                params.append([name, param])
                sent[name] = param.detach().clone()
            payload.append([root, self.encode(params, grads), mirror.modes(module), kept])
        return payload

    def _find(self, where: str, modules: dict[int, nn.Module]) -> Any:
        root, _, name = where.partition(":")
        module = modules.get(int(root))
        return dict(module.named_parameters()).get(name) if module is not None else None

    def _apply_changes(self, changes: list[Any], modules: dict[int, nn.Module]) -> None:
        """What a call did to the other side's modules' parameters, done to ours."""
        for root, changed, removed, plain in changes:
            mirror.apply_changes(
                modules[root],
                changed,
                removed,
                plain,
                lambda where: self._find(where, self._gmodules),
            )

    def _mirror(self, data: dict[str, Any]) -> nn.Module:
        root = data["$module"]
        if root in self._parts and root not in self._mirrors:  # a part of a mirrored module
            return self._parts[root]
        if root in self._mirrors:  # the same module again (``fit`` returns self): refresh it
            params = self.decode(data.get("params", []))
            fresh = [[n, v, rg, False, None] for n, v, rg, alias in params if alias is None]
            self._apply_changes([[root, fresh, [], []]], self._mirrors)
            return self._mirrors[root]
        module, parts = mirror.build(
            data,
            self.decode,
            lambda handle, kind: MirrorModule(self, handle, kind),
            own=self._own_module,
        )
        if not isinstance(module, MirrorModule):  # torch's own layer, returned alone
            raise wire.WireError(f"a lone torch {type(module).__name__} is not mirrored")
        for part in parts.values():
            if isinstance(part, MirrorModule):
                part.__dict__["_ready"] = True
        self._mirrors[root] = module
        self._parts.update(parts)
        return module

    def _own_module(self, handle: int) -> nn.Module | None:
        """The grader's module behind ``handle`` (a check's model inside the student's)."""
        obj = self._objects.get(handle)
        return obj if isinstance(obj, nn.Module) else None

    def _parameter(self, data: dict[str, Any]) -> nn.Parameter:
        part, name = self._parts.get(data["$param"]), data.get("name")
        param = part._parameters.get(name) if isinstance(name, str) and part is not None else None
        if not isinstance(param, nn.Parameter):
            raise wire.WireError(f"no mirrored parameter {data['$param']}:{name}")
        return param

    def _reference(self, data: dict[str, Any]) -> Any:
        if "$param" in data:
            return self._parameter(data)
        if "$module" in data:
            return self._mirror(data)
        if "$grader" in data:
            try:
                return self._objects[data["$grader"]]
            except KeyError:
                raise wire.WireError(f"no object of the grader's {data['$grader']}") from None
        handle = data["$handle"]
        if handle not in self._remotes:
            cls = _remote_class(data.get("torch"))
            self._remotes[handle] = cls(self, handle, str(data.get("type", "object")))
        return self._remotes[handle]


_callback_numbers = itertools.count(1)


def _rng_state(value: Any) -> torch.Tensor:
    """A CPU generator's state from the kernel (a uint8 tensor of the size torch's has)."""
    size = torch.random.get_rng_state().numel()
    if not (type(value) is torch.Tensor and value.dtype == torch.uint8 and value.numel() == size):
        raise wire.WireError("the kernel's random state is not a generator state")
    return value


def _student_error(
    reply: dict[str, Any], request: dict[str, Any], *, hidden: bool = False
) -> BaseException:
    """The exception the kernel reported for ``request``, raised again on the judge's side.

    Its text is the kernel's, for the checks to read (a ``ValueError`` that must name the bad
    value, a torch error a hint is chosen by); a hidden cell's message drops it afterwards
    (:func:`hidden_message`). In a hidden check a refused call is worded from the ban the
    judge sent, and an exception class of the student's own is not named.
    """
    bases = reply.get("bases") if isinstance(reply.get("bases"), list) else []
    names = [n for n in [reply.get("type"), *bases] if isinstance(n, str)]
    message = str(reply.get("message", ""))[:2000]
    if hidden and "ForbiddenCallError" in names:
        ban = request.get("ban") if isinstance(request.get("ban"), dict) else {}
        message = refusal("something", str(ban.get("reason", "")))
    for name in names:
        if name in _KNOWN_ERRORS:
            return _KNOWN_ERRORS[name](message)
    kind = str(reply.get("type", "an exception"))[:80]
    builtin = getattr(builtins, kind, None)
    if hidden and not (isinstance(builtin, type) and issubclass(builtin, BaseException)):
        kind = "an exception of your own class"  # (its name is the student's text too)
    return RemoteError(f"{kind}: {message}")


#: What a hidden check says of a failure that no fixed words name (its own text may quote
#: what the answer returned).
HIDDEN_FAILURE = "a property the hidden check tests does not hold"


def hidden_message(
    failure: BaseException, names: Iterable[str], kernel_texts: Iterable[str], named: list[str]
) -> str:
    """A hidden cell's message, in fixed words only: which answer, what kind of failure
    (``wrong shape``, ``not finite``, ``wrong values``, a refused call, an error's class), and
    the catalogued mistake the check named, if any.

    Never the failure's own text: a check words it from what the answer returned (its shape,
    values or type), and an answer that encodes a hidden case's inputs into its output would
    read them back from its feedback.
    """
    which = " and ".join(f"`{n}`" for n in names) or "your answer"
    kind = _failure_kind(failure, set(kernel_texts))
    message = f"A hidden check of {which} failed: {kind}."
    if named:
        message += f" {named[-1]}"
    return message


def _failure_kind(failure: BaseException, kernel_texts: set[str]) -> str:
    """The fixed words for one failure of a hidden check (see :func:`hidden_message`)."""
    if isinstance(failure, ForbiddenCallError):
        return str(failure).rstrip(".")  # worded from the ban the judge sent (refusal)
    judge_error = _judge_error_in(failure)
    if judge_error is not None:
        if str(judge_error).startswith(_OUT_OF_TIME):  # the judge's own words, no student text
            return str(judge_error)
        return (
            "the grader's judge got no usable answer from your notebook (a timeout, a kernel "
            "that died, or a reply that is not data)"
        )
    kind = getattr(failure, "kind", None)
    if kind == "raised" or (not isinstance(kind, str) and str(failure) in kernel_texts):
        return f"it raised {_raised(failure)} ({HIDDEN_ERROR_TEXT})"
    if isinstance(kind, str):
        return kind
    if not isinstance(failure, AssertionError):
        return "the check could not run on what your answer returned"
    return HIDDEN_FAILURE


#: How the judge's own timeout begins (:meth:`JudgeSession.request_reply`, the sandbox's link).
_OUT_OF_TIME = "your code did not return within "


def _judge_error_in(failure: BaseException) -> JudgeError | None:
    """The :class:`JudgeError` behind ``failure`` (itself, or the cause a check re-raised it
    with, as a call that raised on a kind of input), if any."""
    seen: BaseException | None = failure
    for _ in range(16):  # (a chain the checks build is two or three long)
        if seen is None or isinstance(seen, JudgeError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _raised(failure: BaseException) -> str:
    """The class of the exception the student's code raised, as a hidden check may name it
    (a built-in's name; "an exception of your own class" for theirs)."""
    cause: BaseException | None = failure
    while cause is not None and getattr(cause, "kind", None) == "raised":
        cause = cause.__cause__
    if isinstance(cause, RemoteError):
        return str(cause).partition(":")[0]
    if cause is None:
        return "an exception"
    return type(cause).__name__


class _RemoteCall(torch.autograd.Function):
    """A call of the student's function as one differentiable operation of the judge's graph.

    Forward sends the inputs (marked ``grad``) and keeps the call in the kernel; backward asks
    the kernel for the gradients of those inputs, so a check's backward pass runs through the
    student's own code.
    """

    @staticmethod
    def forward(ctx: Any, session: JudgeSession, request: dict[str, Any], box: dict, *inputs: Any):
        value, reply = session.request_reply(request)
        box["reply"] = reply
        flat, box["rebuild"] = wire.result_tensors(value)
        ctx.session, ctx.call, ctx.n_inputs = session, reply.get("call"), len(inputs)
        needs = reply.get("needs", [])
        fixed = [t for t, need in zip(flat, needs, strict=False) if need is not True]
        ctx.mark_non_differentiable(*fixed)  # one call: each call replaces the last one's set
        if not flat:
            box["value"] = value
            return torch.zeros(())
        return tuple(flat)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> tuple[Any, ...]:
        grads = ctx.session.request(
            {"op": "grad", "call": ctx.call, "grads": ctx.session.encode(list(grad_outputs))}
        )
        return (None, None, None, *list(grads)[: ctx.n_inputs])


def _unchanged(last: torch.Tensor, param: torch.Tensor) -> bool:
    """Whether ``param`` still holds exactly ``last`` (its shape, dtype and every value)."""
    return last.shape == param.shape and last.dtype == param.dtype and torch.equal(last, param)


def _call_remote(session: JudgeSession, handle: int, args: Any, kwargs: Any, ban: Any = ...) -> Any:
    """Call the kernel's object ``handle``: the mirrors synced first, differentiable if asked.

    ``ban``: what to send as the call's ban (a drawn case sends the one its template had);
    by default the bans of the check's blocks running now.
    """
    grads: list[torch.Tensor] = []
    request: dict[str, Any] = {
        "op": "call",
        "target": handle,
        "args": session.encode(list(args), grads),
        "kwargs": session.encode(dict(kwargs), grads),
    }
    request["sync"] = session.sync(grads, reuse=not torch.is_grad_enabled())
    request["rng"] = session.encode(session.rng_for_call())
    if ban is ...:
        ban = active_ban()
    if ban is not None:
        request["ban"] = ban
    if not grads or not torch.is_grad_enabled():
        value, reply = session.request_reply(request)
        _write_back(session, reply, [list(args), dict(kwargs)])
        return value
    request["differentiable"] = True
    box: dict[str, Any] = {}
    outputs = _RemoteCall.apply(session, request, box, *grads)
    _write_back(session, box["reply"], [list(args), dict(kwargs)])
    if "value" in box:
        return box["value"]
    return box["rebuild"](outputs if isinstance(outputs, tuple) else (outputs,))


def _write_back(session: JudgeSession, reply: dict[str, Any], args: Any) -> None:
    """Make the student's writes into the call's argument tensors on the judge's own, so a
    check sees a function that changes its input in place as it would in one process."""
    if "written" not in reply:
        return
    ours = wire.plain_tensors(args)
    try:
        written = session.decode(reply["written"])
        with torch.no_grad():
            for index, value in written:
                target = ours[int(index)]
                if type(value) is not torch.Tensor:
                    raise TypeError(f"a written argument must be a tensor, not {type(value)}")
                if value.shape == target.shape and value.dtype == target.dtype:
                    target.copy_(value)
                else:  # resized or retyped in place (``resize_``, ``set_``)
                    target.data = value.clone()
    except (wire.WireError, IndexError, TypeError, ValueError, RuntimeError) as exc:
        raise JudgeError(f"the kernel's reply is not data the judge reads ({exc})") from None


class MirrorModule(nn.Module, wire.Reference):
    """A student's ``nn.Module`` seen from the judge: its tree and parameters, its forward remote.

    The mirror holds real ``nn.Parameter`` s (an optimizer, ``eval()``, ``zero_grad()`` and
    in-place weight copies work on it as on the module); before each call to the kernel its
    parameters and modes are sent to the module, and what a call changes comes back. torch's
    own layers inside it are rebuilt as torch layers; the student's run in the kernel.
    """

    def __init__(self, session: JudgeSession, handle: int, type_name: str) -> None:
        super().__init__()
        self.__dict__["_judge"] = (session, handle, type_name)

    def wire_reference(self) -> dict[str, Any]:
        return {"$handle": self._judge[1]}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return _call_remote(self._judge[0], self._judge[1], args, kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_"):
                raise
            if not self.__dict__.get("_ready"):  # the student's class's name, never the mirror's
                raise AttributeError(f"your {self._judge[2]} has no attribute {name!r}") from None
        session, handle, _ = self.__dict__["_judge"]
        return session.request({"op": "getattr", "target": handle, "name": name})

    def __setattr__(self, name: str, value: Any) -> None:
        """A plain attribute (a check's ``self.log`` recorder) is set on the student's module."""
        local = name.startswith("_") or name in self.__dict__ or not self.__dict__.get("_ready")
        if local or isinstance(value, torch.Tensor | nn.Module):
            super().__setattr__(name, value)
            return
        session, handle, _ = self.__dict__["_judge"]
        value_data = session.encode(value)
        session.request({"op": "setattr", "target": handle, "name": name, "value": value_data})

    def __delattr__(self, name: str) -> None:
        if name in self.__dict__ or name in self._parameters or name in self._modules:
            super().__delattr__(name)
            return
        session, handle, _ = self.__dict__["_judge"]
        session.request({"op": "delattr", "target": handle, "name": name})

    def judge_run(self, func: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        return self.__dict__["_judge"][0].run(func, args, kwargs)

    def judge_vars(self) -> dict[str, Any]:
        """The student's module's public instance attributes (what ``vars`` would show)."""
        session, handle, _ = self.__dict__["_judge"]
        found = session.request({"op": "vars", "target": handle})
        return found if isinstance(found, dict) else {}

    def __getitem__(self, index: int | str) -> nn.Module:
        children = list(self._modules.values())
        return children[index] if isinstance(index, int) else self._modules[index]

    def __iter__(self) -> Any:
        return iter(self._modules.values())

    def __len__(self) -> int:
        return len(self._modules)

    def __repr__(self) -> str:
        return f"<your {self._judge[2]}>"


class Remote(wire.Reference):
    """An object of the student's kernel (a function, class or instance), seen from the judge.

    Calls and attribute reads become requests; what comes back is data or another
    :class:`Remote` (the same one for the same object). Passing one back in a request sends only
    its handle. A call whose tensor arguments require grad is differentiable here.
    """

    def __init__(self, session: JudgeSession, handle: int, type_name: str) -> None:
        self._handle, self._session, self._type = handle, session, type_name

    def wire_reference(self) -> dict[str, Any]:
        return {"$handle": self._handle}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        recorder = self._session.recorder
        if recorder is None:
            return _call_remote(self._session, self._handle, args, kwargs)
        call = recorder.record(self._handle, args, kwargs, active_ban())  # (inputs as they go)
        value = _call_remote(self._session, self._handle, args, kwargs)
        recorder.answered(call, value)
        return value

    def traced(
        self, *args: Any, **kwargs: Any
    ) -> tuple[Any, list[tuple[str, list[tuple[int, ...]]]]]:
        """Call it; its value and the torch operations it ran (name, output shapes) in the kernel.

        The operations are the kernel's report, as data: a structural check (a loop form, a
        matrix form) can only be measured where the code runs.
        """
        recorder = self._session.recorder
        call = recorder.record(self._handle, args, kwargs, active_ban()) if recorder else None
        request = {
            "op": "call",
            "target": self._handle,
            "args": self._session.encode(list(args)),
            "kwargs": self._session.encode(dict(kwargs)),
            "trace": True,
            "rng": self._session.encode(self._session.rng_for_call()),
        }
        ban = active_ban()
        if ban is not None:
            request["ban"] = ban
        value, reply = self._session.request_reply(request)
        ops = reply.get("ops")
        if not isinstance(ops, list):
            raise JudgeError("the kernel did not report the operations it ran")
        try:
            log = [
                (str(name), [tuple(int(n) for n in shape) for shape in shapes])
                for name, shapes in ops
            ]
        except (TypeError, ValueError):
            raise JudgeError("the kernel's report of its operations is not data") from None
        if recorder is not None:
            recorder.answered(call, value)
        return value, log

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_handle", "_session", "_type"):
            raise AttributeError(name)
        return self._session.request({"op": "getattr", "target": self._handle, "name": name})

    def __iter__(self) -> Any:
        return iter(self._session.request({"op": "iter", "target": self._handle}))

    def __len__(self) -> int:
        return len(list(self))

    def judge_run(self, func: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        return self._session.run(func, args, kwargs)

    def __instancecheck__(self, obj: Any) -> bool:
        """``isinstance(part, YourClass)``: asked of the kernel (a structural fact)."""
        if not isinstance(obj, MirrorModule | Remote):
            return False
        handle = obj._judge[1] if isinstance(obj, MirrorModule) else obj._handle
        request = {"op": "isinstance", "target": handle, "cls": self._handle}
        return self._session.request(request) is True

    def __repr__(self) -> str:
        return f"<your {self._type}>"


class _RemoteTorchObject(Remote):
    """A student's optimizer or scheduler, seen from the judge as an instance of its torch class.

    Nothing of the torch class's state is here: every attribute the checks read
    (``param_groups``, ``step``) is read from the kernel's object when it is asked for.
    """

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_") or name in ("wire_reference", "traced", "judge_run"):
            return object.__getattribute__(self, name)
        return Remote.__getattr__(self, name)


_TORCH_BASES = ("torch.optim.", "torch.optim.lr_scheduler.")


@functools.cache
def _remote_class(dotted: Any) -> type[Remote]:
    """:class:`Remote`, or one that is also an instance of the torch optimizer or scheduler
    class named ``dotted`` (only classes of ``torch.optim`` are looked up)."""
    if not isinstance(dotted, str) or not dotted.startswith(_TORCH_BASES[0]):
        return Remote
    module_name, _, qualname = dotted.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), qualname)
    except (ImportError, AttributeError, ValueError):
        return Remote
    from torch.optim.lr_scheduler import LRScheduler

    if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer | LRScheduler)):
        return Remote
    return type(f"Your{qualname}", (_RemoteTorchObject, cls), {"__init__": Remote.__init__})


def student_names(source: str, namespace: dict[str, Any]) -> list[str]:
    """The names a test cell reads that neither it, the judge's namespace nor Python defines."""
    tree = parse_python(source)
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
    for name in lab_check_modules():
        namespace[name] = _checks_module(name)
    return namespace


def lab_check_modules() -> tuple[str, ...]:
    """The visible checks' module of every lab that has a spec (``lab01`` ... ): the names a
    test cell reads from the grader, never from the kernel. Derived from the spec files, so a
    new lab's checks are judged here as soon as its spec exists."""
    return tuple(f"lab{spec.lab[:2]}" for spec in all_specs())


def _checks_module(name: str) -> Any:
    try:
        return importlib.import_module(f"transformer_lab.checks.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"transformer_lab.checks.{name}":
            raise
        raise SpecError(
            f"the spec specs/{name}.toml has no visible checks module "
            f"transformer_lab/checks/{name}.py (start a lab with `transformer-lab labs new`)"
        ) from None


def stand_ins_for(names: Iterable[str], failed: Iterable[str]) -> dict[str, str]:
    """The earlier parts that the answers ``names`` build on and that failed their own checks:
    notebook name -> its PyTorch stand-in's name in :mod:`transformer_lab.standins`.

    Each lab's spec declares what a part builds on (``builds_on`` of
    :mod:`transformer_lab.checks.spec`: ``MultiHeadAttention`` calls ``split_heads``).
    """
    failed, names = set(failed), list(names)
    found: dict[str, str] = {}
    for spec in all_specs():
        for name in names:
            for part, stand_in in spec.builds_on(name).items():
                if part in failed and part not in names:
                    found[part] = stand_in
    return found


def judge_cell(
    grade_id: str,
    source: str,
    session: JudgeSession,
    namespace: Callable[[], dict[str, Any]] = grader_namespace,
    failed: Iterable[str] = (),
) -> Verdict:
    """Run a test cell's trusted ``source`` here, on the student's values; its verdict.

    ``failed`` names the answers whose own test cells failed earlier in the notebook; an answer
    of this cell that builds on one of them is judged with PyTorch's stand-in in its place
    (:func:`stand_ins_for`), so one mistake costs only its own cells' points.
    """
    started = time.monotonic()
    verdict = Verdict(grade_id, passed=False)
    named_mistakes()  # forget what an earlier cell named
    stand_ins: dict[str, str] = {}
    names: list[str] = []
    failure: BaseException | None = None
    try:
        env = namespace()
        names = student_names(source, env)
        stand_ins = stand_ins_for(names, failed)
        if stand_ins:
            session.request({"op": "bind", "names": stand_ins})
        for name in names:
            try:
                env[name] = session.lookup(name)
            except NameError:
                verdict.message = (
                    f"`{name}` is not defined in your notebook when this cell runs: run the "
                    "cell that defines it first (and keep its name)."
                )
                return verdict
        if session.draws:
            session.recorder = _recorder(env, names, stand_ins)
        with forwarded():  # bans go to the kernel with each call; nothing of theirs runs here
            exec(compile(source, f"<test cell {grade_id}>", "exec"), env)  # trusted: solutions/
        _judge_drawn(session)
        verdict.passed = True
    except AssertionError as exc:
        failure, verdict.message = exc, str(exc) or "the check failed"
    except JudgeError as exc:
        failure = exc
        verdict.message = f"The grader's judge got no usable answer from your notebook: {exc}"
    except Exception as exc:  # the check itself could not run on what the kernel returned
        failure = exc
        verdict.message = f"The check could not run on your answer: {type(exc).__name__}: {exc}"
    finally:
        session.recorder = None
        if stand_ins:
            _unbind(session)
        verdict.requests, verdict.seconds = session.requests, time.monotonic() - started
    named = named_mistakes()
    if session.hidden and failure is not None:
        verdict.message = hidden_message(failure, names, session.kernel_texts, named)
    if not verdict.passed and named:
        verdict.mistake = _short(named[-1])
    if stand_ins:
        verdict.message = _on_stand_ins(verdict, names, stand_ins)
    return verdict


def _recorder(env: dict[str, Any], names: list[str], stand_ins: dict[str, str]) -> drawn.Recorder:
    """What records the cell's calls to the student's functions that the kit answers too (not
    to a stand-in bound in place of a failed part: that is PyTorch's, not theirs)."""
    watched = {
        env[name]._handle: name
        for name in names
        if type(env.get(name)) is Remote and name not in stand_ins and drawn.kit_answer(name)
    }
    return drawn.Recorder(watched)


def _judge_drawn(session: JudgeSession) -> None:
    """A passed visible cell's drawn cases (:mod:`transformer_lab.grading.drawn`), each asked
    of the student's function under the ban its template ran under.

    Raises:
        AssertionError: an answer that differs from the kit's on a drawn case.
    """
    recorder, session.recorder = session.recorder, None
    if recorder is None or not recorder.calls:
        return
    handles = {name: handle for handle, name in recorder.watched.items()}

    def ask(call: drawn.Call) -> Any:
        return _call_remote(session, handles[call.name], call.args, call.kwargs, ban=call.ban)

    session.drawn = recorder.drawn
    drawn.judge(recorder, ask, passing=(JudgeError, ForbiddenCallError))


class Judgements:
    """The judge's verdicts on one notebook's test cells, taken in the notebook's order.

    The answers a failed cell tests are remembered, so that a later cell whose answer builds on
    one of them is judged with PyTorch's stand-in for it (:func:`judge_cell`'s ``failed``).
    """

    def __init__(self) -> None:
        self.verdicts: dict[str, dict[str, Any]] = {}
        self.failed: set[str] = set()

    def judge(self, grade_id: str, source: str, session: JudgeSession) -> Verdict:
        verdict = judge_cell(grade_id, source, session, failed=set(self.failed))
        self.verdicts[grade_id] = verdict.to_json()
        if not verdict.passed:
            self.failed.update(student_names(source, grader_namespace()))
        return verdict


def _unbind(session: JudgeSession) -> None:
    with contextlib.suppress(Exception):  # a dead kernel: nothing later runs in it anyway
        session.request({"op": "unbind"})


def _on_stand_ins(verdict: Verdict, names: list[str], stand_ins: dict[str, str]) -> str:
    """The message of a cell judged with stand-ins for parts that failed their own checks."""
    parts = " and ".join(f"`{p}`" for p in stand_ins)
    yours = " and ".join(f"`{n}`" for n in names) or "your answer"
    why = f"because your {parts} {'fails its' if len(stand_ins) == 1 else 'fail their'} own check"
    if verdict.passed:
        fine = "is fine" if len(names) <= 1 else "are fine"
        return f"Your {yours} {fine}: it was checked with PyTorch's {parts} {why}."
    return f"{verdict.message} (checked with PyTorch's {parts} {why})"


def _short(hint: str) -> str:
    """A catalogued mistake's name: its hint up to the first colon or full stop (120 at most)."""
    cut = min((i for i in (hint.find(": "), hint.find(". ")) if i > 0), default=len(hint))
    return hint[:cut].rstrip(".")[:120]
