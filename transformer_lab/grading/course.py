"""Plumbing shared by ``build``, ``check`` and ``grade``: paths, nbgrader config, converters.

Everything here wraps nbgrader's own classes (``CourseDirectory``, the converters
``GenerateAssignment``/``Autograde``/``GenerateFeedback``) and its configuration file
(``nbgrader_config.py`` at the repository root); nothing reimplements them.

nbgrader's gradebook shells out to ``alembic`` (and executes notebooks in a kernel that
inherits this process's environment), so :func:`grading_env` puts the running interpreter's
``bin`` directory first on ``PATH`` and selects the ``grading`` profile while it runs; the
``alembic`` command's answer is asked once per process (:func:`ask_alembic_once`).

Reference: nbgrader 0.9 (https://nbgrader.readthedocs.io), ``nbgrader/converters/*.py``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
from nbformat.warnings import MissingIDFieldWarning
from nbgrader.coursedir import CourseDirectory
from nbgrader.utils import capture_log
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

CONFIG_FILE = "nbgrader_config.py"
#: Seconds one whole submission may run, all cells together: the one default of ``--budget``,
#: ``GradingOptions.budget`` and ``BudgetedExecute.budget``.
BUDGET_S = 300.0
#: The section of ``nbgrader_config.py`` that holds the kit's own course settings.
SETTINGS_SECTION = "TransformerLab"
SOLUTIONS = "solutions"
LABS = "labs"
LAB_PATTERN = re.compile(r"^\d\d_[a-z0-9_]+$")


class GradingError(ValueError):
    """Bad input to the pipeline (unknown lab, missing folder, a source nbgrader rejects).

    The message names the bad value and what to do about it.
    """


def find_repo(start: Path | None = None) -> Path:
    """The repository root: the nearest folder holding ``nbgrader_config.py`` and ``solutions/``.

    Searched from ``start`` (default: the working directory) upwards, then next to the
    installed package (an editable install lives in the repository).

    Raises:
        GradingError: no such folder.
    """
    here = Path(start or Path.cwd()).resolve()
    package_repo = Path(__file__).resolve().parents[2]
    for candidate in [here, *here.parents, package_repo]:
        if (candidate / CONFIG_FILE).is_file() and (candidate / SOLUTIONS).is_dir():
            return candidate
    raise GradingError(
        f"no {CONFIG_FILE} with a {SOLUTIONS}/ folder found from {here} upwards; "
        "run from the repository or pass --repo"
    )


def list_labs(repo: Path) -> list[str]:
    """Names of the labs in ``solutions/`` (folders ``NN_name`` holding ``NN_name.ipynb``)."""
    root = repo / SOLUTIONS
    return sorted(
        p.name
        for p in root.iterdir()
        if p.is_dir() and LAB_PATTERN.match(p.name) and (p / f"{p.name}.ipynb").is_file()
    )


def select_labs(repo: Path, wanted: list[str] | None) -> list[str]:
    """Resolve lab names or prefixes (``01`` or ``01_positional_encoding``) to lab names.

    Raises:
        GradingError: a name matches no lab, or several.
    """
    labs = list_labs(repo)
    if not wanted:
        return labs
    chosen: list[str] = []
    for name in wanted:
        name = name.strip("/").split("/")[-1]
        hits = [lab for lab in labs if lab == name] or [lab for lab in labs if lab.startswith(name)]
        if len(hits) != 1:
            raise GradingError(
                f"lab {name!r} matches {hits or 'nothing'}; available labs: {', '.join(labs)}"
            )
        if hits[0] not in chosen:
            chosen.append(hits[0])
    return chosen


def load_config(repo: Path, **overrides: Any) -> Config:
    """The repository's nbgrader configuration, with ``Section__option=value`` overrides."""
    config = PyFileConfigLoader(CONFIG_FILE, path=str(repo)).load_config()
    for key, value in overrides.items():
        section, option = key.split("__")
        config[section][option] = value
    return config


@dataclass(frozen=True)
class CourseSettings:
    """The kit's course settings (``c.TransformerLab.*`` in ``nbgrader_config.py``).

    Attributes:
        kit_source: what the notebooks' setup cells ``pip install``: the address where the
            course publishes the student package that ``labs build`` writes to ``dist/student/``.
        deadlines: lab -> deadline; the student package holds a lab's answers only after it.
    """

    kit_source: str
    deadlines: dict[str, Any]


def course_settings(repo: Path) -> CourseSettings:
    """Read :class:`CourseSettings` from the repository's ``nbgrader_config.py``."""
    from transformer_lab.grading.standard import DEFAULT_KIT_SOURCE

    section = load_config(repo).get(SETTINGS_SECTION, {})
    kit_source = str(section.get("kit_source", DEFAULT_KIT_SOURCE))
    deadlines = section.get("deadlines", {})
    if not isinstance(deadlines, dict):
        raise GradingError(
            f"c.{SETTINGS_SECTION}.deadlines must be a dict of lab -> date, got {deadlines!r}"
        )
    return CourseSettings(kit_source, dict(deadlines))


def make_coursedir(config: Config, root: Path, **settings: str) -> CourseDirectory:
    """A ``CourseDirectory`` rooted at ``root`` with ``settings`` (e.g. ``source_directory``)."""
    coursedir = CourseDirectory(config=config)
    coursedir.root = str(Path(root).resolve())
    for key, value in settings.items():
        setattr(coursedir, key, value)
    return coursedir


