"""Serve the judge's requests in the student's kernel: look up, call, read; reply with data.

For each judged cell the grader runs ``import transformer_lab.judge.kernel as _tl_judge;
_tl_judge.serve_loop()`` in the kernel once: the loop fetches each request with ``input()``
(Jupyter's stdin messages) and sends its reply as the prompt of the ``input()`` that fetches the
next one, until the grader answers :data:`END`. One request costs one input round trip, not a
cell's execution (IPython's transforms, hooks and replies: ~2 ms each). A request is one of

* ``{"op": "lookup", "name": "causal_mask"}``: a name of the notebook's namespace;
* ``{"op": "call", "target": h, "args": [...], "kwargs": {...}, "ban": {...}}``: call the
  object behind handle ``h`` (under the check's ban, if it names one: what the answer may not
  call; a ban enforced here is help for review, the judge trusts only the values). With
  ``"differentiable": true`` the call is kept, so that a later ``{"op": "grad", "call": c,
  "grads": [...]}`` returns the gradients of its outputs with respect to the tensors that were
  sent marked ``"grad"`` (a check's backward pass through the student's function);
  With ``"trace": true`` the reply also lists the torch operations the call ran and their
  output shapes (structural checks: a loop form, a matrix form). With ``"rng"`` (the judge's
  CPU random state) the call draws from that state and the reply carries the state after it,
  so dropout masks are those of one process;
* ``{"op": "getattr", "target": h, "name": "vocab"}``; ``{"op": "iter", "target": h}``
  (the items of an iterable object, as a list);
* ``{"op": "setattr", "target": h, "name": "log", "value": ...}`` and ``{"op": "delattr",
  ...}``: an instance attribute of the object (a check recording what ``self.log`` receives);
  ``{"op": "vars", "target": h}``: its public instance attributes;
* ``{"op": "isinstance", "target": h, "cls": c}``: whether the object is an instance of the
  class behind ``c`` (a structural fact, reported like the traced operations);
* ``{"op": "bind", "names": {"split_heads": "_split_heads"}}`` / ``{"op": "unbind"}``: put
  stand-ins of :mod:`transformer_lab.standins` under notebook names for one judged cell (a
  later answer checked on a reference for an earlier part that fails its own check), and put
  the notebook's own back;
* ``{"op": "run", "function": "transformer_lab.checks.lab06:name", "args": ...}``: a check's
  harness marked :func:`~transformer_lab.checks._common.kernel_side` (running Lightning's
  ``Trainer`` on the student's module), called here like a ``call``; it returns data.

An optimizer or a learning-rate scheduler goes as a reference that names its torch class
(``"torch": "torch.optim.adamw.AdamW"``), so that the judge's checks can treat it as one; its
parameter groups hold ``{"$param": ...}`` references to the mirrored modules' parameters.

Results go back as data (:mod:`transformer_lab.judge.wire`); anything that is not data (a
function, a class, a module, a tokenizer) stays here behind a handle, the same handle each time
for the same object. Objects of the grader's (a check's model, a step function) arrive as
:class:`GraderObject` stand-ins: calling one asks the grader through the kernel's input channel
(``input()``, Jupyter's stdin messages), and the answer comes back as data. Exceptions go back as
their type names and message. Nothing here decides or knows a score.
"""

from __future__ import annotations

import builtins
import importlib
import itertools
from typing import Any

import torch

from transformer_lab.judge import mirror, wire

__all__ = [
    "CALLBACK_PREFIX",
    "END",
    "REPLY_PREFIX",
    "REQUEST_PROMPT",
    "GraderObject",
    "reply",
    "serve",
    "serve_loop",
]

#: What starts the prompt of an ``input()`` that carries a call back to the grader.
CALLBACK_PREFIX = "\x1etl-judge\x1e"
#: The prompt of the ``input()`` that fetches the judge's first request of a cell.
REQUEST_PROMPT = "\x1etl-judge-request\x1e"
#: What starts the prompt that carries a reply (and fetches the next request).
REPLY_PREFIX = "\x1etl-judge-reply\x1e"
#: The grader's answer that ends :func:`serve_loop` (never a request: requests are objects).
END = "\x1etl-judge-end\x1e"

_objects: dict[int, Any] = {}
_handles: dict[int, int] = {}  # id(object) -> its handle
_grader_modules: dict[int, Any] = {}  # the grader's modules mirrored here, by root handle
_synced: dict[int, dict[str, Any]] = {}  # root handle -> the values the judge last sent
_grader_ids: dict[int, tuple[int, Any]] = {}  # id(mirror part) -> (grader handle, part)
_calls: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
_param_refs: dict[int, tuple[torch.nn.Parameter, int, str]] = {}  # id -> (param, owner, name)
_numbers = itertools.count(1)
_last = ""

