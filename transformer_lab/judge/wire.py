"""The judge's wire format: values as JSON, tensors as safetensors, nothing that carries code.

Both directions use one encoding. A request or reply is a JSON object; inside it

* ``None``, booleans, integers, floats (NaN and infinities included) and strings are themselves;
* a list is a list; ``{"$tuple": [...]}``, ``{"$dict": [[key, value], ...]}``;
* ``{"$tensor": "<base64 safetensors>"}`` is one tensor (any dtype safetensors knows), read back
  as an exact :class:`torch.Tensor`: the format cannot hold a subclass, a ``__torch_function__``
  or a pickle, so a reply cannot bring code into the grader;
* ``{"$dtype": "float32"}``, ``{"$device": "cpu"}``, ``{"$size": [2, 3]}``,
  ``{"$generator": <state tensor>}`` (a CPU ``torch.Generator`` in that state);
* ``{"$handle": n, "type": "ClassName", "callable": true}`` is an object that stays in the
  kernel (a student's function, class or module); the grader can only send it back in a request.

:func:`decode` refuses anything else, oversized texts and nesting deeper than :data:`MAX_DEPTH`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["MAX_BYTES", "MAX_DEPTH", "WireError", "decode", "dumps", "encode", "loads"]

#: Largest request or reply text accepted (the labs' tensors are kilobytes).
MAX_BYTES = 256 * 2**20
#: Deepest nesting of lists, tuples and dicts accepted.
MAX_DEPTH = 32


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


def encode(value: Any, keep: Callable[[Any], dict[str, Any]] | None = None, depth: int = 0) -> Any:
    """``value`` as wire data.

    Args:
        value: what to send.
        keep: how to send an object that is not data (the kernel keeps it and returns a
            ``{"$handle": ...}``); None refuses such objects.
        depth: nesting level (internal).

    Raises:
        WireError: an object that is not data and ``keep`` is None, or nesting too deep.
    """
    if depth > MAX_DEPTH:
        raise WireError(f"nesting deeper than {MAX_DEPTH}")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Tensor):
        return {"$tensor": _tensor_bytes(value)}
    if isinstance(value, torch.dtype):
        return {"$dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"$device": str(value)}
    if isinstance(value, torch.Size):
        return {"$size": list(value)}
    if isinstance(value, torch.Generator):
        return {"$generator": _tensor_bytes(value.get_state())}
    handle = getattr(value, "__judge_handle__", None)
    if isinstance(handle, int) and keep is None:
        return {"$handle": handle}
    if isinstance(value, list):
        return [encode(v, keep, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {"$tuple": [encode(v, keep, depth + 1) for v in value]}
    if isinstance(value, dict):
        return {
            "$dict": [
                [encode(k, keep, depth + 1), encode(v, keep, depth + 1)] for k, v in value.items()
            ]
        }
    if keep is not None:
        return keep(value)
    raise WireError(f"a {type(value).__name__} cannot be sent to the kernel as data")


def decode(data: Any, handle: Callable[[dict[str, Any]], Any], depth: int = 0) -> Any:
    """Wire data back into a value; ``handle`` turns a ``{"$handle": ...}`` into an object.

    Raises:
        WireError: anything the format does not define (an unknown ``$`` key, a bad tensor,
            an unhashable dict key, nesting too deep).
    """
    if depth > MAX_DEPTH:
        raise WireError(f"nesting deeper than {MAX_DEPTH}")
    if data is None or isinstance(data, bool | int | float | str):
        return data
    if isinstance(data, list):
        return [decode(v, handle, depth + 1) for v in data]
    if not isinstance(data, dict) or len(data) == 0:
        raise WireError(f"not a wire value: {type(data).__name__}")
    if "$handle" in data:
        if not isinstance(data["$handle"], int) or isinstance(data["$handle"], bool):
            raise WireError("a $handle must be an integer")
        return handle(data)
    if len(data) != 1:
        raise WireError(f"not a wire value: keys {sorted(data)[:4]}")
    ((kind, body),) = data.items()
    if kind == "$tensor":
        return _tensor_from(body)
    if kind == "$tuple" and isinstance(body, list):
        return tuple(decode(v, handle, depth + 1) for v in body)
    if kind == "$dict" and isinstance(body, list):
        out = {}
        for pair in body:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise WireError("a $dict holds [key, value] pairs")
            key = decode(pair[0], handle, depth + 1)
            try:
                out[key] = decode(pair[1], handle, depth + 1)
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


def dumps(message: dict[str, Any]) -> str:
    """A request or reply as text."""
    return json.dumps(message, allow_nan=True, separators=(",", ":"))


def loads(text: Any) -> dict[str, Any]:
    """A request or reply from text, refusing oversized or malformed ones.

    Raises:
        WireError: not a string, larger than :data:`MAX_BYTES`, not JSON, or not an object.
    """
    if not isinstance(text, str):
        raise WireError(f"a message must be text, got {type(text).__name__}")
    if len(text) > MAX_BYTES:
        raise WireError(f"a message of {len(text)} characters is larger than {MAX_BYTES}")
    try:
        message = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not JSON ({type(exc).__name__})") from None
    if not isinstance(message, dict):
        raise WireError("a message must be a JSON object")
    return message
