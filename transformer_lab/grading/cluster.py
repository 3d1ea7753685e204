"""``labs grade --cluster ADDRESS``: each submission one task on a Dask distributed cluster.

A term too large for one machine is a scheduling question, and Dask distributed answers it
with one interface for a laptop (``LocalCluster``), Slurm/PBS/SGE (``dask-jobqueue``) and
Kubernetes (``dask-kubernetes``). The split of work:

* **the coordinator** (the ``labs grade`` process) prepares each lab once as it does for a
  local run (release, template gradebook, package view), sends each lab's files to every
  worker once (:class:`LabBundle`, ``Client.scatter(broadcast=True)``) and each submission
  as one task (:class:`RemoteTask`: the notebook's bytes, not a path: workers need no shared
  file system). It alone writes the gradebook, the feedback and autograded folders and the
  reports, from the plain data each task returns, through the very code a local run uses;
* **a worker** (one thread: ``dask worker --nthreads 1``; the kit and this repository at the
  same commit installed) grades the submission with :func:`~transformer_lab.grading.grade.
  grade_one` in its own sandbox and a private folder, and returns plain data: the result
  (scores, verdicts, flags), the feedback HTML and the executed notebook. It refuses, with a
  message naming itself, where its grader or solutions differ from the coordinator's, or
  where its sandbox does not work.

A worker lost mid-task (killed, preempted, out of memory) costs a retry: the scheduler runs
the task again elsewhere, and the coordinator accepts one result per submission, so a grade
is never lost or doubled; a task whose workers died more often than Dask's
``distributed.scheduler.allowed-failures`` is recorded ``failed`` and graded again by
``labs grade --resume``.

Reference: Dask distributed's ``Client.submit``, ``Client.scatter``, ``as_completed``,
``LocalCluster`` and its resilience to worker failure (docs "Resilience").
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import socket
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from transformer_lab.grading.course import SOLUTIONS, GradingError, find_repo

__all__ = [
    "LabBundle",
    "RemoteTask",
    "check_address",
    "connect",
    "grade_on_cluster",
    "grade_task",
    "kit_digest",
    "make_bundle",
]

NO_DASK = (
    "grading on a cluster needs Dask distributed: pip install 'transformer-lab[cluster]' "
    "(here and on every worker)"
)
LOCAL = re.compile(r"^local:(?P<n>\d+)$")
#: A worker's own folder (bundles, work) under its temporary directory.
WORKER_DIR = "transformer-lab-worker"


@dataclass(frozen=True)
class LabBundle:
    """One lab's files for the workers, as bytes (sent once per lab to every worker).

    Attributes:
        lab: the lab's name.
        release: the release notebook (JSON text).
        template_db: the lab's template gradebook (SQLite file).
        view: the kernel's package view of the lab, as a tar archive.
        view_digest: :func:`~transformer_lab.grading.grade._tree_digest` of that view.
        solution_digest: sha256 of ``solutions/<lab>/<lab>.ipynb`` (the judge's trusted source).
        kit_digest: :func:`kit_digest` of the coordinator's grader.
    """

    lab: str
    release: bytes
    template_db: bytes
    view: bytes
    view_digest: str
    solution_digest: str
    kit_digest: str

    @property
    def key(self) -> str:
        """What identifies this bundle's files on a worker."""
        return hashlib.sha256(
            (self.view_digest + hashlib.sha256(self.template_db).hexdigest()).encode()
            + self.release
        ).hexdigest()[:16]


@dataclass(frozen=True)
class RemoteTask:
    """One submission for a worker: its job (the coordinator's paths) and its files' bytes."""

    job: Any  # transformer_lab.grading.grade.Job
    notebook: bytes
    notebook_name: str
    timestamp: bytes | None


@dataclass(frozen=True)
class Grader:
    """What a worker runs, handed in by :mod:`~transformer_lab.grading.grade` (this module
    never imports it: module-level functions travel to the workers by reference).

    Attributes:
        run_job: grades one job here, returning ``(result, files)``.
        warm: imports a lab's judge once per worker (repo path, labs).
        mpl_cache: the matplotlib cache folder under a worker's root.
        work: the name of a course's work folder (``.grading``).
        result: the result class, built from a worker's plain data.
    """

    run_job: Callable[[Any], tuple[Any, dict[str, str]]]
    warm: Callable[[str, list[str]], None]
    mpl_cache: Callable[[Path], Path]
    work: str
    result: Callable[..., Any]


def kit_digest() -> str:
    """sha256 of every ``.py`` file of the installed kit: coordinator and workers must agree."""
    import transformer_lab

    root = Path(transformer_lab.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _solution_digest(repo: Path, lab: str) -> str:
    return hashlib.sha256((repo / SOLUTIONS / lab / f"{lab}.ipynb").read_bytes()).hexdigest()


def _tar(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(folder, arcname=".")
    return buffer.getvalue()


def make_bundle(
    repo: Path, lab: str, prepared: tuple[Path, Path, Path], view_digest: str
) -> LabBundle:
    """The coordinator's files of ``lab``, as prepared for this run (its release folder,
    template gradebook and package view, whose digest the run computed), as one
    :class:`LabBundle`."""
    release, template_db, view = prepared
    return LabBundle(
        lab=lab,
        release=(release / f"{lab}.ipynb").read_bytes(),
        template_db=template_db.read_bytes(),
        view=_tar(view),
        view_digest=view_digest,
        solution_digest=_solution_digest(repo, lab),
        kit_digest=kit_digest(),
    )


# --------------------------------------------------------------------------------------
# The worker's side
# --------------------------------------------------------------------------------------


def _dask_worker() -> Any | None:
    """The Dask worker running this task, or None (called outside one)."""
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):
        return None


def _worker_root() -> Path:
    """This worker's own folder: in the Dask worker's local directory (removed with the
    worker, a killed one's at the next start), else a temporary one of this process."""
    worker = _dask_worker()
    if worker is not None:
        root = Path(worker.local_directory) / WORKER_DIR
    else:
        root = Path(tempfile.gettempdir()) / f"{WORKER_DIR}-{os.getpid()}"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _worker_repo(coordinators: str) -> Path:
    """This worker's repository: ``$TRANSFORMER_LAB_REPO``, the coordinator's path where it
    holds one, or the one the installed kit lives in."""
    for candidate in (os.environ.get("TRANSFORMER_LAB_REPO", ""), coordinators):
        if candidate and (Path(candidate) / SOLUTIONS).is_dir():
            return Path(candidate)
    return find_repo(None)


def _unpack(bundle: LabBundle, root: Path) -> tuple[Path, Path, Path]:
    """The bundle's release, template gradebook and view on this worker (unpacked once)."""
    home = root / "labs" / f"{bundle.lab}-{bundle.key}"
    release = home / "release" / f"{bundle.lab}.ipynb"
    template, view = home / "template.db", home / "view"
    if not (home / "ready").is_file():
        if home.exists():
            shutil.rmtree(home)
        release.parent.mkdir(parents=True)
        release.write_bytes(bundle.release)
        template.write_bytes(bundle.template_db)
        with tarfile.open(fileobj=io.BytesIO(bundle.view), mode="r:gz") as archive:
            archive.extractall(view, filter="tar")
        (home / "ready").write_text("ok")
    return release, template, view


_WARM: set[str] = set()


def _check_worker(bundle: LabBundle, repo: Path, use_bwrap: bool) -> None:
    """Refuse, naming this worker, to grade with another grader or without the sandbox."""
    from transformer_lab.grading.sandbox import NO_SANDBOX, find_bwrap

    worker = _dask_worker()
    here = str(worker.address) if worker is not None else socket.gethostname()
    if worker is not None and worker.state.nthreads != 1:
        raise GradingError(
            f"worker {here} runs {worker.state.nthreads} threads: a grading worker runs "
            "one submission at a time (start it with `dask worker --nthreads 1`)"
        )
    if kit_digest() != bundle.kit_digest:
        raise GradingError(f"worker {here}'s transformer_lab differs from the coordinator's")
    if _solution_digest(repo, bundle.lab) != bundle.solution_digest:
        raise GradingError(
            f"worker {here}'s {repo / SOLUTIONS / bundle.lab} differs from the coordinator's: "
            "check out the same commit there (or point $TRANSFORMER_LAB_REPO at it)"
        )
    if use_bwrap and find_bwrap() is None:
        raise GradingError(f"on worker {here}: {NO_SANDBOX}")


def grade_task(task: RemoteTask, bundle: LabBundle, grader: Grader) -> dict[str, Any]:
    """Grade one submission on this worker; return plain data (runs on a Dask worker).

    Returns:
        ``{"result": SubmissionResult as JSON, "files": {"autograded": text, "feedback":
        text}, "worker": address}``; nothing is written outside this worker's own folder,
        which is removed again.
    """
    job = task.job
    repo = _worker_repo(job.repo)
    _check_worker(bundle, repo, job.use_bwrap)
    root = _worker_root()
    release, template, view = _unpack(bundle, root)
    mpl_cache = grader.mpl_cache(root)
    if bundle.lab not in _WARM:
        grader.warm(str(repo), [bundle.lab])
        _WARM.add(bundle.lab)
    course = Path(tempfile.mkdtemp(prefix=f"{job.student}-{job.lab[:2]}-", dir=root))
    try:
        (course / grader.work / "work").mkdir(parents=True)
        folder = course / "submitted" / job.student / job.lab
        folder.mkdir(parents=True)
        (folder / task.notebook_name).write_bytes(task.notebook)
        if task.timestamp is not None:
            (folder / "timestamp.txt").write_bytes(task.timestamp)
        local = replace(
            job,
            repo=str(repo),
            course=str(course),
            notebook=str(folder / task.notebook_name),
            release=str(release),
            template_db=str(template),
            view=str(view),
            mpl_cache=str(mpl_cache),
        )
        result, files = grader.run_job(local)
        texts = {
            kind: Path(files[kind]).read_text(encoding="utf-8")
            for kind in ("autograded", "feedback")
            if kind in files and Path(files[kind]).is_file()
        }
        return {"result": result.to_json(), "files": texts, "worker": _address()}
    finally:
        shutil.rmtree(course, ignore_errors=True)


def _address() -> str:
    worker = _dask_worker()
    return str(worker.address) if worker is not None else socket.gethostname()


# --------------------------------------------------------------------------------------
# The coordinator's side
# --------------------------------------------------------------------------------------


def check_address(address: str) -> None:
    """Refuse, by name, an address :func:`connect` cannot use, or a machine without Dask."""
    try:
        import distributed  # noqa: F401
    except ImportError as exc:
        raise GradingError(NO_DASK) from exc
    local = LOCAL.match(address)
    if local and int(local.group("n")) < 1:
        raise GradingError(f"--cluster {address!r}: local:N needs N of at least 1")
    if not local and address.endswith(".json") and not Path(address).is_file():
        raise GradingError(f"--cluster {address!r}: no such scheduler file")
    if not local and not address.endswith(".json") and "://" not in address:
        raise GradingError(
            f"--cluster {address!r} is not local:N, a scheduler file (*.json) or an address "
            "such as tcp://scheduler:8786"
        )


@contextlib.contextmanager
def connect(address: str) -> Iterator[Any]:
    """A Dask ``Client`` for ``address``: ``local:N`` (a ``LocalCluster`` of N one-thread
    worker processes, closed afterwards), a scheduler file (``*.json``, as ``dask scheduler
    --scheduler-file`` writes) or a scheduler address (``tcp://host:8786``)."""
    check_address(address)
    from distributed import Client, LocalCluster

    local = LOCAL.match(address)
    if local:
        with (
            LocalCluster(
                n_workers=int(local.group("n")),
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
            ) as cluster,
            Client(cluster) as client,
        ):
            yield client
    elif address.endswith(".json"):
        with Client(scheduler_file=address, timeout="30s") as client:
            yield client
    else:
        try:
            client = Client(address, timeout="30s")
        except OSError as exc:
            raise GradingError(f"--cluster {address!r}: no Dask scheduler answers ({exc})") from exc
        with client:
            yield client


def _task(job: Any) -> RemoteTask:
    notebook = Path(job.notebook)
    stamp = notebook.parent / "timestamp.txt"
    return RemoteTask(
        job=job,
        notebook=notebook.read_bytes(),
        notebook_name=notebook.name,
        timestamp=stamp.read_bytes() if stamp.is_file() else None,
    )


def grade_on_cluster(
    address: str, jobs: list[Any], bundles: dict[str, LabBundle], staging: Path, grader: Grader
) -> Iterator[tuple[Any, dict[str, str]]]:
    """Grade ``jobs`` on the cluster at ``address``; yield ``(result, files)`` as each ends.

    Each submission's result is yielded once, in the order they finish; its files (the
    feedback and the executed notebook the worker returned) are written under ``staging``,
    for the coordinator to put in place as a local run's are. A task that failed for good
    (its workers lost too often, or a worker that refused) comes back ``failed`` with why.
    """
    if not jobs:
        return
    with connect(address) as client:
        from distributed import as_completed

        shared = {lab: client.scatter(b, broadcast=True, hash=False) for lab, b in bundles.items()}
        futures = {}
        for job in jobs:
            task = _task(job)
            digest = hashlib.sha256(task.notebook).hexdigest()[:12]
            key = f"grade-{job.student}-{job.lab}-{digest}-{os.urandom(4).hex()}"
            futures[
                client.submit(grade_task, task, shared[job.lab], grader, key=key, pure=False)
            ] = job
        seen: set[tuple[str, str]] = set()
        for future in as_completed(futures):
            job = futures[future]
            if (job.student, job.lab) in seen:  # never twice, whatever the scheduler did
                continue
            seen.add((job.student, job.lab))
            try:
                payload = future.result()
            except Exception as exc:
                why = f"{type(exc).__name__}: {exc}"
                if type(exc).__name__ == "KilledWorker":
                    why += " (its workers were lost: grade again with --resume)"
                yield grader.result(job.student, job.lab, "failed", error=why), {}
                continue
            yield _received(payload, staging, grader)
            future.release()


def _received(payload: dict[str, Any], staging: Path, grader: Grader) -> tuple[Any, dict[str, str]]:
    """A worker's plain data as a result and files in ``staging`` (what a local run has)."""
    result = grader.result(**payload["result"])
    folder = Path(tempfile.mkdtemp(prefix=f"{result.student}-{result.lab[:2]}-", dir=staging))
    files = {"work": str(folder)}
    for kind, text in payload.get("files", {}).items():
        name = f"{result.lab}.ipynb" if kind == "autograded" else f"{result.lab}.html"
        path = folder / kind / name
        path.parent.mkdir(parents=True)
        path.write_text(text, encoding="utf-8")
        files[kind] = str(path)
    return result, files
