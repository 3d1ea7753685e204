"""The judge's wire format: values as JSON, tensors as safetensors, nothing that carries code.

Both directions use one encoding. A request or reply is a JSON object; inside it

* ``None``, booleans, integers, floats (NaN and infinities included) and strings are themselves;
* a list is a list; ``{"$tuple": [...]}``, ``{"$dict": [[key, value], ...]}``;
* ``{"$tensor": "<base64 safetensors>"}`` is one tensor (any dtype safetensors knows), read back
  as an exact :class:`torch.Tensor`: the format cannot hold a subclass, a ``__torch_function__``
  or a pickle, so a reply cannot bring code into the grader;
* ``{"$dtype": "float32"}``, ``{"$device": "cpu"}``, ``{"$size": [2, 3]}``,
  ``{"$generator": <state tensor>}`` (a CPU ``torch.Generator`` in that state);
* ``{"$handle": n, "type": "ClassName"}`` is an object that stays in the kernel (a student's
  function, class or module), ``{"$grader": n, "type": ...}`` one that stays in the grader (a
  check's model or step function the student's code calls back); each side can only call it,
  read its attributes or send it back;
* ``{"$module": n, "type": ..., "tree": ..., "params": ..., "buffers": ...}`` is a student's
  ``nn.Module``: it stays in the kernel, and the judge mirrors its tree and parameters
  (:mod:`transformer_lab.judge.mirror`); ``{"$gmodule": ...}`` is one of the grader's modules,
  mirrored in the kernel;
* ``{"$param": n, "name": "weight"}`` is the parameter ``weight`` of the module behind handle
  ``n`` of a mirrored tree (an optimizer's parameter groups keep their identity);
* ``{"$tensor": ..., "grad": true}`` is a tensor the receiver differentiates through, and
  ``{"$iter": [...]}`` an iterator over the items (``model.parameters()``).

:func:`decode` refuses anything else, oversized texts and nesting deeper than :data:`MAX_DEPTH`.
:func:`loads` bounds what a text may cost before JSON builds anything of it: at most
:data:`MAX_BYTES` characters and :data:`MAX_ITEMS` values (counted by a scan of the text's
separators, a few passes at C speed), so a reply of nested empty lists (``[[],[],...]``, 3
characters for an object of 56 bytes) is refused, not built.
"""

from __future__ import annotations

import base64
import collections
import json
import types
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_ITEMS",
    "Reference",
    "WireError",
    "count_items",
    "decode",
    "dumps",
    "encode",
    "loads",
    "plain_tensors",
    "result_tensors",
    "same_bits",
]

#: Largest request or reply text accepted (the labs' tensors are kilobytes).
MAX_BYTES = 256 * 2**20
#: Deepest nesting of lists, tuples and dicts accepted.
MAX_DEPTH = 32
#: Most JSON values (keys included) one request or reply may hold: a traced call's operation
#: log of a loop form is the largest honest one (tens of thousands of values).
MAX_ITEMS = 2**20


class WireError(ValueError):
    """A value that the wire format cannot carry, or a text that is not one of its values."""


def _tensor_bytes(t: Tensor) -> str:
    from safetensors.torch import save

    plain = t.detach().to("cpu").contiguous()
    if type(plain) is not Tensor:  # a subclass: keep its data only
        plain = plain.as_subclass(Tensor)
    return base64.b64encode(save({"t": plain})).decode("ascii")


def _tensor_from(text: Any) -> Tensor:
    from safetensors.torch import load

    if not isinstance(text, str):
        raise WireError("a $tensor must be a base64 string")
    try:
        tensors = load(base64.b64decode(text, validate=True))
    except Exception as exc:  # malformed bytes: one kind of error for the caller
        raise WireError(f"not a safetensors tensor ({type(exc).__name__})") from None
    if list(tensors) != ["t"] or type(tensors["t"]) is not Tensor:
        raise WireError("a $tensor must hold exactly one plain tensor")
    return tensors["t"]


class Reference:
    """An object of the other side, seen here (a ``Remote`` in the grader, a grader object's
    stand-in in the kernel): it is sent back as the reference it came as."""

    def wire_reference(self) -> dict[str, Any]:
        raise NotImplementedError


