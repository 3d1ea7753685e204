"""What a graded function may not call while a check runs it, and how the refusal is enforced.

A lab asks for the student's own softmax, layer norm or attention; a graded function that
calls PyTorch's (or the kit's) version must earn nothing. A ban names what computes the answer,
not one spelling of it:

* **torch operations by family** (:data:`OP_FAMILIES`): ``"softmax"`` refuses ``torch.softmax``,
  ``F.softmax``, ``x.softmax``, ``F.log_softmax``, ``F.softmin``, ``torch._softmax`` ... however
  the student reached them (an alias saved before the check, a default argument). A documented
  PyTorch hook, ``TorchFunctionMode``, sees every call of a torch function or ``Tensor`` method, so
  ``F.group_norm(x.reshape(-1, D), 1)`` is refused as a normalisation just like ``F.layer_norm``.
  (The lower ``TorchDispatchMode`` would also see ``torch.ops.aten`` calls, but its first use
  imports ``torch._dynamo``, seconds per kernel; the grader's static scan flags ``torch.ops``
  and ``torch._C`` in student code instead.)
* **Python functions and classes** (the kit's implementation of an earlier lab that computes
  this lab's answer, PyTorch modules such as ``nn.MultiheadAttention``): refused by the identity
  of their code objects through ``sys.setprofile``, which sees every call of every alias. A
  dotted name of the kit means the kit's own code (:data:`transformer_lab.graded.KIT_ORIGINALS`),
  not whatever sits in that slot now: a student's own ``softmax``, carried forward into
  ``transformer_lab.attention.softmax``, is the student's code and may be called.

Whatever a ban names, the oracles of the checks are refused too: every function of a loaded
hidden-check module (``transformer_lab.grading.hidden.*``) and every ``reference_*`` helper of
the visible checks. The rule for check authors: only the student's call runs inside a ban.

A refusal raises :class:`ForbiddenCallError` (an ``AssertionError``, so the test cell fails with
its message) at the call and is also recorded: if the student's code catches and hides it, the
check still fails when the ban ends.

Reference: PyTorch, "Extending torch with a Tensor-like type" (``__torch_function__`` modes) and
``torch.utils._python_dispatch.TorchDispatchMode``; Python's ``sys.setprofile``.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import threading
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = [
    "OP_FAMILIES",
    "Ban",
    "ForbiddenCallError",
    "active_ban",
    "enforced_here",
    "exempt",
    "forbidden",
    "forwarded",
    "refusal",
]

#: Operations that compute the same thing under several names (public functions and the
#: ATen operators they dispatch to). A ban of a family refuses every name in it.
OP_FAMILIES: dict[str, frozenset[str]] = {
    "softmax": frozenset(
        {
            "softmax",
            "log_softmax",
            "_softmax",
            "_log_softmax",
            "softmin",
            "gumbel_softmax",
            "_sparse_softmax",
            "_sparse_log_softmax",
        }
    ),
    "normalization": frozenset(
        {
            "layer_norm",
            "native_layer_norm",
            "group_norm",
            "native_group_norm",
            "batch_norm",
            "native_batch_norm",
            "_native_batch_norm_legit",
            "_native_batch_norm_legit_no_training",
            "_batch_norm_impl_index",
            "cudnn_batch_norm",
            "instance_norm",
            "rms_norm",
            "_fused_rms_norm",
            "local_response_norm",
        }
    ),
    "attention": frozenset(
        {
            "scaled_dot_product_attention",
            "_scaled_dot_product_attention_math",
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_fused_attention_overrideable",
            "multi_head_attention_forward",
            "_native_multi_head_attention",
            "_transformer_encoder_layer_fwd",
        }
    ),
    "embedding": frozenset({"embedding", "embedding_bag", "_embedding_bag"}),
    "cross_entropy": frozenset({"cross_entropy", "nll_loss", "nll_loss_nd", "nll_loss2d"}),
}


class ForbiddenCallError(AssertionError):
    """A graded function called something its check does not allow."""


@dataclass(frozen=True)
class Ban:
    """What a graded function may not use while a check runs it.

    Attributes:
        ops: torch operation families (keys of :data:`OP_FAMILIES`) or single operator names
            (``"tril"``), refused under every spelling.
        functions: Python functions, classes or modules (or dotted names of them, e.g.
            ``"transformer_lab.attention.scaled_dot_product_attention"``,
            ``"torch.nn.MultiheadAttention"``, ``"transformer_lab.positional"``); a class bans
            every method it defines, a module every function and class it defines. Dotted names
            of the kit that this install lacks are skipped.
        reason: said after the refusal, e.g. ``"lab 02 asks for your own softmax"``.
    """

    ops: tuple[str, ...] = ()
    functions: tuple[Any, ...] = ()
    reason: str = ""
    _names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names: set[str] = set()
        for op in self.ops:
            names |= OP_FAMILIES.get(op, frozenset({op}))
        object.__setattr__(self, "_names", frozenset(names))

    def __or__(self, other: Ban) -> Ban:
        reason = self.reason if self.reason == other.reason else self.reason or other.reason
        return Ban(self.ops + other.ops, self.functions + other.functions, reason)

    def op_refused(self, name: str) -> bool:
        """Whether the torch operation ``name`` (``"softmax"``, ``"aten::_softmax"``) is refused."""
        return name.rpartition("::")[2].split(".")[0] in self._names


def _resolve(target: str) -> Any:
    """The object a dotted name such as ``torch.nn.functional.softmax`` refers to."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"cannot import {target!r}")