#: Exception types a call back to the grader may raise here, by name.
_ERRORS = {
    name: getattr(builtins, name)
    for name in ("ValueError", "TypeError", "IndexError", "KeyError", "RuntimeError")
}


def _handle_of(obj: Any) -> int:
    handle = _handles.get(id(obj))
    if handle is None or _objects.get(handle) is not obj:
        handle = len(_objects) + 1
        _objects[handle], _handles[id(obj)] = obj, handle
    return handle


def _origin(part: Any) -> int | None:
    """The grader's handle of ``part`` when it is a mirror of one of the grader's modules."""
    grader = _grader_ids.get(id(part))
    return grader[0] if grader is not None and grader[1] is part else None


def _torch_class(obj: Any) -> str | None:
    """The torch optimizer or scheduler class ``obj`` is, by its dotted name (or None)."""
    from torch.optim import Optimizer
    from torch.optim.lr_scheduler import LRScheduler

    if not isinstance(obj, Optimizer | LRScheduler):
        return None
    for cls in type(obj).__mro__:
        if cls.__module__.startswith("torch.optim"):
            return f"{cls.__module__}.{cls.__qualname__}"
    return None


def _keep(obj: Any) -> dict[str, Any] | None:
    if isinstance(obj, torch.nn.Parameter):
        ref = _param_refs.get(id(obj))
        return {"$param": ref[1], "name": ref[2]} if ref is not None and ref[0] is obj else None
    origin = _origin(obj)
    if origin is not None:  # a mirror of the grader's: send it back as such
        return {"$grader": origin}
    if isinstance(obj, torch.nn.Module):
        data = mirror.spec(obj, _handle_of, "$module", _origin)
        for sub in obj.modules():
            for name, p in sub._parameters.items():
                if p is not None:
                    _param_refs[id(p)] = (p, _handle_of(sub), name)
        return data
    data = {"$handle": _handle_of(obj), "type": type(obj).__name__}
    torch_class = _torch_class(obj)
    if torch_class is not None:
        data["torch"] = torch_class
    return data


def _sync(sync: list[Any]) -> dict[int, Any]:
    """Put the judge's mirrored parameters and modes into the student's modules.

    Each entry is ``[root, params, modes, kept]``: ``kept`` names the parameters the judge did
    not send again because they equal what it sent last; they get that value back (whatever
    the student's code did to them since), so every call starts from the judge's values.
    """
    before = {}
    for root_handle, params, modes, *rest in sync:
        root = _objects[root_handle]
        synced = _synced.setdefault(root_handle, {})
        kept = rest[0] if rest else []
        missing = [name for name in kept if name not in synced]
        if missing:
            raise wire.WireError(f"parameters {missing[:3]} were never sent")
        mirror.sync_into(root, [*params, *[[name, synced[name]] for name in kept]], modes)
        synced.update({str(name): value.detach() for name, value in params})
        before[root_handle] = mirror.snapshot(root)
    return before


def _storages() -> dict[int, tuple[str, torch.Tensor]]:
    """Data pointer -> ``"root:name"`` and the tensor of every parameter of the grader's
    mirrored modules (a parameter pointed at one's memory comes back as a view into it)."""
    return {
        p.untyped_storage().data_ptr(): (f"{root}:{name}", p)
        for root, module in _grader_modules.items()
        for name, p in module.named_parameters()
        if p.numel()
    }


def _changes(
    modules: dict[int, Any], before: dict[int, Any], storages: dict[int, tuple[str, torch.Tensor]]
) -> list[Any]:
    """What a call did to the parameters of ``modules`` (root handle -> module), as data."""
    found = []
    for root, snap in before.items():
        change = mirror.changes(modules[root], snap, storages)
        if change is not None:
            found.append([root, *change])
    return found


def _ask(text: str) -> str:
    """One call back to the grader, answered through the kernel's input channel."""
    return builtins.input(CALLBACK_PREFIX + text)


