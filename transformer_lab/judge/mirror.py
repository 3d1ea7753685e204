"""Modules across the judge's boundary: one side holds a module, the other a mirror of it.

A student's ``nn.Module`` stays in the kernel (its forward is the student's code); the judge
holds a *mirror*: the same tree of submodules, real ``nn.Parameter`` s with the same values, and
a forward that asks the kernel. Likewise a check's module handed to the student's code (the
``theirs`` and ``ours`` of ``load_torch_weights``) is mirrored in the kernel, and what the
student's code writes into the mirror's parameters is written back into the check's module.

Both sides use the same three steps: :func:`spec` describes a module as wire data, :func:`build`
makes the mirror (torch's own layers are rebuilt as torch layers, every other module becomes a
``proxy`` whose forward goes to the other side), and :func:`changes` / :func:`apply_changes`
carry what a call did to parameters back (new values, a new Parameter object, memory shared with
another parameter or a slice of it, a plain tensor put in a parameter's place), so identity and
in-place semantics hold on the mirror as on the module. What comes back is checked as data
(:func:`apply_changes`): a reply cannot name what the mirror does not hold.

Two refinements keep a check's own models whole when they pass through the student's code (a
check's tagging model inside the student's ``LightningModule``):

* a check's small model marked :func:`portable` (a class of ``transformer_lab.checks`` whose
  forward is a few lines over its parameters) is rebuilt in the kernel as that class, so the
  student's loss on its output has an autograd graph there, as it would locally;
* a part of a student's module that *is* one of the grader's mirrored modules carries its
  ``origin`` (the grader's handle), and the judge puts its own module there instead of a copy:
  gradients and optimizers then reach the check's own parameters.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from transformer_lab.judge import wire

__all__ = [
    "LAYER_FIELDS",
    "PORTABLE_PREFIX",
    "apply_changes",
    "build",
    "changes",
    "modes",
    "portable",
    "snapshot",
    "spec",
    "sync_into",
]

#: Hyperparameters sent for torch's own layers, which the other side rebuilds as torch layers.
LAYER_FIELDS: dict[str, tuple[str, ...]] = {
    "Linear": ("in_features", "out_features"),
    # nn.MultiheadAttention's own output projection (a Linear under another name)
    "NonDynamicallyQuantizableLinear": ("in_features", "out_features"),
    # the bias, bias_k/bias_v and separate q/k/v weights are told by its parameters' names
    "MultiheadAttention": (
        "embed_dim",
        "num_heads",
        "dropout",
        "batch_first",
        "kdim",
        "vdim",
        "add_zero_attn",
    ),
    "LayerNorm": ("normalized_shape", "eps", "elementwise_affine"),
    "Embedding": ("num_embeddings", "embedding_dim", "padding_idx"),
    "Dropout": ("p",),
    "GELU": ("approximate",),
    "ReLU": (),
    "Tanh": (),
    "Identity": (),
}


#: Settings of torch's own layers that a check may change on a mirror and that go with its
#: modes before each call (a check switches the attention's own dropout off: lab 04).
MUTABLE_FIELDS: dict[str, tuple[str, ...]] = {
    "Dropout": ("p",),
    "MultiheadAttention": ("dropout",),
}


def modes(root: nn.Module) -> list[Any]:
    """Each module's path and training flag, and the :data:`MUTABLE_FIELDS` of torch's own
    layers (``[path, training]`` or ``[path, training, [[field, value], ...]]``)."""
    out: list[Any] = []
    for path, module in root.named_modules():
        name, native = _kind(type(module))
        fields = [[f, getattr(module, f)] for f in MUTABLE_FIELDS.get(name, ())] if native else []
        out.append([path, module.training, fields] if fields else [path, module.training])
    return out


#: Where the classes that :func:`portable` accepts live (the checks' own models).
PORTABLE_PREFIX = "transformer_lab.checks."

_T = TypeVar("_T", bound=type)


def portable(cls: _T) -> _T:
    """Mark a check's model class to be rebuilt as itself on the other side of the judge.

    Only a class of :data:`PORTABLE_PREFIX` qualifies. The other side builds it empty and fills
    in its parameters, buffers and submodules; any other state goes as wire data through the
    class's ``portable_state(self) -> dict`` and ``portable_restore(self, state)``, if it has
    them.
    """
    if not cls.__module__.startswith(PORTABLE_PREFIX):
        raise ValueError(f"{cls.__qualname__} is not a class of {PORTABLE_PREFIX}*")
    cls.judge_portable = True  # type: ignore[attr-defined]
    return cls


def _kind(cls: type) -> tuple[str, bool]:
    """A module class's name on the wire, and whether the other side rebuilds it natively."""
    if cls.__module__.startswith("torch.nn") and cls.__name__ in LAYER_FIELDS:
        return cls.__name__, True
    if cls.__dict__.get("judge_portable") and cls.__module__.startswith(PORTABLE_PREFIX):
        return f"{cls.__module__}:{cls.__qualname__}", True
    return cls.__name__, False


