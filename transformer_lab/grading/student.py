"""The package students install: the kit without the answers of the labs that are still open.

The repository is the instructor's: it holds ``solutions/``, the hidden checks and the kit's own
implementation of every graded function. Students get a **student package**, a wheel built from
the same source by :func:`build_student_wheel`:

* ``transformer_lab/grading/`` (the instructor's pipeline, the hidden checks and their oracles) is
  left out;
* every function or class decorated ``@graded(lab)`` (:mod:`transformer_lab.graded`) whose lab
  is **locked** keeps its signature and docstring, and its body becomes
  ``raise LockedAnswerError(...)``, which names the lab and tells the student to use their own;
* everything else is copied as it is.

A lab is locked until its deadline (``c.TransformerLab.deadlines`` in ``nbgrader_config.py``)
has passed, so rebuilding after a deadline gives later labs the kit's working version of the
earlier answers. The grader builds the same kind of tree (:func:`build_package_tree`) with the
graded lab and every later one locked, plus the hidden checks, as the only ``transformer_lab``
the sandboxed kernel can import: a submission cannot call the kit's answer while it is graded.

The wheel is written directly (PEP 427: a zip with ``*.dist-info/METADATA``, ``WHEEL``,
``RECORD``) with fixed timestamps, so the same source and locks give the same bytes.
"""

from __future__ import annotations

import ast
import base64
import datetime as dt
import hashlib
import io
import re
import shutil
import sys
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from transformer_lab.grading.course import GradingError, list_labs
from transformer_lab.pysource import parse_python

__all__ = [
    "StudentBuild",
    "build_package_tree",
    "build_student_wheel",
    "build_version",
    "graded_definitions",
    "lock_source",
    "locked_labs",
]