def _kit_own(dotted: str, found: Any) -> Any:
    """The kit's own object at ``dotted``: a graded answer as its module defined it, not what sits
    in its place now (a student's saved answer, installed there by :mod:`transformer_lab.answers`,
    is the student's code and no shortcut; the kit's own answer stays refused wherever it is)."""
    from transformer_lab.graded import KIT_ORIGINALS

    return KIT_ORIGINALS.get(dotted, found)


def _kit_originals_in(module: str) -> list[Any]:
    """The kit's own graded objects defined in ``module`` (see :func:`_kit_own`)."""
    from transformer_lab.graded import KIT_ORIGINALS

    prefix = module + "."
    return [obj for dotted, obj in KIT_ORIGINALS.items() if dotted.startswith(prefix)]


def _label(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or ""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    return f"{module}.{name}" if module else name


def _code_objects(targets: Iterable[Any]) -> dict[types.CodeType, str]:
    """Code object -> display name for every Python function (or class method) in ``targets``."""
    codes: dict[types.CodeType, str] = {}
    for target in targets:
        label = target if isinstance(target, str) else None
        if isinstance(target, str):
            try:
                target = _kit_own(target, _resolve(target))
            except (ImportError, AttributeError):
                if label.startswith("transformer_lab."):
                    continue  # an older kit without this name: nothing to ban
                raise
        if isinstance(target, types.ModuleType):
            # A module: every function and class it defines (helpers included), the kit's own
            # graded ones even where a student's answer sits in their place now.
            defined = [
                v
                for v in vars(target).values()
                if getattr(v, "__module__", None) == target.__name__
                and (isinstance(v, type) or callable(v))
            ]
            codes.update(_code_objects([*defined, *_kit_originals_in(target.__name__)]))
            continue
        if isinstance(target, type):
            owner = label or _label(target)
            members = [
                (f"{owner}.{name}", member)
                for name, member in vars(target).items()
                if not name.startswith("__") or name in ("__init__", "__call__")
            ]
        else:
            members = [(label, target)]
        for name, member in members:
            func = getattr(member, "__func__", member)  # staticmethod, classmethod, bound method
            # A decorated function (``@torch.no_grad()``) runs the decorator's shared wrapper
            # code first: ban the code of the function it wraps, not the wrapper.
            func = inspect.unwrap(func) if callable(func) else func
            code = getattr(func, "__code__", None)
            if isinstance(code, types.CodeType):
                codes[code] = name or _label(func)
            elif member is target:
                raise ValueError(f"cannot ban {target!r}: not a Python function or class")
    return codes


#: Modules whose every function and class is refused inside a ban (the hidden checks and their
#: oracles, where a grader loaded them), and the prefix of visible-check helpers that compute an
#: expected answer (``reference_*``): a student's function must not call them.
_ORACLE_MODULES = "transformer_lab.grading.hidden."
_REFERENCE_PREFIX = "reference_"


def _checker_codes() -> dict[types.CodeType, str]:
    """Code objects of every loaded oracle: hidden-check modules, visible ``reference_*`` helpers.

    Check code therefore never runs inside a ban window: only the student's call does.
    """
    found: list[Any] = []
    for name, module in list(sys.modules.items()):
        if module is None:
            continue
        if name.startswith(_ORACLE_MODULES):
            found.append(module)
        elif name.startswith("transformer_lab.checks."):
            found += [
                v
                for k, v in vars(module).items()
                if k.startswith(_REFERENCE_PREFIX) and callable(v)
            ]
    return _code_objects(found)


#: Code of the PyTorch stand-ins that :func:`transformer_lab.answers.install` put where an earlier
#: lab's locked answer was: the operations they call compute that earlier answer, which a later
#: lab may reuse (lab 03's heads on lab 02's attention). A stand-in of the lab being checked is
#: never installed, so calling it directly is refused as usual.
_EXEMPT: set[types.CodeType] = set()


def exempt(*objects: Any) -> set[types.CodeType]:
    """Let the torch operations that ``objects`` (installed stand-ins) call pass every ban;
    the code objects newly exempted (for :func:`unexempt`)."""
    added = set(_code_objects(objects)) - _EXEMPT
    _EXEMPT.update(added)
    return added


def unexempt(codes: set[types.CodeType]) -> None:
    """Undo one :func:`exempt` (the judge's stand-ins after the cell judged on them)."""
    _EXEMPT.difference_update(codes)


def _idle_stand_ins() -> dict[types.CodeType, str]:
    """Code of the PyTorch stand-ins that are not installed (those of the lab being checked)."""
    try:  # imported here: a student's code could import it only inside the call
        module = importlib.import_module("transformer_lab.standins")
    except ImportError:  # an older kit without stand-ins
        return {}
    codes = _code_objects(module.STAND_INS.values())
    return {code: name for code, name in codes.items() if code not in _EXEMPT}


def _inside_exempt() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code in _EXEMPT:
            return True
        frame = frame.f_back
    return False


class _Refusals:
    """The refusals of one :func:`forbidden` block (first message kept, every call counted)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.messages: list[str] = []

    def refuse(self, what: str) -> None:
        message = refusal(what, self.reason)
        self.messages.append(message)
        raise ForbiddenCallError(message)


def refusal(what: str, reason: str) -> str:
    """The message of a refused call of ``what`` (the kernel's words, and a hidden check's)."""
    message = (
        f"your graded function called {what}, which this exercise does not allow: write the "
        "computation yourself"
    )
    return message + (f" ({reason})." if reason else ".")


class _FunctionBan(TorchFunctionMode):
    """Refuses banned torch functions at the level of the public API (``F.group_norm``)."""

    def __init__(self, ban: Ban, refusals: _Refusals) -> None:
        super().__init__()
        self.ban, self.refusals = ban, refusals

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if self.ban.op_refused(name) and not (_EXEMPT and _inside_exempt()):
            self.refusals.refuse(_torch_label(func, name))
        return func(*args, **(kwargs or {}))


def _torch_label(func: Any, name: str) -> str:
    module = getattr(func, "__module__", None) or ""
    if module.startswith(("torch.nn.functional", "torch._C._nn")):
        return f"torch.nn.functional.{name}"
    if isinstance(func, types.MethodDescriptorType | types.WrapperDescriptorType) or (
        getattr(func, "__objclass__", None) is torch.Tensor
    ):
        return f"torch.Tensor.{name}"
    return f"torch.{name}"


@contextlib.contextmanager
def forbidden(ban: Ban) -> Iterator[None]:
    """Run the block with ``ban`` enforced; wrap only the student's call, never the oracle.

    ::

        with forbidden(Ban(ops=("softmax",), reason="lab 02 asks for your own softmax")):
            got = call_student(fn, x, what="softmax(x)")

    Raises:
        ForbiddenCallError: at the refused call, and again when the block ends if the student's
            code caught and hid a refusal.
        ValueError, ImportError: a banned target that does not exist.
    """
    _ACTIVE.append(ban)
    try:
        if getattr(_WHERE, "forwarding", False):
            yield  # the judge's side: the kernel enforces the ban it is sent with each call
        else:
            with _enforced(ban):
                yield
    finally:
        _ACTIVE.pop()


#: Whether this thread runs the judge's checks (bans recorded and forwarded, not enforced).
_WHERE = threading.local()


@contextlib.contextmanager
def _forwarding(on: bool) -> Iterator[None]:
    previous = getattr(_WHERE, "forwarding", False)
    _WHERE.forwarding = on
    try:
        yield
    finally:
        _WHERE.forwarding = previous


def forwarded() -> contextlib.AbstractContextManager[None]:
    """In this block a :func:`forbidden` ban is only recorded (:func:`active_ban`), for the
    grader's judge to send with each call: its checks run where none of the student's code
    does, so enforcing there would only resolve the banned names (importing Lightning, say)
    and slow the judge's own code down."""
    return _forwarding(True)


def enforced_here() -> contextlib.AbstractContextManager[None]:
    """In this block :func:`forbidden` enforces its ban again (the kernel's side of a call the
    judge asked for, even when the kernel is served in the judge's own thread, in tests)."""
    return _forwarding(False)


#: The bans of the blocks running now, innermost last (the judge forwards them to the kernel).
_ACTIVE: list[Ban] = []


def _dotted(target: Any) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, types.ModuleType):
        return target.__name__
    return f"{target.__module__}.{target.__qualname__}"