class GraderObject(wire.Reference):
    """An object of the grader's (a check's model or step function), seen from the kernel."""

    def __init__(self, handle: int, type_name: str) -> None:
        self._handle, self._type = handle, type_name

    def wire_reference(self) -> dict[str, Any]:
        return {"$grader": self._handle}

    def _request(self, message: dict[str, Any]) -> Any:
        """The grader's answer to ``message``, as a value."""
        return wire.decode(self._request_reply(message).get("value"), _reference)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        marked: list[torch.Tensor] = []  # tensors with a graph arrive marked as such
        message = {
            "op": "call",
            "target": self._handle,
            "args": wire.encode(list(args), keep=_keep, grads=marked),
            "kwargs": wire.encode(dict(kwargs), keep=_keep, grads=marked),
        }
        if not marked or not torch.is_grad_enabled():
            return self._request(message)
        # The student differentiates through the check's function (a gradient-based
        # ``depends_on_future``): the call is one operation of the kernel's graph.
        message["differentiable"] = True
        box: dict[str, Any] = {}
        outputs = _CallBack.apply(self, message, box, *marked)
        return box["rebuild"](outputs)

    def _request_reply(self, message: dict[str, Any]) -> dict[str, Any]:
        """The grader's whole answer to ``message``; its error, raised here, if it failed."""
        answer = wire.loads(_ask(wire.dumps(message)))
        if answer.get("ok") is True:
            return answer
        error = _ERRORS.get(str(answer.get("type")), RuntimeError)
        raise error(str(answer.get("message", "")))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_handle", "_type"):
            raise AttributeError(name)
        return self._request({"op": "getattr", "target": self._handle, "name": name})

    def __iter__(self) -> Any:
        return iter(self._request({"op": "iter", "target": self._handle}))

    def __repr__(self) -> str:
        return f"<the grader's {self._type}>"


class _CallBack(torch.autograd.Function):
    """A differentiable call of the grader's function: its backward asks the grader."""

    @staticmethod
    def forward(ctx: Any, obj: GraderObject, message: dict[str, Any], box: dict, *marked: Any):
        answer = obj._request_reply(message)
        value = wire.decode(answer.get("value"), _reference)
        flat, box["rebuild"] = wire.result_tensors(value)  # as the grader read its result
        ctx.obj, ctx.call, ctx.n_inputs = obj, answer.get("call"), len(marked)
        needs = answer.get("needs", [])
        ctx.mark_non_differentiable(
            *[t for t, n in zip(flat, needs, strict=False) if n is not True]
        )
        return tuple(flat) if flat else torch.zeros(())

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> tuple[Any, ...]:
        answer = ctx.obj._request_reply(
            {"op": "grad", "call": ctx.call, "grads": wire.encode(list(grad_outputs), keep=_keep)}
        )
        found = wire.decode(answer.get("value"), _reference)
        return (None, None, None, *list(found)[: ctx.n_inputs])


def _grader_module(data: dict[str, Any]) -> Any:
    """A mirror of one of the grader's modules (``{"$gmodule": ...}``), built once."""
    root = data["$gmodule"]
    if root in _grader_modules:
        return _grader_modules[root]
    module, parts = mirror.build(
        data, lambda d: wire.decode(d, _reference), lambda h, kind: GraderModule(h, kind)
    )
    _grader_modules[root] = module
    _grader_ids.update({id(part): (handle, part) for handle, part in parts.items()})
    for part in parts.values():
        if isinstance(part, GraderModule):
            part.__dict__["_ready"] = True
    return module


def _reference(data: dict[str, Any]) -> Any:
    if "$param" in data:
        raise wire.WireError("the judge sends no $param")
    if "$gmodule" in data:
        return _grader_module(data)
    if "$grader" in data and data["$grader"] in _grader_by_handle():
        return _grader_by_handle()[data["$grader"]]
    if "$grader" in data:
        return GraderObject(data["$grader"], str(data.get("type", "object")))
    try:
        return _objects[data["$handle"]]
    except KeyError:
        raise wire.WireError(f"no object behind handle {data['$handle']}") from None


def _grader_by_handle() -> dict[int, Any]:
    return {handle: part for handle, part in _grader_ids.values()}