def encode(
    value: Any,
    keep: Callable[[Any], dict[str, Any]] | None = None,
    grads: list[Tensor] | None = None,
    depth: int = 0,
) -> Any:
    """``value`` as wire data.

    Args:
        value: what to send.
        keep: how to send an object that is not data (this side keeps it and sends a
            reference to it); None refuses such objects. It is also asked about each
            ``nn.Parameter``, and returns None for one that goes as data.
        grads: where to list, in order, the tensors sent with ``requires_grad`` (they are
            marked ``"grad": true``, so the other side can differentiate through them).
        depth: nesting level (internal).

    Raises:
        WireError: an object that is not data and ``keep`` is None, or nesting too deep.
    """
    if depth > MAX_DEPTH:
        raise WireError(f"nesting deeper than {MAX_DEPTH}")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic) and isinstance(value.item(), bool | int | float):
        return value.item()  # a NumPy scalar (``np.max(x) > 0``) is the number it holds
    if isinstance(value, Reference):
        return value.wire_reference()
    if isinstance(value, torch.nn.Parameter) and keep is not None:
        ref = keep(value)  # a parameter of a mirrored module: sent as which one it is
        if ref is not None:
            return ref
    if isinstance(value, Tensor):
        data: dict[str, Any] = {"$tensor": _tensor_bytes(value)}
        if value.requires_grad and grads is not None:
            data["grad"] = True
            grads.append(value)
        return data
    if isinstance(value, torch.dtype):
        return {"$dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"$device": str(value)}
    if isinstance(value, torch.Size):
        return {"$size": list(value)}
    if isinstance(value, torch.Generator):
        return {"$generator": _tensor_bytes(value.get_state())}
    # Exactly these containers: a NamedTuple (a KV cache) or a dict subclass is an object.
    if type(value) is list:
        return [encode(v, keep, grads, depth + 1) for v in value]
    if type(value) is tuple:
        return {"$tuple": [encode(v, keep, grads, depth + 1) for v in value]}
    if type(value) in (dict, collections.OrderedDict):
        pairs = [
            [encode(k, keep, grads, depth + 1), encode(v, keep, grads, depth + 1)]
            for k, v in value.items()
        ]
        return {"$dict": pairs}
    if isinstance(value, types.GeneratorType):  # model.parameters(): its items, as an iterator
        return {"$iter": [encode(v, keep, grads, depth + 1) for v in value]}
    if keep is not None:
        return keep(value)
    raise WireError(f"a {type(value).__name__} cannot be sent as data")


def decode(
    data: Any,
    reference: Callable[[dict[str, Any]], Any],
    grads: list[Tensor] | None = None,
    depth: int = 0,
) -> Any:
    """Wire data back into a value.

    Args:
        data: what arrived.
        reference: turns a ``{"$handle": ...}`` or ``{"$grader": ...}`` into an object.
        grads: where to list the tensors that arrived marked ``"grad"`` (they come back
            requiring grad), in the order they were sent.
        depth: nesting level (internal).

    Raises:
        WireError: anything the format does not define (an unknown ``$`` key, a bad tensor,
            an unhashable dict key, nesting too deep).
    """
    if depth > MAX_DEPTH:
        raise WireError(f"nesting deeper than {MAX_DEPTH}")
    if data is None or isinstance(data, bool | int | float | str):
        return data
    if isinstance(data, list):
        return [decode(v, reference, grads, depth + 1) for v in data]
    if not isinstance(data, dict) or len(data) == 0:
        raise WireError(f"not a wire value: {type(data).__name__}")
    for kind in ("$handle", "$grader", "$module", "$gmodule", "$param"):
        if kind in data:
            if type(data[kind]) is not int:
                raise WireError(f"a {kind} must be an integer")
            return reference(data)
    if "$tensor" in data and set(data) <= {"$tensor", "grad"}:
        t = _tensor_from(data["$tensor"])
        if data.get("grad") is True and t.is_floating_point():
            t.requires_grad_(True)
            if grads is not None:
                grads.append(t)
        return t
    if len(data) != 1:
        raise WireError(f"not a wire value: keys {sorted(data)[:4]}")
    ((kind, body),) = data.items()
    if kind in ("$tuple", "$iter") and isinstance(body, list):
        items = [decode(v, reference, grads, depth + 1) for v in body]
        return tuple(items) if kind == "$tuple" else iter(items)
    if kind == "$dict" and isinstance(body, list):
        out = {}
        for pair in body:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise WireError("a $dict holds [key, value] pairs")
            key = decode(pair[0], reference, grads, depth + 1)
            try:
                out[key] = decode(pair[1], reference, grads, depth + 1)
            except TypeError:
                raise WireError(f"an unhashable dict key: {type(key).__name__}") from None
        return out
    if kind == "$dtype" and isinstance(body, str):
        dtype = getattr(torch, body, None)
        if not isinstance(dtype, torch.dtype):
            raise WireError(f"not a dtype: {body!r}")
        return dtype
    if kind == "$device" and isinstance(body, str):
        return torch.device(body)
    if kind == "$size" and isinstance(body, list) and all(type(s) is int for s in body):
        return torch.Size(body)
    if kind == "$generator":
        generator = torch.Generator()
        generator.set_state(_tensor_from(body))
        return generator
    raise WireError(f"not a wire value: {kind!r}")


def plain_tensors(value: Any, depth: int = 0) -> list[Tensor]:
    """The exact ``torch.Tensor`` s inside the lists, tuples and dicts of ``value``, in the
    order :func:`encode` writes them: a call's arguments seen alike on both sides of the wire
    (so a write into an argument, made in the kernel, can be made on the judge's tensor too)."""
    if type(value) is Tensor:
        return [value]
    if depth > MAX_DEPTH:
        return []
    if type(value) in (list, tuple):
        return [t for v in value for t in plain_tensors(v, depth + 1)]
    if type(value) in (dict, collections.OrderedDict):
        return [t for v in value.values() for t in plain_tensors(v, depth + 1)]
    return []


def same_bits(now: Tensor, was: Tensor) -> bool:
    """Whether ``now`` holds ``was`` bit for bit: its shape, dtype and every byte (so a NaN
    left as it was is the same, and ``-0.0`` is not ``0.0``). How both sides of the wire tell
    that a call wrote into one of its argument tensors."""
    if now.shape != was.shape or now.dtype != was.dtype:
        return False
    return not now.numel() or torch.equal(_bits(now), _bits(was))


def _bits(t: Tensor) -> Tensor:
    flat = t.detach().contiguous().reshape(-1)  # (numel,)
    return flat.view(torch.uint8) if flat.dtype != torch.bool else flat


def result_tensors(value: Any) -> tuple[list[Tensor], Callable[[Sequence[Tensor]], Any]]:
    """The tensors a call returned, and how to put new ones (same order) in their places.

    Both sides of a differentiable call read a result alike with it: the value itself when it
    is a tensor, the tensor items of a list or tuple, the tensor values of a dict (Lightning's
    ``{"loss": loss, ...}``). Only the containers :func:`encode` sends as data count, so an
    object that goes by reference (a NamedTuple KV cache) holds no tensors on either side.
    """
    if isinstance(value, Tensor):
        return [value], lambda new: new[0]
    if type(value) in (list, tuple):
        places = [i for i, item in enumerate(value) if isinstance(item, Tensor)]

        def rebuild(new: Sequence[Tensor]) -> Any:
            items = list(value)
            for i, tensor in zip(places, new, strict=True):
                items[i] = tensor
            return type(value)(items)

        return [value[i] for i in places], rebuild
    if type(value) in (dict, collections.OrderedDict):
        keys = [k for k, item in value.items() if isinstance(item, Tensor)]

        def rebuild_dict(new: Sequence[Tensor]) -> Any:
            return type(value)({**value, **dict(zip(keys, new, strict=True))})

        return [value[k] for k in keys], rebuild_dict
    return [], lambda new: value


def dumps(message: dict[str, Any]) -> str:
    """A request or reply as text."""
    return json.dumps(message, allow_nan=True, separators=(",", ":"))


def count_items(text: str) -> int:
    """An upper bound on the JSON values (keys included) in ``text``, before parsing it.

    Every value but the first follows a ``[`` (an array's first item), a ``,`` (a later one),
    a ``{`` (an object's first key) or a ``:`` (a key's value); those characters inside
    strings only make the bound larger. Four ``str.count`` passes: linear, nothing built.
    """
    return 1 + sum(text.count(c) for c in "[{,:")


def loads(text: Any) -> dict[str, Any]:
    """A request or reply from text, refusing oversized or malformed ones.

    Raises:
        WireError: not a string, larger than :data:`MAX_BYTES`, holding more than
            :data:`MAX_ITEMS` values (:func:`count_items`), not JSON, or not an object.
    """
    if not isinstance(text, str):
        raise WireError(f"a message must be text, got {type(text).__name__}")
    if len(text) > MAX_BYTES:
        raise WireError(f"a message of {len(text)} characters is larger than {MAX_BYTES}")
    items = count_items(text)
    if items > MAX_ITEMS:
        raise WireError(f"a message of up to {items} values holds more than {MAX_ITEMS}")
    try:
        message = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(message, dict):
        raise WireError("a message must be a JSON object")
    return message
