"""``transformer-lab labs grade --course DIR``: grade untrusted submissions into the gradebook.

Grading runs untrusted code. The threat model and its answers (``docs/grading.md``):

* a submission can read nothing of the course and write nothing outside its own workspace: its
  kernel runs in a bubblewrap sandbox (:mod:`~transformer_lab.grading.sandbox`) that holds the
  system, the Python environment, the grader's package tree of the lab (the lab and every later
  one locked, so the kit's answer cannot be called) and one writable folder, with no network and
  limits on memory, processes, CPU time and wall time. Without bubblewrap grading refuses;
  ``--unsandboxed`` opts out, loudly, and still contains each submission;
* scores reach the gradebook only through this process: each submission is autograded by
  nbgrader against a throw-away gradebook of its own, and the scores this process validated are
  then written into ``DIR/gradebook.db`` (checked unchanged by anyone else in between);
* every autograded point is the judge's (:mod:`~transformer_lab.grading.judge`): each test
  cell's trusted source runs in this process on the values the kernel returns as data, so
  nothing in the kernel can forge a pass;
* cheats are flagged for review: cheat constructs in the student's code (the static scan of
  :mod:`~transformer_lab.grading.integrity`) and, without the OS sandbox, what the kernel's
  guard (:mod:`~transformer_lab.grading.guard`, a fence around files and processes) refused or
  saw tampered with; a flagged submission's autograded points are withheld (zero) until an
  instructor reviews it.

Layout of ``DIR`` (nbgrader's own, plus the grader's working folder)::

    DIR/submitted/<student>/<lab>/<lab>.ipynb   what the students handed in (never modified)
    DIR/gradebook.db                            nbgrader's gradebook (created once, only updated)
    DIR/release/<lab>/                          the release, regenerated from solutions/
    DIR/autograded/<student>/<lab>/             executed notebooks
    DIR/feedback/<student>/<lab>/<lab>.html     feedback without hidden tests
    DIR/grades.csv                              nbgrader's CSV export plus status and flags
    DIR/grading_report.json                     every run's records (appended, never lost)
    DIR/.grading/                               package views, templates, workspaces

``--jobs N`` grades N submissions at once in separate processes (one CPU thread each);
``--cluster ADDRESS`` on the workers of a Dask cluster (:mod:`~transformer_lab.grading.cluster`),
this process still the only writer; ``--resume`` grades only what a stopped run left
(:mod:`~transformer_lab.grading.journal`). A term can also be split across machines by hand and
the gradebooks merged (:func:`merge_gradebooks`). Each submission's grading runs in a child
process of its own, under an address-space limit (``--grader-memory-gb``) and a deadline (the
budget plus :data:`GRADER_SLACK_S`): a failure there (an exception, memory, time, a kill) is that
submission's ``failed`` record, said in one line on standard error, and the batch goes on
(:mod:`~transformer_lab.grading.isolate`).

Reference: nbgrader's converters (``GenerateAssignment``, ``Autograde``) and gradebook API.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import datetime as dt
import hashlib
import json
import multiprocessing
import re
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nbconvert.preprocessors import ClearMetadataPreprocessor
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.converters import Autograde, GenerateAssignment
from nbgrader.plugins.export import CsvExportPlugin
from nbgrader.preprocessors import (
    AssignLatePenalties,
    CheckCellMetadata,
    IgnorePattern,
    LimitOutput,
    SaveAutoGrades,
)
from sqlalchemy.exc import SAWarning
from traitlets import List

from transformer_lab.grading.cluster import Grader
from transformer_lab.grading.course import (
    BUDGET_S,
    SOLUTIONS,
    GradingError,
    grading_env,
    load_config,
    make_coursedir,
    read_notebook,
    run_converter,
    scratch_gradebook,
    select_labs,
    write_json,
    write_notebook,
)
from transformer_lab.grading.isolate import Bounds, describe, run_bounded
from transformer_lab.grading.journal import Journal, notebook_digest
from transformer_lab.grading.repair import repair_notebook
from transformer_lab.grading.sandbox import (
    DEAD_ENAME,
    NO_SANDBOX,
    TIMEOUT_ENAMES,
    BudgetedExecute,
    find_bwrap,
)

__all__ = [
    "Decision",
    "GradeReport",
    "GradingOptions",
    "SubmissionResult",
    "decide",
    "grade_course",
    "merge_gradebooks",
]

RELEASE_DIR = "release"
SHM_BYTES = 256 * 2**20  # the sandbox's /dev/shm
#: Seconds the grader's work on a submission may take beyond its budget (the kernel's start,
#: nbgrader's bookkeeping, the feedback page) before it is stopped.
GRADER_SLACK_S = 180.0
WORK = ".grading"
REPORT = "grading_report.json"
STATUSES = ("graded", "incomplete", "crashed", "flagged", "unmatched", "failed")
SANDBOX_MODES = ("required", "off")
UNSANDBOXED_WARNING = (
    "UNSANDBOXED grading (--unsandboxed): submissions run without an OS sandbox; each is "
    "contained (own package view, workspace, process group, limits) but can read and write "
    "what this user can. Grading runs untrusted code: install bubblewrap."
)


@dataclass
class GradingOptions:
    """How submissions are run.

    Attributes:
        profile: ``TRANSFORMER_LAB_PROFILE`` of the kernels (``grading``).
        cell_timeout: seconds one cell may run (default: ``nbgrader_config.py``'s).
        budget: seconds one whole submission may run, all cells together.
        memory_gb: memory of a submission: each process's address space and the sandbox's
            RAM file systems (``/tmp``, ``/dev/shm``) together; with a cgroup, all its
            processes and their tmpfs pages together.
        tmp_gb: size of the sandbox's ``/tmp`` (part of ``memory_gb``).
        max_tasks: processes and threads a submission may have at once (cgroup ``pids.max``;
            ``RLIMIT_NPROC`` beyond what the user runs already).
        cpu_seconds: CPU-time limit of a kernel.
        threads: CPU threads per kernel (``TRANSFORMER_LAB_THREADS``, ``OMP_NUM_THREADS``).
        sandbox: ``required`` (the default: refuse to grade where bubblewrap does not work)
            or ``off`` (``--unsandboxed``: no OS sandbox, said loudly; each submission is
            still contained, see :mod:`~transformer_lab.grading.contain`).
        keep_work: keep each submission's workspace under ``DIR/.grading/work``.
        grader_memory_gb: address space of the grader's own work on one submission (it runs
            in a child process of its own, :mod:`~transformer_lab.grading.isolate`, before a
            deadline of ``budget`` plus :data:`GRADER_SLACK_S`).
    """

    profile: str = "grading"
    cell_timeout: int | None = None
    budget: float = BUDGET_S
    memory_gb: float = 8.0
    tmp_gb: float = 1.0
    max_tasks: int = 256
    cpu_seconds: int = 900
    threads: int = 1
    sandbox: str = "required"
    keep_work: bool = False
    grader_memory_gb: float = 6.0

    def __post_init__(self) -> None:
        if self.sandbox not in SANDBOX_MODES:
            raise GradingError(
                f"sandbox={self.sandbox!r} is not one of {', '.join(SANDBOX_MODES)} (grading "
                "needs bubblewrap unless you opt out with --unsandboxed)"
            )
        for name in (
            "budget", "memory_gb", "tmp_gb", "max_tasks", "cpu_seconds", "threads",
            "grader_memory_gb",
        ):  # fmt: skip
            if getattr(self, name) <= 0:
                raise GradingError(f"{name}={getattr(self, name)} must be positive")


@dataclass
class SubmissionResult:
    """The outcome for one student and one lab.

    Attributes:
        student: student id (folder name).
        lab: lab name.
        status: ``graded``; ``incomplete`` (a cell timed out or the time budget ran out: the
            rest was graded; worth re-grading with more time); ``crashed`` (the kernel died);
            ``flagged`` (tampering or cheat constructs found: autograded points withheld until
            an instructor reviews); ``unmatched`` (not graded: not this lab's notebook);
            ``failed`` (the grader itself failed on it).
        score: total score in the gradebook (autograded plus any manual grades so far).
        max_score: the lab's maximum.
        auto_score: points from the autograded test cells, as recorded.
        auto_max: points available in autograded test cells.
        raw_auto_score: what the test cells earned before flags (for the reviewer).
        needs_manual: cells waiting for a human grader (written answers).
        flags: why the submission is flagged, one sentence each.
        problems: cells that timed out, ran out of budget or died.
        notes: things a reviewer may want to know that are not cheats.
        repairs: what :func:`repair_notebook` changed, per notebook.
        ignored: other notebooks found in the submission folder that were not graded.
        error: why grading failed (``failed``/``unmatched``).
        sandbox: ``bubblewrap`` or ``none``.
        containment: how its processes were held together (``cgroup+subreaper``,
            ``subreaper``) and how many were still alive when it ended.
        seconds: wall time spent on this submission.
        cell_scores: test cell grade id -> [score, max] as recorded.
        verdicts: test cell grade id -> ``{"score": float, "max_score": float, "mistake":
            str | None, "message": str}``: the named mistake a check recognised (``None``:
            none recognised) and what the student was told; read by ``labs report``.
        timestamp: when it was handed in (ISO), from its ``timestamp.txt``, or ``""``.
        late_penalty: the points nbgrader's late-submission settings took off.
    """

    student: str
    lab: str
    status: str
    score: float | None = None
    max_score: float | None = None
    auto_score: float | None = None
    auto_max: float | None = None
    raw_auto_score: float | None = None
    needs_manual: int = 0
    flags: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    error: str = ""
    sandbox: str = ""
    containment: str = ""
    seconds: float = 0.0
    cell_scores: dict[str, list[float]] = field(default_factory=dict)
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    timestamp: str = ""
    late_penalty: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GradeReport:
    """All results of one ``grade`` run and where its outputs are."""

    course: Path
    results: list[SubmissionResult]
    csv_path: Path
    feedback_dir: Path
    sandbox: str = ""
    run_id: str = ""
    skipped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every submission was graded, with no flag and no cell cut short."""
        return all(r.status == "graded" for r in self.results)

    def find(self, student: str, lab: str) -> SubmissionResult:
        """The result of ``student`` for ``lab``."""
        for r in self.results:
            if r.student == student and r.lab == lab:
                return r
        raise KeyError(f"no result for student={student!r} lab={lab!r}")

    def table(self) -> str:
        """A plain-text summary, one line per submission, with flags and problems below."""
        head = f"{'student':<20} {'lab':<26} {'status':<10} {'auto':>9} {'manual':>6} {'s':>6}"
        lines = []
        if self.sandbox == "none":
            lines.append(f"WARNING: {UNSANDBOXED_WARNING}")
        lines.append(head)
        for r in self.results:
            auto = f"{r.auto_score:g}/{r.auto_max:g}" if r.auto_score is not None else "-"
            lines.append(
                f"{r.student:<20} {r.lab:<26} {r.status:<10} {auto:>9} {r.needs_manual:>6} "
                f"{r.seconds:>6.1f}"
            )
            lines += [f"    flag: {f}" for f in r.flags]
            lines += [f"    problem: {p}" for p in r.problems]
            lines += [f"    ignored: {i}" for i in r.ignored]
            if r.repairs:  # one line: each repair is in grading_report.json
                lines.append(
                    f"    repaired: {len(r.repairs)} cell(s) matched to the release (Colab and "
                    "editors drop nbgrader's metadata; each repair in grading_report.json)"
                )
            if r.error:
                lines.append(f"    error: {r.error}")
        if self.skipped:
            lines.append(
                f"skipped {len(self.skipped)} unchanged submission(s) (the same submission, lab "
                "source, kit and options as when last graded; --force grades them again): "
                + ", ".join(self.skipped)
            )
        return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Choosing the notebook of a submission
# --------------------------------------------------------------------------------------

_COPY = re.compile(r"^(?P<stem>.+?)(?: \((?P<n>\d+)\))?$")


def choose_notebook(folder: Path, name: str) -> tuple[Path | None, list[str]]:
    """The notebook to grade in a submission folder, and the others found there.

    The release's own name wins only if it is the newest: browsers and Colab save a later
    download as ``<lab> (1).ipynb``, so the newest of the lab's copies (by modification time,
    then by copy number) is graded and every other notebook is reported.
    """
    notebooks = sorted(p for p in folder.glob("*.ipynb") if p.is_file())
    if not notebooks:
        return None, []
    stem = Path(name).stem

    def copy_number(path: Path) -> int:
        found = _COPY.match(path.stem)
        return int(found.group("n") or 0) if found else 0

    same_lab = [p for p in notebooks if _COPY.match(p.stem).group("stem") == stem]
    pool = same_lab or (notebooks if len(notebooks) == 1 else [])
    if not pool:
        return None, [p.name for p in notebooks]
    chosen = max(pool, key=lambda p: (p.stat().st_mtime, copy_number(p)))
    return chosen, [p.name for p in notebooks if p != chosen]


# --------------------------------------------------------------------------------------
# One submission (runs in a worker process)
# --------------------------------------------------------------------------------------


class GuardedAutograde(Autograde):
    """nbgrader's ``Autograde`` with the sandboxed, time-budgeted ``Execute``."""

    autograde_preprocessors = List(
        [
            BudgetedExecute,
            IgnorePattern,
            ClearMetadataPreprocessor,
            LimitOutput,
            SaveAutoGrades,
            AssignLatePenalties,
            CheckCellMetadata,
        ]
    ).tag(config=True)


@dataclass
class Job:
    """Everything a worker needs to grade one submission (plain values: it crosses processes)."""

    repo: str
    course: str
    student: str
    lab: str
    notebook: str
    ignored: list[str]
    release: str
    template_db: str
    view: str
    view_digest: str
    mpl_cache: str
    options: dict[str, Any]
    use_bwrap: bool


def _kernel_workspace(job: Job) -> tuple[Path, Path, Path]:
    """A short private folder for one kernel: ``home`` (its cwd) and ``run`` (sockets, log)."""
    base = Path(tempfile.mkdtemp(prefix="tlk-", dir="/tmp" if Path("/tmp").is_dir() else None))
    home, run = base / "home", base / "run"
    home.mkdir()
    run.mkdir()
    if Path(job.mpl_cache).is_dir():
        shutil.copytree(job.mpl_cache, home / ".matplotlib")
    return base, home, run


def _private_view(job: Job, base: Path) -> Path:
    """This submission's own copy of the lab's package view, in its private folder.

    A kernel without the OS sandbox can write wherever this user can: into a view shared by
    every submission it would change what later ones import. Its copy goes with it; the
    shared view is checked unchanged before each copy.
    """
    if _tree_digest(Path(job.view)) != job.view_digest:
        raise GradingError(
            f"the package view {job.view} changed during the run (an unsandboxed submission "
            "wrote to it?): grade again, in the sandbox"
        )
    view = base / "view"
    shutil.copytree(job.view, view, symlinks=True)
    return view


def _tree_digest(root: Path) -> str:
    """One hash of every file's relative path and content under ``root``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"link")
    return digest.hexdigest()


#: Statuses of a previous grading that an unchanged submission keeps (the others may pass on a
#: second try: a timeout, a dead kernel, a grader failure).
KEPT = ("graded", "flagged", "unmatched")
INPUTS = "inputs.json"


def _kit_digest(repo: Path) -> str:
    """One hash of the kit's own files (grader, checks, specs; bytecode caches left out) and
    the course's ``nbgrader_config.py``."""
    import transformer_lab

    root = Path(transformer_lab.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    config = repo / "nbgrader_config.py"
    digest.update(config.read_bytes() if config.is_file() else b"")
    return digest.hexdigest()


def _inputs_digest(folder: Path, source: Path, kit: str, options: Any) -> str:
    """What a submission's grade depends on: its files, its lab's source (``solutions/<lab>``,
    from which the release and the hidden tests are made), the kit, the grading options.
    Unchanged, grading it again gives the same grade."""
    settings = {k: v for k, v in asdict(options).items() if k != "keep_work"}
    digest = hashlib.sha256()
    for part in (_tree_digest(folder), _tree_digest(source), kit):
        digest.update(part.encode() + b"\0")
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def _read_scores(db_url: str, lab: str, student: str) -> tuple[dict[str, list[float]], int]:
    """Test cell grade id -> [auto score, max] from a gradebook; and cells needing a human."""
    scores: dict[str, list[float]] = {}
    manual = 0
    with Gradebook(db_url) as gb:
        submission = gb.find_submission(lab, student)
        for notebook in submission.notebooks:
            for grade in notebook.grades:
                if grade.cell_type == "code" and not grade.needs_manual_grade:
                    scores[grade.name] = [float(grade.auto_score or 0.0), float(grade.max_score)]
                elif grade.needs_manual_grade:
                    manual += 1
    return scores, manual


def _read_lateness(db_url: str, lab: str, student: str) -> tuple[str, float]:
    """The submission's time (ISO, or "") and the late penalty nbgrader's settings gave it."""
    with Gradebook(db_url) as gb:
        submission = gb.find_submission(lab, student)
        stamp = submission.timestamp.isoformat() if submission.timestamp else ""
        penalty = sum(float(nb.late_submission_penalty or 0.0) for nb in submission.notebooks)
    return stamp, penalty


def set_due_date(db_url: str, lab: str, repo: Path) -> None:
    """The lab's deadline (``c.TransformerLab.deadlines``) as its due date in a gradebook.

    With it, nbgrader's late-submission settings (``c.LateSubmissionPlugin.penalty_method``)
    apply to each submission's ``timestamp.txt`` (written by ``labs collect``).
    """
    from transformer_lab.grading.results import course_deadlines

    due = course_deadlines(repo).get(lab)
    if due is None:
        return
    with Gradebook(db_url) as gb:
        gb.update_or_create_assignment(lab, duedate=due.astimezone(dt.UTC).replace(tzinfo=None))


def _cell_problems(executed: Any) -> tuple[list[str], bool, bool]:
    """Cells that timed out, ran out of budget or died; and whether any did each.

    The cells that were then not run at all are counted, not listed one by one.
    """
    problems, timed_out, died = [], False, False
    not_run = 0
    for index, cell in enumerate(executed.cells, start=1):
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
        for output in cell.get("outputs", []):
            if output.get("output_type") != "error":
                continue
            ename = output.get("ename", "")
            if ename not in (*TIMEOUT_ENAMES, DEAD_ENAME):
                continue
            timed_out |= ename in TIMEOUT_ENAMES
            died |= ename == DEAD_ENAME
            evalue = str(output.get("evalue", "")) or "no reply before the cell's timeout"
            if evalue.startswith("not run"):
                not_run += 1
                continue
            what = f"cell {index}" + (f" ({gid})" if gid else "")
            problems.append(f"{what}: {ename}: {evalue}"[:300])
    if not_run:
        problems.append(f"{not_run} later cell(s) were not run")
    return problems, timed_out, died


def grade_one(job: Job) -> tuple[SubmissionResult, dict[str, str]]:
    """Grade one submission in its own workspace; return the result and the files to keep.

    Its steps, each a function of its own: the submission repaired into the workspace
    (:func:`_stage_submission`), the kernel's sandbox and nbgrader's settings
    (:func:`_kernel_overrides`), nbgrader's run, the verdict (:func:`decide`, from the judge's
    verdicts and the flags) and the feedback without hidden tests (:func:`_write_feedback`).
    """
    from transformer_lab.grading.contain import Containment
    from transformer_lab.grading.integrity import plan_for, scan_student_code

    options = GradingOptions(**job.options)
    containment = Containment(options.max_tasks, int(options.memory_gb * 2**30))
    result = SubmissionResult(job.student, job.lab, "graded", ignored=list(job.ignored))
    result.sandbox = "bubblewrap" if job.use_bwrap else "none"
    repo, course, lab, student = Path(job.repo), Path(job.course), job.lab, job.student
    work = Path(tempfile.mkdtemp(prefix=f"{student}-{lab[:2]}-", dir=course / WORK / "work"))
    files: dict[str, str] = {}
    base = None
    try:
        repaired = _stage_submission(job, work, result)
        if repaired is None:
            return result, files
        try:
            flags = [f"student code: {f}" for f in scan_student_code(repaired)]
        except RecursionError:  # nested past what the grader's parser reads: unread code
            flags = ["student code: nested too deeply for the grader to read"]
        source = read_notebook(repo / SOLUTIONS / lab / f"{lab}.ipynb")
        plan = plan_for(source, lab)
        base, home, run = _kernel_workspace(job)
        view = _private_view(job, base)
        containment.start()
        guarded = not job.use_bwrap  # without the OS sandbox the guard fences, as help
        overrides = _kernel_overrides(job, options, containment, home, run, view, work, plan)
        (work / "judge_plan.json").write_text(json.dumps(judge_plan(source)))  # outside the box
        db = work / "gradebook.db"  # this submission's own: scratch
        shutil.copyfile(job.template_db, db)
        config = load_config(repo, **overrides)
        coursedir = make_coursedir(
            config,
            work,
            source_directory=str((repo / SOLUTIONS).resolve()),
            submitted_directory="submitted",
            autograded_directory="autograded",
            db_url=f"sqlite:///{db}",
        )
        coursedir.assignment_id, coursedir.student_id = lab, student

        # Run it; then nothing it started may outlive it.
        with scratch_gradebook(db):
            out = run_converter(
                GuardedAutograde, coursedir, config, force=True, create_student=True
            )
        result.containment = f"{containment.kind}, {containment.end()} process(es) ended"
        if not out["success"]:
            result.status = "failed"
            result.error = f"nbgrader could not autograde it:\n{_failure_summary(out)}"
            return result, files

        # The judge's verdicts, what nbgrader recorded, and the flags for review.
        executed_path = work / "autograded" / student / lab / f"{lab}.ipynb"
        executed = read_notebook(executed_path)
        problems, timed_out, died = _cell_problems(executed)
        scores, manual = _read_scores(f"sqlite:///{db}", lab, student)
        result.timestamp, result.late_penalty = _read_lateness(f"sqlite:///{db}", lab, student)
        if guarded:
            flags += _guard_flags(run / "guard.log", plan.key, result, stopped=died or timed_out)
        verdicts_path = work / "verdicts.json"
        verdicts = json.loads(verdicts_path.read_text()) if verdicts_path.is_file() else {}
        try:
            verdicts = refuse_unwritten(verdicts, repaired, source, lab)
        except RecursionError:
            flags.append("student code: nested too deeply for the grader to read")
        decision = decide(scores, verdicts, flags, died=died, timed_out=timed_out)
        result.status = decision.status or result.status
        result.verdicts, result.cell_scores = decision.verdicts, decision.cell_scores
        result.raw_auto_score, result.auto_score = decision.raw_auto_score, decision.auto_score
        result.auto_max, result.flags = decision.auto_max, decision.flags
        result.notes = list(dict.fromkeys(result.notes))[:20]
        result.problems = problems
        result.needs_manual = manual
        feedback_path = _write_feedback(executed, decision, result, work)
        files = {"autograded": str(executed_path), "feedback": str(feedback_path)}
        return result, files
    except Exception as exc:  # one broken submission never stops the batch
        result.status = "failed"
        result.error = describe(exc, int(options.grader_memory_gb * 2**30))
        return result, files
    finally:
        containment.end()
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)
        files.setdefault("work", str(work))


def _stage_submission(job: Job, work: Path, result: SubmissionResult) -> Any | None:
    """The submission, repaired against the release, written where nbgrader looks for it.

    Returns the repaired notebook, or ``None`` with ``result`` saying why it cannot be graded
    (not a notebook, or not this lab's).
    """
    try:
        submitted = read_notebook(Path(job.notebook))
    except Exception as exc:
        result.status, result.error = "unmatched", f"not a readable notebook: {exc}"
        return None
    repaired = repair_notebook(submitted, read_notebook(Path(job.release)))
    if not repaired.ok:
        result.status, result.error = "unmatched", f"{Path(job.notebook).name}: {repaired.reason}"
        return None
    result.repairs = list(repaired.actions)
    if Path(job.notebook).name != f"{job.lab}.ipynb":
        result.repairs.insert(0, f"graded {Path(job.notebook).name} as {job.lab}.ipynb")
    target = work / "submitted" / job.student / job.lab / f"{job.lab}.ipynb"
    write_notebook(repaired.notebook, target)
    stamp = Path(job.notebook).parent / "timestamp.txt"  # nbgrader's submission time
    if stamp.is_file():
        shutil.copyfile(stamp, target.parent / "timestamp.txt")
    return repaired.notebook


def _kernel_overrides(
    job: Job,
    options: GradingOptions,
    containment: Any,
    home: Path,
    run: Path,
    view: Path,
    work: Path,
    plan: Any,
) -> dict[str, Any]:
    """nbgrader's settings for one submission: the judge's files, the time budget, and the
    kernel's sandbox (its workspace, the package view without the grading package, limits).

    Without the OS sandbox the in-kernel guard is configured too (``run/guard.json``): it
    fences files, processes and sockets as help, and what it refuses becomes a flag.
    """
    from transformer_lab.grading.sandbox import KernelSandbox

    guarded = not job.use_bwrap
    hidden_root = view / "transformer_lab" / "grading"
    box = KernelSandbox(
        workspace=home,
        run_dir=run,
        python_path=[view],
        hidden=[hidden_root],
        use_bwrap=job.use_bwrap,
        memory_bytes=int(options.memory_gb * 2**30),
        cpu_seconds=options.cpu_seconds,
        max_tasks=options.max_tasks,
        tmp_bytes=int(options.tmp_gb * 2**30),
        shm_bytes=SHM_BYTES,
        launcher_args=containment.launcher_args,
        env={
            "TRANSFORMER_LAB_PROFILE": options.profile,
            "TRANSFORMER_LAB_GRADING": "1",  # no saved answer of the student's is loaded
            "TRANSFORMER_LAB_THREADS": str(options.threads),
            "OMP_NUM_THREADS": str(options.threads),
            "MKL_NUM_THREADS": str(options.threads),
            "MPLBACKEND": "module://matplotlib_inline.backend_inline",
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        },
    )
    guard_file = run / "guard.json"
    if guarded:
        guard_file.write_text(
            json.dumps(
                plan.guard_config(
                    job.lab,
                    workspace=str(home),
                    log=str(run / "guard.log"),
                    hidden_root=str(hidden_root),
                    read_roots=box.read_roots(),
                    write_roots=[str(box.tmp_dir)],
                )
            )
        )
    overrides: dict[str, Any] = {
        "BudgetedExecute__judge_plan": str(work / "judge_plan.json"),
        "BudgetedExecute__verdicts_path": str(work / "verdicts.json"),
        "BudgetedExecute__budget": float(options.budget),
        "BudgetedExecute__finish_source": plan.finish_source if guarded else "",
        "SandboxedKernelManager__guard_config": str(guard_file) if guarded else "",
        "SandboxedKernelManager__sandbox": {
            "workspace": str(home),
            "run_dir": str(run),
            "python_path": [str(view)],
            "hidden": [str(hidden_root)],
            "env": box.env,
            "memory_bytes": box.memory_bytes,
            "cpu_seconds": box.cpu_seconds,
            "use_bwrap": box.use_bwrap,
            "max_tasks": box.max_tasks,
            "tmp_bytes": box.tmp_bytes,
            "shm_bytes": box.shm_bytes,
            "launcher_args": box.launcher_args,
            # The kernel holds no check: the grading package is not there at all.
            "masked": [str(p) for p in _installed_kits()] + [str(hidden_root)],
        },
    }
    if options.cell_timeout:
        overrides["Execute__timeout"] = int(options.cell_timeout)
    return overrides


def _guard_flags(log: Path, key: str, result: SubmissionResult, *, stopped: bool) -> list[str]:
    """What the in-kernel guard (unsandboxed grading only) refused or noticed, as flags for
    review; its notes go to ``result.notes``. ``stopped``: the kernel died or ran out of time
    (otherwise a missing closing record means its execution was cut some other way)."""
    from transformer_lab.grading.integrity import read_log

    reading = read_log(log, key)
    flags = list(reading.problems)
    for record in reading.records:
        event = record.get("event")
        if event == "tamper":
            flags.append(f"tampering {record.get('where')}: {'; '.join(record.get('what', []))}")
        elif event == "violation":
            flags.append(
                f"refused during grading: {record.get('what')} {record.get('detail', '')} "
                f"({record.get('where', '')})"
            )
        elif event == "forged":
            flags.append(f"forged grader record: {record.get('what')}")
        elif event == "note":
            result.notes.append(str(record.get("what")))
    if not reading.finished and not stopped:
        flags.append("the grader's closing record is missing: the notebook's execution was cut")
    return flags


def _write_feedback(
    executed: Any, decision: Decision, result: SubmissionResult, work: Path
) -> Path:
    """The student's feedback HTML (sanitised, without hidden tests) in the workspace."""
    from transformer_lab.grading.feedback import feedback_notebook, render_html

    feedback = feedback_notebook(
        executed,
        {gid: (score, most) for gid, (score, most) in decision.cell_scores.items()},
        title=f"lab {result.lab}, {result.student}",
        status=result.status,
        notes=decision.notes,
        flags=result.flags,
    )
    path = work / "feedback" / f"{result.lab}.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(feedback), encoding="utf-8")
    return path


def refuse_unwritten(
    verdicts: dict[str, Any], submission: Any, source: Any, lab: str
) -> dict[str, Any]:
    """The judge's verdicts with every test cell of a part that reaches what its bans refuse
    failed, whatever the kernel did (:func:`transformer_lab.grading.authorship.refused_parts`:
    decided here, from the notebook's source, where no code of the student's runs)."""
    from transformer_lab.checks.spec import SpecError, load
    from transformer_lab.grading.authorship import refused_parts

    try:
        spec = load(lab)
    except SpecError:
        return verdicts
    refused = refused_parts(submission, spec, source)
    out = dict(verdicts)
    for gid, message in refused.items():
        old = out.get(gid) if isinstance(out.get(gid), dict) else {}
        out[gid] = {**old, "grade_id": gid, "passed": False, "message": message, "mistake": None}
    return out


def judge_plan(source: Any) -> dict[str, dict[str, Any]]:
    """The judge's cells: ``{grade_id: {"source": trusted source, "hidden": bool}}``.

    Every autograded test cell of the source notebook, hidden tests included (they run only
    in the grader's process).
    """
    plan = {}
    for cell in source.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            plan[meta["grade_id"]] = {
                "source": cell.source,
                "hidden": "BEGIN HIDDEN TESTS" in cell.source,
            }
    return plan


@dataclass
class Decision:
    """The verdict step's outcome for one submission (see :func:`decide`).

    Attributes:
        status: ``"flagged"``, ``"crashed"``, ``"incomplete"``, or ``""`` (graded).
        cell_scores: test cell -> ``[points, maximum]`` as written to the gradebook.
        notes: test cell -> the judge's message for a cell that lost its points, or that kept
            them on a stand-in for an earlier part that failed (it says so).
        verdicts: test cell -> points, message and named mistake (for the class report).
        raw_auto_score: the judge's points before a flag withholds them.
        auto_score, auto_max: the points given and the most there were.
        flags: what an instructor must review, once each.
    """

    status: str
    cell_scores: dict[str, list[float]]
    notes: dict[str, str]
    verdicts: dict[str, dict[str, Any]]
    raw_auto_score: float
    auto_score: float
    auto_max: float
    flags: list[str]


_NOT_REACHED = "(the grader's judge was not reached: the notebook stopped before it)"


def decide(
    nbgrader_scores: dict[str, list[float]],
    verdicts: dict[str, Any],
    flags: list[str],
    *,
    died: bool = False,
    timed_out: bool = False,
) -> Decision:
    """The points of one submission, from the judge's verdicts alone.

    ``nbgrader_scores`` gives only each test cell's maximum (what nbgrader scored in the
    kernel decides nothing); ``verdicts`` are the judge's, by grade id (a cell without one
    scores 0 with the reason); any flag withholds every point until an instructor reviews it.
    """
    scores, notes, records = {}, {}, {}
    for gid, (_, maximum) in nbgrader_scores.items():
        verdict = verdicts.get(gid)
        passed = isinstance(verdict, dict) and verdict.get("passed") is True
        scores[gid] = [float(maximum) if passed else 0.0, float(maximum)]
        if verdict is None:
            notes[gid] = _NOT_REACHED
        elif not passed:
            notes[gid] = str(verdict.get("message", "")) if isinstance(verdict, dict) else ""
        elif verdict.get("message"):  # kept its points on a stand-in for an earlier part
            notes[gid] = str(verdict["message"])
        mistake = verdict.get("mistake") if isinstance(verdict, dict) else None
        records[gid] = {
            "score": scores[gid][0],
            "max_score": scores[gid][1],
            "mistake": mistake,
            "message": notes.get(gid, ""),
        }
    raw = sum(s for s, _ in scores.values())
    unique_flags = list(dict.fromkeys(flags))
    status = "flagged" if unique_flags else "crashed" if died else "incomplete" if timed_out else ""
    if unique_flags:
        scores = {gid: [0.0, m] for gid, (_, m) in scores.items()}
    return Decision(
        status=status,
        cell_scores=scores,
        notes=notes,
        verdicts=records,
        raw_auto_score=raw,
        auto_score=sum(s for s, _ in scores.values()),
        auto_max=sum(m for _, m in scores.values()),
        flags=unique_flags,
    )


def warm_judge(repo: str, labs: list[str]) -> None:
    """Import in this (the grader's) process what the judge of each lab will import: its
    visible and hidden checks and the libraries its source notebook's setup cell imports
    (Lightning, torchmetrics: seconds each).

    Paid once per run and worker, with the lab's other fixed costs, instead of by the first
    submission a worker grades. Trusted code only (the repository's own notebook and
    package); a failure here just leaves the imports to the judge.
    """
    import importlib

    from transformer_lab.grading.standard import setup_cell, setup_cell_imports

    for lab in labs:
        try:
            source = read_notebook(Path(repo) / SOLUTIONS / lab / f"{lab}.ipynb")
            setup = setup_cell(source)
            if setup is not None:
                imports = "\n".join(setup_cell_imports(setup.source))
                exec(compile(imports, f"<{lab} imports>", "exec"), {})
            importlib.import_module(f"transformer_lab.grading.hidden.lab{lab[:2]}")
        except Exception:  # the judge imports what it needs itself
            pass
    warm_feedback(repo, labs)


def warm_feedback(repo: str, labs: list[str]) -> None:
    """Render one feedback page in this (the grader's) process, and read one cell as IPython
    runs it, before any submission: what they load on first use is then loaded once per run
    and worker, not in each submission's child (:func:`_run_job` forks one per submission).

    The first page a process renders pays for nbconvert's templates, the Markdown, LaTeX and
    code highlighters and the HTML sanitiser's tables; the first cell read pays for IPython's
    input transformers (:func:`~transformer_lab.grading.authorship.transformed`). The page
    is the first of ``labs``' source notebooks that renders (trusted), as an ungraded
    submission, and is discarded. A failure here leaves that work to each submission.
    """
    from transformer_lab.grading.authorship import transformed
    from transformer_lab.grading.feedback import feedback_notebook, render_html

    with contextlib.suppress(Exception):
        transformed("%matplotlib inline\nx = 1")
    for lab in labs:
        try:
            source = read_notebook(Path(repo) / SOLUTIONS / lab / f"{lab}.ipynb")
            render_html(feedback_notebook(source, {}, title=f"lab {lab}", status="graded"))
            return
        except Exception:  # each submission renders its own page all the same
            continue


def _grade_quietly(job: Job) -> tuple[SubmissionResult, dict[str, str]]:
    with warnings.catch_warnings():
        # nbgrader's gradebook triggers SQLAlchemy autoflush warnings that mean nothing here.
        warnings.filterwarnings("ignore", category=SAWarning)
        return grade_one(job)


def _run_job(job: Job) -> tuple[SubmissionResult, dict[str, str]]:
    """One submission, graded in a child process bounded in memory and time
    (:func:`~transformer_lab.grading.isolate.run_bounded`): whatever fails there is this
    submission's result, said in one line on standard error, and the batch goes on."""
    start = time.perf_counter()
    options = GradingOptions(**job.options)
    bounds = Bounds(int(options.grader_memory_gb * 2**30), options.budget + GRADER_SLACK_S)
    outcome = run_bounded(_grade_quietly, job, bounds)
    if outcome.ok:
        result, files = outcome.value
    else:
        result = SubmissionResult(job.student, job.lab, "failed", ignored=list(job.ignored))
        result.error, files = outcome.failure, {}
    result.seconds = round(time.perf_counter() - start, 2)
    if result.status == "failed":
        why = result.error.splitlines()[0] if result.error else "no reason given"
        line = f"labs grade: {job.student}/{job.lab} failed ({why}); the batch goes on"
        print(line, file=sys.stderr)
    return result, files


def _installed_kits() -> list[Path]:
    """Installed (non-editable) copies of the kit, hidden inside the sandbox."""
    import transformer_lab

    here = Path(transformer_lab.__file__).resolve().parent
    return [here] if "site-packages" in here.parts else []


# --------------------------------------------------------------------------------------
# The gradebook (only this process writes it)
# --------------------------------------------------------------------------------------


def _fingerprint(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


def record_result(db_url: str, result: SubmissionResult) -> None:
    """Write one validated result into a gradebook (manual grades already there are kept)."""
    with Gradebook(db_url) as gb:
        gb.update_or_create_student(result.student)
        submission = gb.update_or_create_submission(result.lab, result.student)
        if result.timestamp:
            submission.timestamp = dt.datetime.fromisoformat(result.timestamp)
        for notebook in submission.notebooks:
            notebook.flagged = result.status == "flagged"
            notebook.late_submission_penalty = result.late_penalty or None
            for grade in notebook.grades:
                if grade.name in result.cell_scores:
                    grade.auto_score = result.cell_scores[grade.name][0]
                    grade.needs_manual_grade = False
                elif grade.cell_type == "markdown":
                    grade.needs_manual_grade = grade.manual_score is None
        gb.db.commit()
        submission = gb.find_submission(result.lab, result.student)
        result.score = float(submission.score)
        result.max_score = float(submission.max_score)


def merge_gradebooks(into: Path, sources: list[Path]) -> list[str]:
    """Copy every submission's grades and comments from ``sources`` into ``into``.

    How a term's grading is split across machines: each machine grades some students into its
    own course folder; the gradebooks are then merged into one. A grade (autograded or manual)
    already present in ``into`` is replaced by the source's only when the source has one.

    Returns:
        ``"student/lab"`` for every submission merged.
    """
    merged = []
    target_url = f"sqlite:///{Path(into).resolve()}"
    for source in sources:
        with Gradebook(f"sqlite:///{Path(source).resolve()}") as theirs:
            for assignment in theirs.assignments:
                for sub in assignment.submissions:
                    with Gradebook(target_url) as ours:
                        try:
                            ours.find_assignment(assignment.name)
                        except MissingEntry as exc:
                            raise GradingError(
                                f"{into} has no lab {assignment.name}: grade or generate it first"
                            ) from exc
                        ours.update_or_create_student(sub.student.id)
                        mine = ours.update_or_create_submission(assignment.name, sub.student.id)
                        grades = {
                            (g.notebook.name, g.name): g for nb in sub.notebooks for g in nb.grades
                        }
                        for nb in mine.notebooks:
                            nb.flagged = any(o.flagged for o in sub.notebooks if o.name == nb.name)
                            for grade in nb.grades:
                                other = grades.get((nb.name, grade.name))
                                if other is None:
                                    continue
                                if other.auto_score is not None:
                                    grade.auto_score = other.auto_score
                                if other.manual_score is not None:
                                    grade.manual_score = other.manual_score
                                grade.needs_manual_grade = other.needs_manual_grade
                        ours.db.commit()
                    merged.append(f"{sub.student.id}/{assignment.name}")
    return merged


# --------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------


def _append_report(path: Path, run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Append ``run`` to the report file (every run is kept); return the latest per submission."""
    runs: list[dict[str, Any]] = []
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError:
            backup = path.with_suffix(f".unreadable-{int(time.time())}.json")
            path.rename(backup)
            old = {}
        if isinstance(old, list):  # the format before runs were kept
            runs = [{"run": "earlier", "results": old}]
        elif isinstance(old, dict):
            runs = list(old.get("runs", []))
    runs.append(run)
    latest: dict[str, dict[str, Any]] = {}
    for one in runs:
        for item in one.get("results", []):
            latest[f"{item.get('student')}/{item.get('lab')}"] = item
    write_json(path, {"runs": runs, "latest": latest})
    return latest


def _write_csv(db_url: str, csv_path: Path, latest: dict[str, dict[str, Any]]) -> None:
    """nbgrader's CSV export with two more columns: ``status`` and ``flags``."""
    exporter = CsvExportPlugin()
    tmp = csv_path.with_suffix(".csv.tmp")
    exporter.to = str(tmp)
    with Gradebook(db_url) as gb:
        exporter.export(gb)
    with open(tmp, newline="") as handle:
        rows = list(csv.DictReader(handle))
    fields = [*(rows[0].keys() if rows else ["assignment", "student_id"]), "status", "flags"]
    for row in rows:
        item = latest.get(f"{row['student_id']}/{row['assignment']}", {})
        submitted = row.get("timestamp") not in ("", None, "None")
        row["status"] = item.get("status", "graded" if submitted else "missing")
        row["flags"] = " | ".join(item.get("flags", []))
    from transformer_lab.grading.results import class_rows, neutralise

    # The whole class: roster students without a submission, files collect placed for nobody.
    more, rows = class_rows(csv_path.parent, rows)
    # An empty export has none of nbgrader's name columns: the roster's names still get theirs.
    columns = list(dict.fromkeys([*fields, *more, *(k for row in rows for k in row)]))
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows({k: neutralise(v) for k, v in row.items()} for row in rows)
    tmp.replace(csv_path)


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


def _prepare_lab(repo: Path, course: Path, lab: str, config: Any) -> tuple[Path, Path, Path]:
    """Release, template gradebook and package view of ``lab`` for this run."""
    from transformer_lab.grading.student import build_package_tree

    work = course / WORK
    template = work / "templates" / lab
    if template.exists():
        shutil.rmtree(template)
    template.mkdir(parents=True)
    tdir = make_coursedir(
        config,
        template,
        source_directory=str((repo / SOLUTIONS).resolve()),
        release_directory=str(course / RELEASE_DIR),
        db_url=f"sqlite:///{template / 'gradebook.db'}",
    )
    tdir.assignment_id, tdir.student_id = lab, "."
    with scratch_gradebook(template / "gradebook.db"):
        out = run_converter(GenerateAssignment, tdir, config, force=True)
    if not out["success"]:
        raise GradingError(f"could not record {lab} in the gradebook:\n{out.get('log')}")
    view = work / "views" / lab
    labs = select_labs(repo, None)
    if (repo / "transformer_lab").is_dir():
        build_package_tree(repo, view, labs[labs.index(lab) :], grader=True)
    else:  # an installed kit: the kernel imports it as it is
        view.mkdir(parents=True, exist_ok=True)
    return course / RELEASE_DIR / lab, template / "gradebook.db", view


def _failure_summary(out: dict[str, Any]) -> str:
    """The cause of a failed nbgrader run first (its first errors), then the log's last lines.

    nbgrader ends every failure with "see the above traceback", which says nothing: the line
    that does ("Kernel died before replying to kernel_info", say) comes earlier.
    """
    lines = (out.get("log", "") + out.get("error", "")).strip().splitlines()
    causes = [line for line in lines if line.startswith("[ERROR]") and "above" not in line][:2]
    causes += [line.strip() for line in lines if re.match(r"\s*\w+(Error|Exception): ", line)][:1]
    tail = [line for line in lines[-6:] if line not in causes]
    return "\n".join([*causes, *tail])


def _matplotlib_cache(course: Path) -> Path:
    """A matplotlib font cache built once, copied into every kernel's home.

    Where this process has loaded matplotlib's font manager already (a grader that graded
    before, a cluster worker), its own font list is copied (the same fonts, scanned by the
    same matplotlib); otherwise a fresh Python process builds one (about 0.5 s of CPU).
    """
    import os
    import subprocess
    import sys

    cache = course / WORK / "matplotlib"
    if not any(cache.glob("fontlist*.json")):
        cache.mkdir(parents=True, exist_ok=True)
        loaded = _loaded_font_list()
        if loaded is not None:
            shutil.copy2(loaded, cache / loaded.name)
            return cache
        env = {**os.environ, "MPLCONFIGDIR": str(cache), "MPLBACKEND": "Agg"}
        subprocess.run(
            [sys.executable, "-c", "import matplotlib.font_manager"],
            env=env,
            capture_output=True,
            timeout=300,
        )
    return cache


def _loaded_font_list() -> Path | None:
    """The font list of the matplotlib this process has loaded, or None where it has not."""
    import sys

    font_manager = sys.modules.get("matplotlib.font_manager")
    if font_manager is None:
        return None
    try:
        version = font_manager.FontManager.__version__
        path = Path(sys.modules["matplotlib"].get_cachedir(), f"fontlist-v{version}.json")
    except Exception:  # another matplotlib's layout: build the cache in a fresh process
        return None
    return path if path.is_file() else None


#: What a Dask worker runs for ``labs grade --cluster`` (the same steps as a local run).
CLUSTER_GRADER = Grader(
    run_job=_run_job,
    warm=warm_judge,
    mpl_cache=_matplotlib_cache,
    work=WORK,
    result=SubmissionResult,
)


def grade_course(
    course: Path,
    repo: Path,
    labs: list[str] | None = None,
    students: list[str] | None = None,
    timeout: int | None = None,
    profile: str = "grading",
    *,
    jobs: int = 1,
    options: GradingOptions | None = None,
    force: bool = False,
    cluster: str | None = None,
    resume: bool = False,
    progress: Callable[[int, int, SubmissionResult], None] | None = None,
) -> GradeReport:
    """Autograde ``course/submitted`` into ``course/gradebook.db``; write feedback, CSV, report.

    A submission graded before is graded again only when it, its lab's source, the kit or the
    options changed (or ``force``); the report lists the ones skipped.

    Args:
        course: the course folder (layout in the module docstring).
        repo: the repository whose ``solutions/`` and ``nbgrader_config.py`` define the labs.
        labs: lab names or prefixes to grade (default: every lab found in submissions).
        students: student ids to grade (default: all).
        timeout: seconds per cell (default: ``nbgrader_config.py``'s ``Execute.timeout``).
        profile: value of ``TRANSFORMER_LAB_PROFILE`` while notebooks run.
        jobs: submissions graded at once, each in its own process.
        options: everything else (:class:`GradingOptions`).
        force: grade every submission, also those unchanged since they were graded.
        cluster: grade on a Dask cluster instead of here: ``local:N``, a scheduler file or
            a scheduler address (:mod:`~transformer_lab.grading.cluster`).
        resume: grade only what a stopped run left (:mod:`~transformer_lab.grading.journal`).
        progress: called with (done, total, result) as each submission is accepted.

    Returns:
        A :class:`GradeReport`; failures of single submissions are recorded, not raised.

    Raises:
        GradingError: no ``submitted/``, a broken lab source, no working bubblewrap (unless
            ``sandbox="off"``), or a gradebook changed by someone else during the run.
    """
    options = options or GradingOptions()
    options.profile = profile
    if timeout:
        options.cell_timeout = int(timeout)
    if jobs < 1:
        raise GradingError(f"jobs={jobs} must be at least 1")
    if cluster and jobs > 1:
        raise GradingError(
            f"jobs={jobs} with cluster={cluster!r}: on a cluster its workers grade at once"
        )
    if cluster:
        from transformer_lab.grading.cluster import check_address

        check_address(cluster)
    course = Path(course).resolve()
    repo = Path(repo).resolve()
    submitted = course / "submitted"
    if not submitted.is_dir():
        raise GradingError(f"{submitted} does not exist: expected submitted/<student>/<lab>/")
    use_bwrap = options.sandbox == "required"
    if use_bwrap and find_bwrap() is None:
        raise GradingError(NO_SANDBOX)
    sandbox = "bubblewrap" if use_bwrap else "none"
    if not use_bwrap:
        warnings.warn(UNSANDBOXED_WARNING, RuntimeWarning, stacklevel=2)
    known = select_labs(repo, None)
    wanted = select_labs(repo, labs) if labs else None
    pairs: list[tuple[str, str]] = []
    results: list[SubmissionResult] = []
    for student_dir in sorted(p for p in submitted.iterdir() if p.is_dir()):
        if students and student_dir.name not in students:
            continue
        for lab_dir in sorted(p for p in student_dir.iterdir() if p.is_dir()):
            if wanted is not None and lab_dir.name not in wanted:
                continue
            if lab_dir.name not in known:
                results.append(
                    SubmissionResult(
                        student_dir.name,
                        lab_dir.name,
                        "unmatched",
                        error=f"no lab called {lab_dir.name!r} (known: {', '.join(known)})",
                    )
                )
                continue
            pairs.append((student_dir.name, lab_dir.name))
    run_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S") + f"-{id(pairs) % 9973}"
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    config = load_config(repo)
    main_db = course / "gradebook.db"
    db_url = f"sqlite:///{main_db}"
    csv_path = course / "grades.csv"
    (course / WORK / "work").mkdir(parents=True, exist_ok=True)
    with grading_env(profile), warnings.catch_warnings():
        # nbgrader's gradebook triggers SQLAlchemy autoflush warnings that mean nothing here.
        warnings.filterwarnings("ignore", category=SAWarning)
        main_dir = make_coursedir(
            config,
            course,
            source_directory=str((repo / SOLUTIONS).resolve()),
            release_directory=RELEASE_DIR,
        )
        # Graded before from the same inputs: not graded again (nor its lab prepared).
        inputs_path = course / WORK / INPUTS
        # Without the gradebook (deleted, or a fresh copy of the course) nothing counts as graded.
        known = inputs_path.is_file() and main_db.is_file()
        inputs = json.loads(inputs_path.read_text()) if known else {}
        before = {k: r.get("status") for k, r in _read_latest(course).items()}
        kit = _kit_digest(repo)
        fresh = {
            f"{s}/{lab}": _inputs_digest(submitted / s / lab, repo / SOLUTIONS / lab, kit, options)
            for s, lab in pairs
        }
        skipped = [
            k
            for k, v in fresh.items()
            if not force and inputs.get(k) == v and before.get(k) in KEPT
        ]
        pairs = [(s, lab) for s, lab in pairs if f"{s}/{lab}" not in skipped]
        prepared: dict[str, tuple[Path, Path, Path]] = {}
        for lab in sorted({lab for _, lab in pairs}):
            main_dir.assignment_id, main_dir.student_id = lab, "."
            out = run_converter(GenerateAssignment, main_dir, config, force=True)
            if not out["success"]:
                raise GradingError(f"could not record {lab} in the gradebook:\n{out.get('log')}")
            prepared[lab] = _prepare_lab(repo, course, lab, config)
            for gradebook in (main_db, prepared[lab][1]):
                set_due_date(f"sqlite:///{gradebook}", lab, repo)
        mpl_cache = str(_matplotlib_cache(course)) if pairs else ""
        digests = {lab: _tree_digest(view) for lab, (_, _, view) in prepared.items()}
        job_list: list[Job] = []
        journal = Journal(course / WORK, resume=resume)
        digests_in: dict[tuple[str, str], str] = {}
        for student, lab in pairs:
            chosen, others = choose_notebook(submitted / student / lab, f"{lab}.ipynb")
            if chosen is None:
                results.append(
                    SubmissionResult(
                        student,
                        lab,
                        "unmatched",
                        error=f"{lab}.ipynb not found in the submission (notebooks there: "
                        f"{others or 'none'})",
                    )
                )
                continue
            digests_in[(student, lab)] = notebook_digest(chosen)
            earlier = journal.finished(student, lab, digests_in[(student, lab)])
            if earlier is not None:  # graded by the run this one resumes
                results.append(SubmissionResult(**earlier))
                continue
            release, template_db, view = prepared[lab]
            job_list.append(
                Job(
                    repo=str(repo),
                    course=str(course),
                    student=student,
                    lab=lab,
                    notebook=str(chosen),
                    ignored=others,
                    release=str(release / f"{lab}.ipynb"),
                    template_db=str(template_db),
                    view=str(view),
                    view_digest=digests[lab],
                    mpl_cache=mpl_cache,
                    options=asdict(options),
                    use_bwrap=use_bwrap,
                )
            )
        expected = _fingerprint(main_db)
        total = len(results) + len(job_list)  # unmatched and resumed ones are in results

        def accept(result: SubmissionResult, files: dict[str, str]) -> None:
            nonlocal expected
            if _fingerprint(main_db) != expected:
                raise GradingError(
                    f"{main_db} was changed by something else while submissions ran: stopping "
                    "before writing any more grades (look at the last grading_report.json)"
                )
            key = f"{result.student}/{result.lab}"
            if key in fresh:  # what it was graded from: unchanged, it is not graded again
                inputs[key] = fresh[key] if result.status in KEPT else None
            if result.status not in ("unmatched", "failed"):
                record_result(db_url, result)
                for kind, dest in (
                    ("autograded", course / "autograded" / result.student / result.lab),
                    ("feedback", course / "feedback" / result.student / result.lab),
                ):
                    if kind in files and Path(files[kind]).is_file():
                        dest.mkdir(parents=True, exist_ok=True)
                        name = Path(files[kind]).name
                        shutil.copyfile(files[kind], dest / name)
            expected = _fingerprint(main_db)
            if not options.keep_work and files.get("work"):
                shutil.rmtree(files["work"], ignore_errors=True)
            results.append(result)
            if result.status != "failed" and (result.student, result.lab) in digests_in:
                journal.add(result.to_json(), digests_in[(result.student, result.lab)])
            if progress is not None:
                progress(len(results), total, result)

        graded_labs = sorted({job.lab for job in job_list})
        if cluster:
            from transformer_lab.grading.cluster import grade_on_cluster, make_bundle

            bundles = {
                lab: make_bundle(repo, lab, prepared[lab], digests[lab]) for lab in graded_labs
            }
            staging = course / WORK / "work"
            for pair in grade_on_cluster(cluster, job_list, bundles, staging, CLUSTER_GRADER):
                accept(*pair)
        elif jobs == 1 or len(job_list) <= 1:
            warm_judge(str(repo), graded_labs)
            for job in job_list:
                accept(*_run_job(job))
        else:
            context = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(
                jobs, mp_context=context, initializer=warm_judge, initargs=(str(repo), graded_labs)
            ) as pool:
                futures = {pool.submit(_run_job, job): job for job in job_list}
                for future in concurrent.futures.as_completed(futures):
                    job = futures[future]
                    try:
                        accept(*future.result())
                    except GradingError:
                        raise
                    except Exception as exc:
                        accept(
                            SubmissionResult(
                                job.student, job.lab, "failed", error=f"{type(exc).__name__}: {exc}"
                            ),
                            {},
                        )
        order = {(s, lab): i for i, (s, lab) in enumerate(pairs)}
        results.sort(key=lambda r: order.get((r.student, r.lab), -1))
        run = {
            "run": run_id,
            "started": started,
            "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "sandbox": sandbox,
            "jobs": jobs,
            "cluster": cluster or "",
            "options": asdict(options),
            "results": [r.to_json() for r in results],
        }
        latest = _append_report(course / REPORT, run)
        _write_csv(db_url, csv_path, latest)
        inputs_path.write_text(json.dumps(inputs, indent=1, sort_keys=True) + "\n")
        journal.close()
    return GradeReport(
        course, results, csv_path, course / "feedback", sandbox, run_id, skipped=skipped
    )


def _read_latest(course: Path) -> dict[str, dict[str, Any]]:
    """The latest record per ``student/lab`` of ``grading_report.json`` (empty if none)."""
    from transformer_lab.grading.results import read_latest

    try:
        return read_latest(course)
    except GradingError:
        return {}