class GraderModule(torch.nn.Module, wire.Reference):
    """A mirror of one of the grader's modules: its parameters here, its forward the grader's."""

    def __init__(self, handle: int, type_name: str) -> None:
        super().__init__()
        self.__dict__["_grader"] = (handle, type_name)

    def wire_reference(self) -> dict[str, Any]:
        return {"$grader": self._grader[0]}

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return GraderObject(self._grader[0], self._grader[1])(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_") or not self.__dict__.get("_ready"):
                raise
        return getattr(GraderObject(*self.__dict__["_grader"]), name)

    def __repr__(self) -> str:
        return f"<the grader's {self._grader[1]}>"


def _namespace() -> dict[str, Any]:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("the judge serves a notebook's kernel, and this is not one")
    return shell.user_ns


def _call(target: Any, args: list[Any], kwargs: dict[str, Any], ban: dict[str, Any] | None) -> Any:
    if not ban:
        return target(*args, **kwargs)
    from transformer_lab.judge.bans import Ban, enforced_here, forbidden

    rule = Ban(
        ops=tuple(ban.get("ops", ())),
        functions=tuple(ban.get("functions", ())),
        reason=str(ban.get("reason", "")),
    )
    with enforced_here(), forbidden(rule):
        return target(*args, **kwargs)


def _written(watched: list[torch.Tensor], kept: list[torch.Tensor]) -> list[Any]:
    """``[index, new value]`` of each argument tensor the call wrote into (bit for bit, so a
    NaN left as it was is no write): the judge makes the same write on its own tensor."""
    return [
        [index, now.detach().clone()]
        for index, (now, was) in enumerate(zip(watched, kept, strict=True))
        if not wire.same_bits(now, was)
    ]


def _run(request: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The value a request asks for, and what else its reply says."""
    op = request.get("op")
    if op == "lookup":
        name = request.get("name")
        namespace = _namespace()
        if not isinstance(name, str) or name not in namespace:
            raise NameError(f"name {name!r} is not defined")
        return namespace[name], {}
    if op == "grad":
        inputs, outputs = _calls.pop(int(request.get("call", 0)))
        grads = wire.decode(request.get("grads", []), _reference)
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=False) if o.requires_grad]
        if not pairs or not inputs:
            return [None] * len(inputs), {}
        found = torch.autograd.grad(
            [o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True
        )
        return list(found), {}
    if op == "bind":
        _bind(request.get("names", {}))
        return None, {}
    if op == "unbind":
        _unbind()
        return None, {}
    if op == "run":  # a check's harness, run here on the kernel's objects
        target, op = _kernel_side(request.get("function")), "call"
    else:
        target = _reference({"$handle": request.get("target")})
    if op == "call":
        inputs: list[torch.Tensor] = []
        args = wire.decode(request.get("args", []), _reference, inputs)
        kwargs = wire.decode(request.get("kwargs", {"$dict": []}), _reference, inputs)
        sync = wire.decode(request.get("sync", []), _reference)
        before = _sync(sync)
        for root_handle, params, *_ in sync:  # the mirrors' parameters sent to differentiate
            own = dict(_objects[root_handle].named_parameters())
            inputs += [own[name] for name, value in params if value.requires_grad and name in own]
        storages = _storages()
        graders = {root: mirror.snapshot(m) for root, m in _grader_modules.items()}
        if "rng" in request:  # the check's random stream: dropout drawn as in one process
            torch.random.set_rng_state(wire.decode(request["rng"], _reference))
        watched = wire.plain_tensors([args, kwargs])
        kept = [t.detach().clone() for t in watched]
        value, extra = _call_as_asked(request, target, args, kwargs, inputs)
        written = _written(watched, kept)
        if written:
            extra["written"] = wire.encode(written)
        if "rng" in request:
            extra["rng"] = wire.encode(torch.random.get_rng_state())
        changes = _changes(_objects, before, storages)
        grader_changes = _changes(_grader_modules, graders, storages)
        if changes:
            extra["changes"] = wire.encode(changes)
        if grader_changes:
            extra["grader_changes"] = wire.encode(grader_changes)
        return value, extra
    if op == "getattr":
        return getattr(target, str(request.get("name"))), {}
    if op == "iter":
        return list(target), {}
    return _instance_op(op, target, request), {}


def _kernel_side(dotted: Any) -> Any:
    """The check harness ``"transformer_lab.checks.labNN:name"`` marked ``kernel_side``."""
    module_name, _, qualname = str(dotted).partition(":")
    if not module_name.startswith(mirror.PORTABLE_PREFIX) or not qualname.isidentifier():
        raise wire.WireError(f"no harness {dotted!r}")
    func = getattr(importlib.import_module(module_name), qualname, None)
    if not getattr(func, "judge_kernel_side", False):
        raise wire.WireError(f"{dotted!r} is not a harness the judge may run here")
    return func


_STAND_IN_MODULE = "transformer_lab.standins"
_bound: dict[str, Any] = {}  # name -> what the notebook held before a bind (or _UNSET)
_exempted: set[Any] = set()  # code objects of the bound stand-ins, exempted from bans
_UNSET = object()


def _bind(names: Any) -> None:
    """Put PyTorch stand-ins (:mod:`transformer_lab.standins`) under notebook names, for one
    judged cell: the student's later code is then checked on a reference for an earlier part."""
    namespace = _namespace()
    stand_ins = importlib.import_module(_STAND_IN_MODULE)
    for name, attr in dict(names).items():
        value = getattr(stand_ins, str(attr), None)
        if not (str(name).isidentifier() and callable(value)):
            raise wire.WireError(f"no stand-in {attr!r} for {name!r}")
        _bound.setdefault(str(name), namespace.get(str(name), _UNSET))
        namespace[str(name)] = value
        # A stand-in under a notebook name is the earlier part's reference, not the student's
        # shortcut: the ban that refuses the kit's (and idle stand-ins') code lets it through.
        from transformer_lab.judge.bans import exempt

        _exempted.update(exempt(value))


def _unbind() -> None:
    """The notebook's own names back, after a cell judged on stand-ins."""
    namespace = _namespace()
    for name, old in _bound.items():
        if old is _UNSET:
            namespace.pop(name, None)
        else:
            namespace[name] = old
    _bound.clear()
    from transformer_lab.judge.bans import unexempt

    unexempt(_exempted)
    _exempted.clear()


def _instance_op(op: Any, target: Any, request: dict[str, Any]) -> Any:
    """``setattr``, ``delattr``, ``vars`` and ``isinstance`` on the object ``target``."""
    name = str(request.get("name", ""))
    if op in ("setattr", "delattr") and (name.startswith("_") or not name.isidentifier()):
        raise AttributeError(f"the judge sets no attribute {name!r}")
    if op == "setattr":
        vars(target)[name] = wire.decode(request.get("value"), _reference)
        return None
    if op == "delattr":
        vars(target).pop(name, None)
        return None
    if op == "vars":
        return {k: v for k, v in vars(target).items() if not k.startswith("_")}
    if op == "isinstance":
        cls = _reference({"$handle": request.get("cls")})
        return isinstance(target, cls) if isinstance(cls, type) else False
    raise wire.WireError(f"unknown request {op!r}")


def _call_as_asked(
    request: dict[str, Any], target: Any, args: Any, kwargs: Any, inputs: list[torch.Tensor]
) -> tuple[Any, dict[str, Any]]:
    """Call ``target``: plainly, with its operations logged, or kept for a backward pass."""
    if request.get("trace"):  # a structural check: which operations the code runs
        from transformer_lab.judge.oplog import OpLog

        log = OpLog()
        with log:
            value = _call(target, list(args), dict(kwargs), request.get("ban"))
        return value, {"ops": [[name, [list(s) for s in shapes]] for name, shapes in log.ops]}
    value = _call(target, list(args), dict(kwargs), request.get("ban"))
    if not request.get("differentiable"):
        return value, {}
    outputs, _ = wire.result_tensors(value)
    call = next(_numbers)
    _calls[call] = (inputs, outputs)
    for old_call in [c for c in _calls if c <= call - 64]:  # a bounded memory of calls
        del _calls[old_call]
    return value, {"call": call, "needs": [o.requires_grad for o in outputs]}


def _error(exc: BaseException) -> dict[str, Any]:
    return {
        "ok": False,
        "type": type(exc).__name__,
        "bases": [cls.__name__ for cls in type(exc).__mro__],
        "message": str(exc)[:2000],
    }


def serve(text: str) -> None:
    """Answer one request: its reply is kept, for :func:`serve_loop` to send (and :func:`reply`)."""
    global _last
    try:
        request = wire.loads(text)
        value, extra = _run(request)
        # An object's attributes say which tensors keep a graph (as "grad" marks).
        marked: list[torch.Tensor] | None = [] if request.get("op") == "vars" else None
        encoded = wire.encode(value, keep=_keep, grads=marked)
        _last = wire.dumps({"ok": True, "value": encoded, **extra})
    except BaseException as exc:  # a reply in every case: the judge decides what it means
        try:
            _last = wire.dumps(_error(exc))
        except Exception:
            _last = wire.dumps({"ok": False, "type": "Exception", "bases": [], "message": ""})


def serve_loop() -> None:
    """Serve the judge's requests of one judged cell until it answers :data:`END`.

    Each reply travels as the prompt of the ``input()`` that fetches the next request, so a
    request costs one input round trip (no cell execution), whatever its size.
    """
    text = builtins.input(REQUEST_PROMPT)
    while text != END:
        serve(text)
        text = builtins.input(REPLY_PREFIX + _last)


def reply() -> str:
    """The reply to the last request."""
    return _last
