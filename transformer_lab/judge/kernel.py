"""Serve the judge's requests in the student's kernel: look up, call, read; reply with data.

The grader runs ``import transformer_lab.judge.kernel as _tl_judge; _tl_judge.serve(TEXT)``
in the kernel and reads ``_tl_judge.reply()`` back as a user expression. A request is one of

* ``{"op": "lookup", "name": "causal_mask"}``: a name of the notebook's namespace;
* ``{"op": "call", "target": h, "args": [...], "kwargs": {...}, "ban": {...}}``: call the
  object behind handle ``h`` (under the check's ban, if it names one: what the answer may not
  call; a ban enforced here is help for review, the judge trusts only the values);
* ``{"op": "getattr", "target": h, "name": "vocab"}``; ``{"op": "iter", "target": h}``
  (the items of an iterable object, as a list).

Results go back as data (:mod:`transformer_lab.judge.wire`); anything that is not data (a
function, a class, a module, a tokenizer) stays here behind a handle. Exceptions go back as
their type names and message. Nothing here decides or knows a score.
"""

from __future__ import annotations

from typing import Any

from transformer_lab.judge import wire

__all__ = ["reply", "serve"]

_objects: dict[int, Any] = {}
_last = ""


def _keep(obj: Any) -> dict[str, Any]:
    handle = len(_objects) + 1
    _objects[handle] = obj
    return {"$handle": handle, "type": type(obj).__name__, "callable": callable(obj)}


def _object(data: dict[str, Any]) -> Any:
    try:
        return _objects[data["$handle"]]
    except KeyError:
        raise wire.WireError(f"no object behind handle {data['$handle']}") from None


def _namespace() -> dict[str, Any]:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("the judge serves a notebook's kernel, and this is not one")
    return shell.user_ns


def _call(target: Any, args: list[Any], kwargs: dict[str, Any], ban: dict[str, Any] | None) -> Any:
    if not ban:
        return target(*args, **kwargs)
    from transformer_lab.checks._bans import Ban, forbidden

    rule = Ban(
        ops=tuple(ban.get("ops", ())),
        functions=tuple(ban.get("functions", ())),
        reason=str(ban.get("reason", "")),
    )
    with forbidden(rule):
        return target(*args, **kwargs)


def _run(request: dict[str, Any]) -> Any:
    op = request.get("op")
    if op == "lookup":
        name = request.get("name")
        namespace = _namespace()
        if not isinstance(name, str) or name not in namespace:
            raise NameError(f"name {name!r} is not defined")
        return namespace[name]
    target = _object({"$handle": request.get("target")})
    if op == "call":
        args = wire.decode(request.get("args", []), _object)
        kwargs = wire.decode(request.get("kwargs", {"$dict": []}), _object)
        return _call(target, list(args), dict(kwargs), request.get("ban"))
    if op == "getattr":
        return getattr(target, str(request.get("name")))
    if op == "iter":
        return list(target)
    raise wire.WireError(f"unknown request {op!r}")


def _error(exc: BaseException) -> dict[str, Any]:
    return {
        "ok": False,
        "type": type(exc).__name__,
        "bases": [cls.__name__ for cls in type(exc).__mro__],
        "message": str(exc)[:2000],
    }


def serve(text: str) -> None:
    """Answer one request (its reply is read with :func:`reply`)."""
    global _last
    try:
        value = _run(wire.loads(text))
        _last = wire.dumps({"ok": True, "value": wire.encode(value, keep=_keep)})
    except BaseException as exc:  # a reply in every case: the judge decides what it means
        try:
            _last = wire.dumps(_error(exc))
        except Exception:
            _last = wire.dumps({"ok": False, "type": "Exception", "bases": [], "message": ""})


def reply() -> str:
    """The reply to the last request."""
    return _last