def spec(
    module: nn.Module,
    handle_of: Callable[[Any], int],
    kind: str,
    origin: Callable[[nn.Module], int | None] = lambda sub: None,
) -> dict[str, Any]:
    """``module`` as wire data: ``{kind: handle, "type", "tree", "params", "buffers"}``.

    ``origin`` gives the other side's handle of a part that is a mirror of one of its modules.
    """
    tree = []
    for path, sub in module.named_modules(remove_duplicate=False):  # an alias stays an alias
        name, native = _kind(type(sub))
        fields = {f: getattr(sub, f) for f in LAYER_FIELDS.get(name, ())} if native else {}
        if native and ":" in name and hasattr(sub, "portable_state"):
            fields = sub.portable_state()
        if "normalized_shape" in fields:
            fields["normalized_shape"] = list(fields["normalized_shape"])
        tree.append([path, handle_of(sub), name, native, fields, sub.training, origin(sub)])
    first: dict[int, str] = {}
    params = []
    for name, p in module.named_parameters(remove_duplicate=False):  # tied weights stay tied
        alias = first.setdefault(id(p), name)
        params.append([name, p.detach(), p.requires_grad, None if alias == name else alias])
    buffers = [[n, b.detach()] for n, b in module.named_buffers() if b is not None]
    return {
        kind: handle_of(module),
        "type": type(module).__name__,
        "params": wire.encode(params),
        "buffers": wire.encode(buffers),
        "tree": wire.encode(tree),
    }