def ask_alembic_once() -> None:
    """Make nbgrader ask the ``alembic`` command for its gradebook schema's revision once in
    this process, not once per gradebook it creates.

    nbgrader's ``Gradebook`` runs ``alembic heads`` (a new Python process importing alembic:
    about 3 s of CPU) each time it creates a gradebook: twice per ``labs grade`` run of a lab
    (the course's and the lab's template). The answer is fixed by the installed nbgrader, so
    the first one is kept (nbgrader's own function, cached).
    """
    import nbgrader.api

    if not hasattr(nbgrader.api.get_alembic_version, "cache_info"):
        nbgrader.api.get_alembic_version = functools.cache(nbgrader.api.get_alembic_version)


#: Gradebook files (resolved paths) that are scratch while a :func:`scratch_gradebook` block runs.
_SCRATCH: set[str] = set()


@contextlib.contextmanager
def scratch_gradebook(path: Path) -> Iterator[None]:
    """Let nbgrader write the gradebook at ``path`` without waiting for the disk in the block.

    A lab's template gradebook and each submission's own copy of it are scratch: made for one
    run, read back by the grader and thrown away (a crash loses nothing a new run does not make
    again). nbgrader commits to them some 40 times a submission, and each commit under SQLite's
    default (``synchronous = FULL``) waits for the disk: milliseconds to tens of milliseconds
    each, seconds a class. Their connections skip that wait (``synchronous = OFF``); the
    course's own gradebook is never scratch, so its writes stay synced.
    """
    _listen_for_scratch_connections()
    name = os.path.realpath(path)
    _SCRATCH.add(name)
    try:
        yield
    finally:
        _SCRATCH.discard(name)


def _listen_for_scratch_connections() -> None:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    if not event.contains(Engine, "connect", _unsynced_if_scratch):
        event.listen(Engine, "connect", _unsynced_if_scratch)


def _unsynced_if_scratch(connection: Any, record: Any) -> None:
    """A new SQLite connection to a scratch gradebook: commits do not wait for the disk."""
    if not _SCRATCH or not hasattr(connection, "execute"):
        return
    try:
        files = [row[2] for row in connection.execute("PRAGMA database_list").fetchall()]
    except Exception:  # not SQLite
        return
    if any(f and os.path.realpath(f) in _SCRATCH for f in files):
        connection.execute("PRAGMA synchronous = OFF")


@contextlib.contextmanager
def grading_env(profile: str = "grading") -> Iterator[None]:
    """Environment for nbgrader runs: venv ``bin`` on ``PATH``, the given profile, Agg backend.

    Kernels started by nbgrader inherit ``os.environ``, so the profile reaches the notebooks.
    When this interpreter's environment has its own ``python3`` kernel spec (``setup.sh``
    installs one), it is put first on ``JUPYTER_PATH`` so that notebooks run with the
    interpreter that has the kit, not with another ``python3`` kernel of the user.
    The previous values are restored afterwards.
    """
    ask_alembic_once()
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    new = {
        "PATH": bin_dir + os.pathsep + path if path.split(os.pathsep)[0] != bin_dir else path,
        "TRANSFORMER_LAB_PROFILE": profile,
        "MPLBACKEND": "Agg",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
    }
    own_share = Path(sys.prefix) / "share" / "jupyter"
    if (own_share / "kernels" / "python3" / "kernel.json").is_file():
        jupyter_path = os.environ.get("JUPYTER_PATH", "")
        new["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(own_share), jupyter_path) if p)
    with environment(**new):
        yield


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set environment variables for the block (kernels started inside inherit them)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_converter(
    converter_cls: type, coursedir: CourseDirectory, config: Config, **attrs: Any
) -> dict[str, Any]:
    """Run an nbgrader converter (``GenerateAssignment``, ``Autograde``...) and capture its log.

    Args:
        converter_cls: the nbgrader converter class.
        coursedir: where it works (its ``assignment_id``/``student_id`` select what).
        config: nbgrader configuration.
        **attrs: attributes set on the converter (``force=True``, ...).

    Returns:
        nbgrader's ``capture_log`` dict: ``success`` (bool), ``log`` and, on failure, ``error``.
    """
    ask_alembic_once()
    converter = converter_cls(coursedir=coursedir, config=config)
    for key, value in attrs.items():
        setattr(converter, key, value)
    return capture_log(converter)


def read_notebook(path: Path) -> nbformat.NotebookNode:
    """Read a notebook as nbformat v4 (raises ``nbformat`` errors on broken JSON).

    Notebooks saved by Colab often lack cell ids; nbformat warns and the repair step assigns
    them, so that warning is silenced here.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MissingIDFieldWarning)
        return nbformat.read(str(path), as_version=4)


def write_notebook(nb: nbformat.NotebookNode, path: Path) -> None:
    """Write ``nb`` deterministically (nbformat's own serialisation, trailing newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = nbformat.writes(nb)
    path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` to ``path`` as indented JSON (a trailing newline), atomically: into a new
    file beside it, flushed to disk, then renamed over it. A killed run or a full disk leaves
    the old record whole (the gradebook's report, a collect record, a journal of what was sent),
    never half of a new one; two runs never write the same temporary file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