PACKAGE = "transformer_lab"
#: Left out of the student package (relative to the package folder).
INSTRUCTOR_ONLY = ("grading",)
#: Kept from ``grading/`` in the grader's own tree (the sandboxed kernel imports these).
GRADER_PARTS = ("grading/__init__.py", "grading/hidden", "grading/guard.py")
_ZIP_TIME = (2020, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class GradedDefinition:
    """One ``@graded(lab)`` function or class found in the package source."""

    module: str  # dotted module name
    qualname: str  # e.g. "softmax" or "MultiHeadAttention"
    lab: str
    path: Path  # source file
    body_lines: tuple[str, ...]  # the stripped source lines of its body (what locking removes)


def _graded_lab(node: ast.AST) -> str | None:
    """The lab of a ``@graded("NN_name")`` decorator on ``node``, if it has one."""
    for deco in getattr(node, "decorator_list", []):
        if (
            isinstance(deco, ast.Call)
            and getattr(deco.func, "id", getattr(deco.func, "attr", None)) == "graded"
            and deco.args
            and isinstance(deco.args[0], ast.Constant)
            and isinstance(deco.args[0].value, str)
        ):
            return deco.args[0].value
    return None


def _walk_definitions(tree: ast.AST, prefix: str = "") -> Iterable[tuple[str, ast.AST]]:
    """``(qualname, node)`` for every function and class, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            qualname = f"{prefix}{node.name}"
            yield qualname, node
            yield from _walk_definitions(node, f"{qualname}.")


def _body_start(node: ast.AST) -> int:
    """Index in ``node.body`` of the first statement after the docstring."""
    body = node.body
    has_doc = (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    return 1 if has_doc else 0


def _first_body_line(node: ast.AST, start: int) -> int:
    """0-based index of the first source line that locking replaces (after the docstring).

    Comments between the docstring and the first statement belong to the body too; without a
    docstring the body starts at its first statement (or that statement's decorators).
    """
    if start == 1:
        return node.body[0].end_lineno
    first = node.body[0]
    return min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", []))]) - 1


def lock_source(source: str, locked: set[str], module: str) -> tuple[str, list[str]]:
    """Replace the bodies of ``@graded`` definitions of ``locked`` labs in ``source``.

    Args:
        source: a module's source code.
        locked: lab names whose answers are removed.
        module: the module's dotted name (for the messages).

    Returns:
        ``(new source, qualnames that were locked)``.
    """
    tree = parse_python(source)
    lines = source.splitlines(keepends=True)
    cuts: list[tuple[int, int, str]] = []  # (first line index, end line index, replacement)
    done: list[str] = []
    for qualname, node in _walk_definitions(tree):
        lab = _graded_lab(node)
        if lab is None or lab not in locked:
            continue
        if any(a <= node.lineno - 1 < b for a, b, _ in cuts):
            continue  # inside a definition that is already cut
        start = _body_start(node)
        indent = " " * (node.body[0].col_offset)
        message = (
            f"{qualname} is the answer to lab {lab}, which is still open: the student package "
            "leaves it out until the lab's deadline. Use your own version from that lab."
        )
        if isinstance(node, ast.ClassDef):
            stub = (
                f"{indent}def __init__(self, *args, **kwargs):\n"
                f"{indent}    raise LockedAnswerError({message!r})\n"
            )
        else:
            stub = f"{indent}raise LockedAnswerError({message!r})\n"
        first = _first_body_line(node, start)
        cuts.append((first, node.end_lineno, stub))
        done.append(qualname)
    for first, end, stub in sorted(cuts, reverse=True):
        lines[first:end] = [stub]
    new = "".join(lines)
    if done and "LockedAnswerError" not in _imported_names(tree):
        new = _add_import(new, "from transformer_lab.graded import LockedAnswerError\n")
    parse_python(new, filename=module)  # the result must still be valid Python
    return new, done


def _imported_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom | ast.Import):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def _add_import(source: str, line: str) -> str:
    """Insert ``line`` after the module's ``from __future__`` import (or its docstring)."""
    tree = parse_python(source)
    after = 0
    for node in tree.body:
        if (isinstance(node, ast.ImportFrom) and node.module == "__future__") or (
            after == 0
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            after = node.end_lineno
    lines = source.splitlines(keepends=True)
    lines.insert(after, line)
    return "".join(lines)


def graded_definitions(package_dir: Path) -> list[GradedDefinition]:
    """Every ``@graded`` definition in the package's source, with the lines locking removes."""
    found: list[GradedDefinition] = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir.parent)
        module = ".".join(rel.with_suffix("").parts)
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for qualname, node in _walk_definitions(parse_python(source)):
            lab = _graded_lab(node)
            if lab is None:
                continue
            first = _first_body_line(node, _body_start(node))
            body = tuple(line.strip() for line in lines[first : node.end_lineno])
            found.append(GradedDefinition(module, qualname, lab, path, body))
    return found


def _parse_deadline(lab: str, value: object) -> dt.datetime:
    if isinstance(value, dt.datetime):
        moment = value
    elif isinstance(value, dt.date):
        moment = dt.datetime.combine(value, dt.time(23, 59, 59))
    else:
        try:
            moment = dt.datetime.fromisoformat(str(value))
        except ValueError as exc:
            raise GradingError(
                f"c.TransformerLab.deadlines[{lab!r}] = {value!r} is not a date such as "
                "'2026-10-02' or '2026-10-02T23:59'"
            ) from exc
        if len(str(value)) <= 10:  # a date alone: the end of that day
            moment = moment.replace(hour=23, minute=59, second=59)
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)


def locked_labs(
    labs: Iterable[str],
    deadlines: Mapping[str, object],
    now: dt.datetime | None = None,
    unlocked: Iterable[str] = (),
) -> list[str]:
    """The labs whose answers the student package must not hold yet.

    Args:
        labs: every lab of the course.
        deadlines: lab -> deadline (ISO date or datetime; a bare date means the end of that day,
            UTC unless a zone is given). A lab without a deadline stays locked.
        now: the moment to decide for (default: now).
        unlocked: labs to unlock regardless (the instructor's decision).

    Raises:
        GradingError: a deadline that is not a date, or one for an unknown lab.
    """
    labs = list(labs)
    unknown = sorted(set(deadlines) - set(labs))
    if unknown:
        raise GradingError(f"c.TransformerLab.deadlines names unknown labs {unknown}; labs: {labs}")
    now = now or dt.datetime.now(dt.timezone.utc)
    free = set(unlocked)
    locked = []
    for lab in labs:
        if lab in free:
            continue
        if lab in deadlines and _parse_deadline(lab, deadlines[lab]) <= now:
            continue
        locked.append(lab)
    return locked


def build_package_tree(
    repo: Path, out_dir: Path, locked: Iterable[str], *, grader: bool = False
) -> list[str]:
    """Write the package of ``repo`` into ``out_dir/transformer_lab`` with ``locked`` labs removed.

    Args:
        repo: repository root (holds ``transformer_lab/``).
        out_dir: folder that receives ``transformer_lab/`` (replaced if present).
        locked: labs whose ``@graded`` bodies are replaced.
        grader: also keep the hidden checks and the kernel guard (the grader's own tree).

    Returns:
        The qualified names that were locked.
    """
    locked = set(locked)
    source_dir = repo / PACKAGE
    target = out_dir / PACKAGE
    if target.exists():
        shutil.rmtree(target)
    done: list[str] = []
    for path in sorted(source_dir.rglob("*")):
        rel = path.relative_to(source_dir)
        if "__pycache__" in rel.parts or path.is_dir():
            continue
        rel_posix = rel.as_posix()
        if rel.parts[0] in INSTRUCTOR_ONLY and not (
            grader and any(rel_posix == p or rel_posix.startswith(p + "/") for p in GRADER_PARTS)
        ):
            continue
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".py":
            module = ".".join((PACKAGE, *rel.with_suffix("").parts))
            text, names = lock_source(path.read_text(encoding="utf-8"), locked, module)
            dest.write_text(text, encoding="utf-8")
            done += [f"{module}.{n}" for n in names]
        else:
            shutil.copyfile(path, dest)
    return done


def _project_metadata(repo: Path) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


@dataclass(frozen=True)
class StudentBuild:
    """What :func:`build_student_wheel` produced."""

    wheel: Path
    locked_labs: tuple[str, ...]
    locked_names: tuple[str, ...]


def build_version(base: str, moment: dt.datetime | None = None) -> str:
    """The version of one build of the student package: ``<base>.post<UTC YYYYMMDDHHMMSS>``.

    A PEP 440 post-release ordered by time, so each republished wheel is newer than the last to
    pip (which reinstalls only over a different version) and to the notebooks' setup cells.
    """
    moment = (moment or dt.datetime.now(dt.timezone.utc)).astimezone(dt.timezone.utc)
    return f"{base}.post{moment:%Y%m%d%H%M%S}"


def build_student_wheel(
    repo: Path, out_dir: Path, locked: Iterable[str], *, version: str | None = None
) -> StudentBuild:
    """Build the student wheel ``transformer_lab-<version>-py3-none-any.whl`` into ``out_dir``.

    Args:
        repo: repository root.
        out_dir: where the wheel goes (created; an older wheel of the same name is replaced).
        locked: labs whose answers are left out.
        version: the wheel's version (also written into ``transformer_lab.__version__``);
            default the package's own, so the same source and locks give the same bytes.

    Returns:
        A :class:`StudentBuild`.
    """
    locked = sorted(set(locked))
    unknown = sorted(set(locked) - set(list_labs(repo)))
    if unknown:
        raise GradingError(f"cannot lock unknown labs {unknown}; labs: {list_labs(repo)}")
    project = _project_metadata(repo)
    own = re.search(
        r'^__version__ = "([^"]+)"', (repo / PACKAGE / "__init__.py").read_text(), re.M
    ).group(1)
    version = version or own
    name = project["name"]
    dist = f"{name.replace('-', '_')}-{version}"
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel_path = out_dir / f"{dist}-py3-none-any.whl"
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tlab-student-") as tmp:
        names = build_package_tree(repo, Path(tmp), locked)
        init = Path(tmp) / PACKAGE / "__init__.py"
        init.write_text(init.read_text().replace(f'"{own}"', f'"{version}"', 1))
        files: list[tuple[str, bytes]] = []
        for path in sorted(Path(tmp).rglob("*")):
            if path.is_file():
                files.append((path.relative_to(tmp).as_posix(), path.read_bytes()))
    meta = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        f"Summary: {project.get('description', '')} (student package)",
        f"Requires-Python: {project.get('requires-python', '>=3.10')}",
    ]
    meta += [f"Requires-Dist: {dep}" for dep in project.get("dependencies", [])]
    info = f"{dist}.dist-info"
    files.append((f"{info}/METADATA", ("\n".join(meta) + "\n").encode()))
    wheel_meta = "Wheel-Version: 1.0\nGenerator: transformer-lab\nRoot-Is-Purelib: true\n"
    files.append((f"{info}/WHEEL", (wheel_meta + "Tag: py3-none-any\n").encode()))
    scripts = project.get("scripts", {})
    if scripts:
        entry = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
        files.append((f"{info}/entry_points.txt", entry.encode()))
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in files)
    files.append((f"{info}/RECORD", (record + f"{info}/RECORD,,\n").encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files:
            item = zipfile.ZipInfo(path, date_time=_ZIP_TIME)
            item.compress_type = zipfile.ZIP_DEFLATED
            item.external_attr = 0o644 << 16
            zf.writestr(item, data)
    wheel_path.write_bytes(buffer.getvalue())
    return StudentBuild(wheel_path, tuple(locked), tuple(names))