def active_ban() -> dict[str, Any] | None:
    """The bans in force, as data (``{"ops", "functions", "reason"}``), or None when none is.

    The grader's judge sends this with each call of a student's function, so the kernel runs
    the call under the same ban as the check asked for.
    """
    if not _ACTIVE:
        return None
    return {
        "ops": sorted({op for ban in _ACTIVE for op in ban.ops}),
        "functions": sorted({_dotted(f) for ban in _ACTIVE for f in ban.functions}),
        "reason": next((ban.reason for ban in reversed(_ACTIVE) if ban.reason), ""),
    }


@contextlib.contextmanager
def _enforced(ban: Ban) -> Iterator[None]:
    refusals = _Refusals(ban.reason)
    codes = {**_checker_codes(), **_idle_stand_ins(), **_code_objects(ban.functions)}
    for code in _EXEMPT & codes.keys():  # an installed (or judge-bound) stand-in is no shortcut
        del codes[code]
    previous = sys.getprofile()

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in codes:
            refusals.refuse(codes[frame.f_code])
        if previous is not None:
            previous(frame, event, arg)

    modes: list[Any] = [_FunctionBan(ban, refusals)] if ban.ops else []
    with contextlib.ExitStack() as stack:
        for mode in modes:
            stack.enter_context(mode)
        if codes:
            sys.setprofile(profile)
            stack.callback(sys.setprofile, previous)
        yield
    if refusals.messages:
        raise ForbiddenCallError(refusals.messages[0] + " (the error was caught inside your code)")
