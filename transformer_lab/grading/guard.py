"""The grading kernel's guard: runs before any student code and records, tamper-evidently, what ran.

A submission's checks run in the student's own kernel, so in principle the student's code can fool
them (replace a check, patch ``torch.allclose``, swallow exceptions). The grader cannot prevent
everything inside one Python process; it makes tampering hard and visible. Started as the
kernel's entry point (``python -m transformer_lab.grading.guard -f CONNECTION_FILE``), this
module, before IPython runs a single cell:

1. reads its configuration (a file the grader wrote: a secret key, the log's path, the lab, the
   hashes of the notebook's locked cells and of the closing cell's nonce) and deletes it;
2. imports the lab's visible and hidden checks and wraps every public check function, so that
   each call is reported (``begin``, then ``pass`` or ``fail`` with the message);
3. takes a snapshot of what the checks rely on: the check modules and their functions (code,
   defaults), ``transformer_lab.checks._common``, ``transformer_lab.judge.bans``, ``builtins``,
   ``math`` and ``torch``'s namespaces, and their ``sys.modules`` entries;
4. installs a Python audit hook (:func:`sys.addaudithook`: it cannot be removed) that holds the
   key and the snapshot, and that no Python object refers to afterwards.

The hook writes one JSON record per line to the log, each with a sequence number and a keyed
BLAKE2 MAC. It records which locked cell is running (from IPython's ``compile`` of the cell),
every check call (only a call from the genuine wrapper, with the genuine check in it, counts),
every difference from the snapshot (checked when a check starts and ends, after each call of a
student's function, and at the end), and what student code attempted: reading outside the
workspace, writing files, ``sqlite3``, subprocesses, sockets, ``ctypes``, ``gc`` and frame
introspection, tracing, replacing code objects or patching torch's or the kit's classes. The
dangerous ones are refused outright (``PermissionError``). The grader then compares the
notebook's scores with the log; a missing record, a bad MAC, a gap in the sequence or a missing
closing record flags the submission.

Reference: PEP 578 (Python runtime audit hooks), https://docs.python.org/3/library/audit_events.html
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import types
from typing import Any

__all__ = ["install", "main"]

CONFIG_ENV = "TRANSFORMER_LAB_GUARD"
CHECK_EVENT = "transformer_lab.check"
STUDENT_CALL_EVENT = "transformer_lab.student_call"
FINISH_EVENT = "transformer_lab.finish"


# nbgrader puts a deleted test cell back with this notice in front of its source.
_RESTORED = re.compile(
    r"^(# )?This cell \(id:[^)]*\) was missing from the submission\. It was added back by "
    r"nbgrader\.\s*"
)


def cell_digest(text: str) -> str:
    """The digest by which the guard recognises a locked cell (restored cells included)."""
    return hashlib.sha256(_RESTORED.sub("", text.strip()).strip().encode("utf-8")).hexdigest()


def _cell_file(filename: str) -> bool:
    """True for the file names IPython gives notebook cells."""
    return "ipykernel_" in filename or filename.startswith("<ipython-input-")


def install(config: dict[str, Any]) -> None:
    """Install the guard described by ``config`` (see the module docstring).

    Everything the hook needs is captured in this function's closure; once it returns, only
    the interpreter's list of audit hooks refers to the hook, so student code cannot reach the
    key or the snapshot without the introspection the hook itself refuses.
    """
    import builtins
    import importlib
    import math

    import torch
    import torch.nn.functional

    key = bytes.fromhex(config["key"])
    log_fd = os.open(config["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    trusted_cells: dict[str, str] = dict(config.get("trusted_cells", {}))  # digest -> grade id
    finish_digest = config.get("finish")
    workspace = os.path.realpath(config["workspace"])
    hidden_root = os.path.realpath(config.get("hidden_root", "/nonexistent"))
    read_roots = tuple(os.path.realpath(p) for p in config.get("read_roots", []))
    write_roots = (workspace, *(os.path.realpath(p) for p in config.get("write_roots", [])))
    lab = config["lab"]

    # Capture what the hook calls, so that patching a module later cannot reach into it.
    blake2b, dumps, write = hashlib.blake2b, json.dumps, os.write
    sha256, unrestore, cell_file = hashlib.sha256, _RESTORED.sub, _cell_file
    fsdecode, sep, path_like = os.fsdecode, os.sep, os.PathLike
    o_write = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND
    events = (CHECK_EVENT, STUDENT_CALL_EVENT, FINISH_EVENT)

    def digest(text: str) -> str:  # cell_digest, from captured parts only
        return sha256(unrestore("", text.strip()).strip().encode("utf-8")).hexdigest()

    getframe, realpath, isinstance_, id_ = sys._getframe, os.path.realpath, isinstance, id
    function_type = types.FunctionType
    modules = sys.modules
    sys_dict = vars(sys)

    # 1. The checks, imported now and wrapped.
    names = [f"transformer_lab.checks.lab{lab}", f"transformer_lab.grading.hidden.lab{lab}"]
    check_modules = [importlib.import_module(n) for n in names if importlib.util.find_spec(n)]
    # The shared code the checks run on (``checks._common``, ``checks._generated``, the shared
    # judges, ``hidden._attention``...): every such module the lab's checks imported, and bans.
    shared = ("transformer_lab.checks._", "transformer_lab.grading.hidden._")
    support = ["transformer_lab.judge.bans", *sorted(n for n in modules if n.startswith(shared))]
    support_modules = [importlib.import_module(n) for n in support]
    genuine: dict[str, Any] = {}  # "module.name" -> the genuine check function
    audit = sys.audit

    def make_wrapper(label: str, check: Any) -> Any:
        def check_wrapper(*args: Any, **kwargs: Any) -> Any:
            seed = kwargs.get("seed")
            audit(CHECK_EVENT, "begin", label, repr(seed))
            try:
                result = check(*args, **kwargs)
            except BaseException as exc:
                message = str(exc).strip().split("\n")[0][:500]
                audit(CHECK_EVENT, "fail", label, repr(seed), f"{type(exc).__name__}: {message}")
                raise
            audit(CHECK_EVENT, "pass", label, repr(seed))
            return result

        check_wrapper.__name__ = check_wrapper.__qualname__ = check.__name__
        check_wrapper.__doc__ = check.__doc__
        check_wrapper.__wrapped__ = check
        return check_wrapper

    wrapper_code = make_wrapper("x", len).__code__
    from transformer_lab.judge import bans as _bans

    # The one place that may set a profile hook: a check's ban (the judge's kernel side runs
    # the student's call under it); its hook is the ban's own, never the student's.
    ban_code = _bans._enforced.__wrapped__.__code__
    for module in check_modules:
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name, None)
            if isinstance(obj, function_type) and name.startswith(("check_", "hidden_check_")):
                label = f"{module.__name__.rpartition('.')[2]}.{name}"
                genuine[label] = obj
                setattr(module, name, make_wrapper(label, obj))

    # 2. The snapshot.
    protected_modules = [
        *check_modules,
        *support_modules,
        builtins,
        math,
        torch,
        torch.nn.functional,
        torch.nn,
        importlib.import_module("transformer_lab.lab"),
    ]

    # IPython sets these builtins itself when the kernel starts (after this snapshot).
    kernel_builtins = {
        "_",
        "__",
        "___",
        "input",
        "display",
        "get_ipython",
        "exit",
        "quit",
        "__IPYTHON__",
        "help",
        "copyright",
        "credits",
        "license",
    }

    def take_snapshot() -> dict[str, Any]:
        snap: dict[str, Any] = {}
        for module in protected_modules:
            contents = dict(vars(module))
            if module is builtins:
                contents = {k: v for k, v in contents.items() if k not in kernel_builtins}
            snap.setdefault("modules", {})[module.__name__] = (module, contents)
        funcs: dict[int, tuple[Any, Any, Any, Any]] = {}
        for module in (*check_modules, *support_modules):
            for value in vars(module).values():
                if isinstance_(value, function_type):
                    funcs[id_(value)] = (
                        value,
                        value.__code__,
                        value.__defaults__,
                        dict(value.__kwdefaults__ or {}),
                    )
        for check in genuine.values():
            funcs[id_(check)] = (
                check,
                check.__code__,
                check.__defaults__,
                dict(check.__kwdefaults__ or {}),
            )
        snap["functions"] = funcs
        snap["sys.modules"] = {m.__name__: m for m in protected_modules}
        snap["sys.modules dict"] = modules
        return snap

    snapshot = take_snapshot()
    # What PyTorch itself wraps later (importing torch._dynamo, which any optimizer does, wraps
    # torch.manual_seed): accepted only as a wrapper of the original.
    library_wraps = {("torch", "manual_seed"), ("torch", "compile")}

    def differences() -> list[str]:
        found: list[str] = []
        if sys_dict.get("modules") is not snapshot["sys.modules dict"]:
            found.append("sys.modules was replaced")
        for name, module in snapshot["sys.modules"].items():
            if modules.get(name) is not module:
                found.append(f"sys.modules[{name!r}] was replaced")
        for name, (module, contents) in snapshot["modules"].items():
            now = vars(module)
            for attr, value in contents.items():
                current = now.get(attr, contents)
                if (name, attr) in library_wraps and getattr(current, "__wrapped__", 0) is value:
                    continue
                if current is not value:
                    found.append(f"{name}.{attr} was replaced")
                    if len(found) > 5:
                        return found
        for func, code, defaults, kwdefaults in snapshot["functions"].values():
            if (
                func.__code__ is not code
                or func.__defaults__ is not defaults
                or dict(func.__kwdefaults__ or {}) != kwdefaults
            ):
                found.append(f"the code or defaults of {func.__module__}.{func.__name__} changed")
        return found

    # 3. The log.
    state = {"seq": 0, "busy": False, "cell": "", "student_files": set(), "trusted_files": set()}

    def record(event: str, **fields: Any) -> None:
        state["seq"] += 1
        body = dumps({"seq": state["seq"], "event": event, **fields}, sort_keys=True)
        mac = blake2b(body.encode(), key=key, digest_size=16).hexdigest()
        try:  # noqa: SIM105 (no contextlib here: the hook uses only what it captured)
            write(log_fd, (body + "\t" + mac + "\n").encode())
        except OSError:
            pass  # a closed or replaced log shows as a gap in the sequence

    def student_frame(frame: Any) -> Any:
        """The innermost notebook-cell frame, if it is student code (not a locked cell).

        Library frames, and code generated with a ``<...>`` file name (importlib's frozen
        modules, dataclasses, ``exec`` of a string), are looked through to the cell that
        called them.
        """
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename in state["trusted_files"]:
                return None
            if filename in state["student_files"] or cell_file(filename):
                return frame
            frame = frame.f_back
        return None

    def within(frame: Any, code: Any, depth: int = 4) -> bool:
        """Whether one of the ``depth`` innermost frames from ``frame`` runs ``code``."""
        for _ in range(depth):
            if frame is None:
                return False
            if frame.f_code is code:
                return True
            frame = frame.f_back
        return False

    def inside(path: str, roots: tuple[str, ...]) -> bool:
        return any(path == r or path.startswith(r + sep) for r in roots)

    def verify(where: str) -> None:
        found = differences()
        if found:
            record("tamper", where=where, what=found[:6])

    file_events = frozenset(
        {
            "os.remove",
            "os.rename",
            "os.rmdir",
            "os.chmod",
            "os.chown",
            "os.symlink",
            "os.link",
            "os.truncate",
            "os.mkdir",
            "os.utime",
            "shutil.rmtree",
        }
    )
    refused_everywhere = file_events | frozenset(
        {
            "os.system",
            "os.exec",
            "os.posix_spawn",
            "os.spawn",
            "os.fork",
            "os.forkpty",
            "subprocess.Popen",
            "pty.spawn",
            "sqlite3.connect",
            "sqlite3.connect/handle",
            "socket.connect",
            "socket.bind",
            "socket.getaddrinfo",
            "ctypes.dlopen",
            "ctypes.dlsym",
            "ctypes.addressof",
            "ctypes.cdata",
            "ctypes.call_function",
            "ctypes.string_at",
            "ctypes.wstring_at",
            "gc.get_objects",
            "gc.get_referrers",
            "gc.get_referents",
            "sys._current_frames",
            "sys.settrace",
            "sys.setprofile",
            "sys.addaudithook",
            "sys.monitoring.register_callback",
            "os.kill",
            "os.killpg",
            "signal.pthread_kill",
        }
    )
    noted = frozenset({"sys._getframe", "function.__new__", "code.__new__", "code.replace"})
    watched = (
        refused_everywhere
        | noted
        | {
            "open",
            "import",
            "compile",
            "object.__setattr__",
            "object.__delattr__",
            "object.__getattr__",
            CHECK_EVENT,
            STUDENT_CALL_EVENT,
            FINISH_EVENT,
        }
    )
    protected_prefixes = (
        "torch",
        "transformer_lab",
        "builtins",
        "lightning",
        "IPython",
        "ipykernel",
        "math",
        "numpy",
    )

    def refuse(frame: Any, event: str, detail: str) -> None:
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
        record("violation", what=event, detail=detail[:300], where=where)
        raise PermissionError(f"the grader does not allow this during grading: {event} {detail}")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event not in watched or state["busy"]:
            return
        state["busy"] = True
        try:
            handle(event, args)
        except PermissionError:
            raise  # a refusal: the operation must not happen
        except Exception as exc:  # a bug in the guard must not fail the student's code
            record("guard-error", what=f"{type(exc).__name__}: {exc}"[:300], event=event)
        finally:
            state["busy"] = False

    def handle(event: str, args: tuple[Any, ...]) -> None:
        if event == "compile":
            source, filename = args[0], str(args[1])
            if isinstance_(source, bytes):
                source = source.decode("utf-8", "replace")
            if isinstance_(source, str) and cell_file(filename):
                gid = trusted_cells.get(digest(source))
                if gid is not None:
                    state["trusted_files"].add(filename)
                    state["student_files"].discard(filename)
                    state["cell"] = gid
                    record("cell", grade_id=gid)
                elif filename not in state["trusted_files"]:
                    state["student_files"].add(filename)
                    state["cell"] = ""
                    record("cell", grade_id="", student=True)
            return
        caller = getframe(2)  # hook <- handle: the frame that raised the event
        if event == events[0]:
            frame = caller
            if frame.f_code is not wrapper_code:
                record("forged", what="a check event not raised by the grader's wrapper")
                return
            phase, label = args[0], args[1]
            check = frame.f_locals.get("check")
            if genuine.get(label) is not check:
                record("tamper", where=label, what=["the check inside the wrapper was replaced"])
                return
            if phase == "begin":
                verify(f"before {label}")
            else:
                verify(f"after {label}")
            fields = {"phase": phase, "check": label, "seed": args[2], "cell": state["cell"]}
            if phase == "fail":
                fields["message"] = args[3]
            record("check", **fields)
            return
        if event == events[1]:
            verify("after a call of the student's code")
            return
        if event == events[2]:
            if finish_digest and digest(str(args[0])) == finish_digest:
                verify("at the end")
                record("finish")
            else:
                record("forged", what="a closing record with the wrong nonce")
            return
        if event == "sys.setprofile" and within(caller, ban_code):
            return
        student = student_frame(caller)
        if student is None:
            return
        if event in refused_everywhere:
            if event in file_events and args and isinstance_(args[0], str | bytes | path_like):
                path = realpath(fsdecode(args[0]))
                if inside(path, write_roots):
                    return
            refuse(student, event, repr(args[:1]))
        elif event == "open":
            path, mode = args[0], args[1] if len(args) > 1 else "r"
            if not isinstance_(path, str | bytes | path_like):
                return  # a file descriptor
            path = realpath(fsdecode(path))
            writing = isinstance_(mode, str) and any(c in mode for c in "wax+")
            if isinstance_(mode, int):
                writing = bool(mode & o_write)
            if inside(path, (hidden_root,)) or (writing and not inside(path, write_roots)):
                refuse(student, "open", path)
            if not writing and not inside(path, write_roots + read_roots):
                refuse(student, "open", path)
        elif event == "import":
            name = str(args[0])
            if name.startswith("transformer_lab.grading") or name in ("ctypes", "_ctypes"):
                refuse(student, "import", name)
        elif event in ("object.__setattr__", "object.__delattr__"):
            target, attr = args[0], str(args[1])
            owner = getattr(target, "__module__", "") or ""
            what = f"{attr} of {getattr(target, '__qualname__', target)!r}"
            if attr in ("__code__", "__globals__", "__defaults__", "__kwdefaults__", "__closure__"):
                if caller is student:
                    refuse(student, event, what)
                record("note", what=f"a library set {what}")
            if isinstance_(target, type) and str(owner).startswith(protected_prefixes):
                if caller is student:
                    refuse(student, event, f"{owner}.{target.__qualname__}.{attr}")
                # A library setting up its own classes (dataclasses, torch.fx...) on the
                # student's behalf: noted (not the dunders of class creation), not refused.
                if not attr.startswith("__"):
                    record("note", what=f"a library set {owner}.{target.__qualname__}.{attr}")
        elif event == "object.__getattr__":
            attr = str(args[1])
            if attr in ("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "__code__"):
                record("note", what=f"student code read .{attr}", where=student.f_code.co_filename)
        elif event in noted:
            record("note", what=f"student code used {event}", where=student.f_code.co_filename)

    files = {}
    for module in (*check_modules, *support_modules):
        with open(module.__file__, "rb") as source:
            files[module.__name__] = hashlib.sha256(source.read()).hexdigest()
    record(
        "start",
        lab=lab,
        python=sys.version.split()[0],
        torch=torch.__version__,
        checks=sorted(genuine),
        files=files,
    )
    sys.addaudithook(hook)


def main() -> None:
    """Kernel entry point: install the guard from the configuration file, then start IPython."""
    path = os.environ.pop(CONFIG_ENV, "")
    if not path:
        raise SystemExit(f"{CONFIG_ENV} is not set: this kernel is started by the grader only")
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    os.remove(path)
    install(config)
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