def _owner(root: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The submodule holding parameter ``name`` (``"q_proj.weight"``) and its last name."""
    path, _, attr = name.rpartition(".")
    return (root.get_submodule(path) if path else root), attr


def _portable_module(kind: str, state: dict[str, Any]) -> nn.Module | None:
    """An empty module of a :func:`portable` class named ``"module:Qualname"``, or None."""
    module_name, _, qualname = kind.partition(":")
    if not module_name.startswith(PORTABLE_PREFIX) or not qualname.isidentifier():
        return None
    try:
        cls = getattr(importlib.import_module(module_name), qualname)
    except (ImportError, AttributeError):
        return None
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        return None
    if not cls.__dict__.get("judge_portable"):
        return None
    module = cls.__new__(cls)
    nn.Module.__init__(module)  # its parameters, buffers and submodules come from the spec
    if hasattr(module, "portable_restore"):
        module.portable_restore(state)
    return module


def _native_layer(
    kind: str, f: dict[str, Any], path: str, names: set[str], portable_ok: bool = True
) -> nn.Module | None:
    """torch's own layer (or a check's portable model), rebuilt: its forward is the same code,
    whoever holds the mirror."""
    if ":" in kind:
        return _portable_module(kind, f) if portable_ok else None
    prefix = f"{path}." if path else ""
    if kind == "Linear":
        return nn.Linear(f["in_features"], f["out_features"], bias=f"{prefix}bias" in names)
    if kind == "NonDynamicallyQuantizableLinear":
        return nn.modules.linear.NonDynamicallyQuantizableLinear(
            f["in_features"], f["out_features"], bias=f"{prefix}bias" in names
        )
    if kind == "MultiheadAttention":
        return nn.MultiheadAttention(
            f["embed_dim"],
            f["num_heads"],
            dropout=f["dropout"],
            bias=f"{prefix}in_proj_bias" in names or f"{prefix}out_proj.bias" in names,
            add_bias_kv=f"{prefix}bias_k" in names,
            add_zero_attn=f["add_zero_attn"],
            kdim=f["kdim"],
            vdim=f["vdim"],
            batch_first=f["batch_first"],
        )
    if kind == "LayerNorm":
        return nn.LayerNorm(
            f["normalized_shape"], eps=f["eps"], elementwise_affine=f["elementwise_affine"]
        )
    if kind == "Embedding":
        return nn.Embedding(f["num_embeddings"], f["embedding_dim"], padding_idx=f["padding_idx"])
    if kind == "Dropout":
        return nn.Dropout(f["p"])
    if kind == "GELU":
        return nn.GELU(approximate=f["approximate"])
    simple = {"ReLU": nn.ReLU, "Tanh": nn.Tanh, "Identity": nn.Identity}
    return simple[kind]() if kind in simple else None


def build(
    data: dict[str, Any],
    decode: Callable[[Any], Any],
    proxy: Callable[[int, str], nn.Module],
    own: Callable[[int], nn.Module | None] | None = None,
) -> tuple[nn.Module, dict[int, nn.Module]]:
    """A mirror from a :func:`spec`, and each of its modules by the other side's handle.

    Args:
        data: the spec.
        decode: wire data to values (this side's :func:`~transformer_lab.judge.wire.decode`).
        proxy: makes the mirror of a module that is not one of torch's own layers.
        own: this side's module for an ``origin`` handle (its parameters are kept, not
            replaced); None on the side that rebuilds :func:`portable` models (the kernel),
            which has no modules of its own in a spec.
    """
    params = decode(data.get("params", []))
    tree = decode(data.get("tree", []))
    names = {name for name, *_ in params}
    modules: dict[str, nn.Module] = {}
    by_handle: dict[int, nn.Module] = {}  # a module met again (``self.norm2 = self.norm1``)
    kept: set[str] = set()  # paths of this side's own modules
    for path, handle, kind, native, fields, training, *rest in tree:
        origin = rest[0] if rest else None
        module = own(origin) if own is not None and type(origin) is int else None
        if type(handle) is int and handle in by_handle:
            module = by_handle[handle]  # the same mirror under a second name
            if any(modules[k] is module for k in kept):
                kept.add(path)
        elif module is not None:
            kept.add(path)
        else:
            module = _native_layer(kind, fields, path, names, own is None) if native else None
            module = proxy(handle, kind) if module is None else module
            module.train(bool(training))
        if type(handle) is int:
            by_handle.setdefault(handle, module)
        modules[path] = module
    for path in sorted((p for p in modules if p), key=lambda p: p.count(".")):
        parent, _, last = path.rpartition(".")
        if parent not in kept:
            modules[parent].add_module(last, modules[path])
    root = modules[""]

    def inside_kept(name: str) -> bool:
        path = name.rpartition(".")[0]
        return any(path == k or path.startswith(f"{k}.") or k == "" for k in kept)

    with torch.no_grad():
        for name, value, requires_grad, alias in params:
            if inside_kept(name):
                continue
            owner, attr = _owner(root, name)
            if alias is not None:
                alias_owner, alias_attr = _owner(root, alias)
                owner.register_parameter(attr, alias_owner._parameters[alias_attr])
            else:
                owner.register_parameter(attr, nn.Parameter(value, bool(requires_grad)))
        for name, value in decode(data.get("buffers", [])):
            if inside_kept(name):
                continue
            owner, attr = _owner(root, name)
            owner.register_buffer(attr, value)
    return root, {handle: modules[path] for path, handle, *_ in tree}


def snapshot(root: nn.Module) -> dict[str, tuple[nn.Parameter, torch.Tensor]]:
    """Each parameter of ``root`` and a copy of its value, to tell later what a call changed."""
    return {n: (p, p.detach().clone()) for n, p in root.named_parameters()}


def changes(
    root: nn.Module,
    before: dict[str, tuple[nn.Parameter, torch.Tensor]],
    storages: dict[int, tuple[str, torch.Tensor]],
) -> tuple[list[Any], list[str], list[Any]] | None:
    """What a call did to ``root``'s parameters since :func:`snapshot`, as values.

    Returns ``(changed, removed, plain)``, or None when the call changed nothing:

    * each ``changed`` item is ``[name, value, requires_grad, replaced, shares]``:
      ``replaced`` when the module holds a new object under that name; ``shares``, when it now
      uses the memory of another mirrored parameter (``storages``: data pointer -> that
      parameter's name and tensor), is ``[name, offset, size, stride]``: which one, and where
      in it (:func:`_view_in`; a slice of torch's ``in_proj_weight`` is a view into it);
    * ``removed`` names the parameters that are gone;
    * each ``plain`` item is ``[name, value, requires_grad]``: a parameter the module now holds
      as a plain tensor (``del lin.weight; lin.weight = w``), so the other side sees the
      tensor that took its place, not a module without it.
    """
    now = dict(root.named_parameters())
    changed = []
    for name, p in now.items():
        old = before.get(name)
        same_value = old is not None and old[0] is p and torch.equal(old[1], p.detach())
        if not same_value:
            shared = storages.get(p.untyped_storage().data_ptr()) if p.numel() else None
            shares = None if shared is None else [shared[0], *_view_in(p, shared[1])]
            replaced = old is None or old[0] is not p
            changed.append([name, p.detach(), p.requires_grad, replaced, shares])
    removed, plain = [], []
    for name in sorted(set(before) - set(now)):
        value = _plain_tensor(root, name)
        if value is None:
            removed.append(name)
        else:
            plain.append([name, value.detach(), value.requires_grad])
    return (changed, removed, plain) if changed or removed or plain else None


def _view_in(p: torch.Tensor, base: torch.Tensor) -> tuple[int, list[int], list[int]]:
    """Where ``p`` lies in the memory of ``base`` (which it shares): its offset from ``base``'s
    first element, its size and its strides, in elements."""
    return p.storage_offset() - base.storage_offset(), list(p.shape), list(p.stride())


def _plain_tensor(root: nn.Module, name: str) -> torch.Tensor | None:
    """The plain tensor that module ``root`` holds under a parameter's ``name``, if any.

    Read from the owner's own attributes and buffers only: an attribute read that the module
    forwards (a mirror's ``__getattr__``) would ask the other side while the reply is built.
    """
    try:
        owner, attr = _owner(root, name)
    except AttributeError:  # its submodule is gone too
        return None
    value = owner.__dict__.get(attr, owner._buffers.get(attr))
    if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
        return value
    return None


def apply_changes(
    root: nn.Module,
    changed: list[Any],
    removed: list[str],
    plain: list[Any],
    find: Callable[[str], Any],
) -> None:
    """Do to the mirror ``root`` what a call did to the module (see :func:`changes`).

    ``find`` gives the tensor of this side that a ``shares`` name refers to. What the other
    side sent is data to check, not to trust: a name that is not a parameter of the mirror's
    tree, a value that is not a tensor or a view outside the shared tensor raises
    :class:`~transformer_lab.judge.wire.WireError`.
    """
    with torch.no_grad():
        for name, value, requires_grad, replaced, shares in changed:
            owner, attr = _owned(root, name)
            _tensor(value, name)
            current = owner._parameters.get(attr)
            if replaced or current is None or current.shape != value.shape:
                owner.register_parameter(attr, nn.Parameter(value, bool(requires_grad)))
            elif current.dtype != value.dtype:
                current.data = value
            else:
                current.copy_(value)
            param = owner._parameters[attr]
            view = _shared_view(shares, value, find) if shares is not None else None
            if view is not None:
                param.data = view  # the same memory, as on the other side
            if param.requires_grad != bool(requires_grad):
                param.requires_grad_(bool(requires_grad))
        for name in removed:
            owner, attr = _owned(root, name)
            owner._parameters.pop(attr, None)
        for name, value, requires_grad in plain:
            owner, attr = _owned(root, name)
            if not isinstance(owner._parameters.get(attr), nn.Parameter):
                raise wire.WireError(f"{name!r} is not a parameter of the mirror")
            _tensor(value, name)
            del owner._parameters[attr]
            tensor = value.requires_grad_(bool(requires_grad) and value.is_floating_point())
            nn.Module.__setattr__(owner, attr, tensor)  # a plain attribute, as on the other side


def _owned(root: nn.Module, name: Any) -> tuple[nn.Module, str]:
    """:func:`_owner` of a parameter name the other side sent, checked."""
    if not isinstance(name, str) or not name:
        raise wire.WireError(f"a parameter's name must be text, not {type(name).__name__}")
    try:
        return _owner(root, name)
    except AttributeError:
        raise wire.WireError(f"no module of the mirror holds {name!r}") from None


def _tensor(value: Any, name: str) -> None:
    if type(value) is not torch.Tensor:
        raise wire.WireError(f"the value of {name!r} must be a tensor, not {type(value).__name__}")


def _shared_view(
    shares: Any, value: torch.Tensor, find: Callable[[str], Any]
) -> torch.Tensor | None:
    """The view of this side's tensor that ``shares`` (``[name, offset, size, stride]``, see
    :func:`changes`) describes, when it lies inside that tensor's memory and holds exactly
    ``value`` (what the other side's parameter holds); None when it does not, and the mirror
    keeps a copy of the values instead."""
    if not (isinstance(shares, list) and len(shares) == 4 and isinstance(shares[0], str)):
        raise wire.WireError("a shared parameter is [name, offset, size, stride]")
    where, offset, size, stride = shares
    base = find(where)
    shape = [*size, *stride] if isinstance(size, list) and isinstance(stride, list) else []
    if type(offset) is not int or not shape or any(type(n) is not int or n < 0 for n in shape):
        raise wire.WireError(f"not a view: offset {offset!r}, size {size!r}, stride {stride!r}")
    if not isinstance(base, torch.Tensor) or len(size) != len(stride) or not value.numel():
        return None
    start = base.storage_offset() + offset
    last = start + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    elements = base.untyped_storage().nbytes() // base.element_size()
    if base.dtype != value.dtype or start < 0 or last >= elements:
        return None
    view = base.detach().as_strided(size, stride, start)
    return view if wire.same_bits(view, value) else None


def sync_into(root: nn.Module, params: list[Any], modes: list[Any]) -> None:
    """Put a mirror's parameters (``[[name, value], ...]``) and :func:`modes` into the module."""
    own = dict(root.named_parameters())
    with torch.no_grad():
        for name, value in params:
            if name not in own:
                continue
            if own[name].shape == value.shape and own[name].dtype == value.dtype:
                own[name].copy_(value)
            else:
                own[name].data = value.detach().clone()  # .half(), .double(): the same object
    paths = dict(root.named_modules())
    for path, training, *fields in modes:
        module = paths.get(path)
        if module is None:
            continue
        module.training = bool(training)
        allowed = MUTABLE_FIELDS.get(_kind(type(module))[0], ())
        for field, value in fields[0] if fields else []:
            if field in allowed and type(value) is float:
                setattr(module, field, value)
