"""What a lab notebook calls around the student's code: setup, and "yours or the kit's" for demos.

Every lab's locked setup cell ends with ``session = lab.setup("NN_name")``. One call makes a
notebook behave the same on Colab, on a laptop and in the grader:

* it seeds PyTorch, so the demos and training cells print the same numbers each run;
* it pins the CPU threads (``TRANSFORMER_LAB_THREADS``, default 1 on a CPU): the labs' models
  are small, and on a busy two-core laptop more threads made a training cell 100x slower;
* it picks the device (CUDA when present, except for the labs whose models are too small to
  gain from it, :data:`CPU_LABS`; ``TRANSFORMER_LAB_DEVICE`` overrides), the training precision
  the CLI would pick (``bf16-mixed`` on recent GPUs, ``16-mixed`` on a T4, ``32-true`` on CPUs)
  and the run profile (``full`` unless the grader asks for ``grading``), and prints them on one
  line.

Earlier labs' answers carry forward (:mod:`transformer_lab.answers`): :func:`setup` fills every
locked kit answer of an earlier lab with the student's saved one, or a PyTorch stand-in, and
says so in a line. Demo cells draw their figures with the student's own function once its
visible check passes: :func:`yours_or_kit` runs that check quietly, saves the student's answer
for later labs and returns it; otherwise it returns, in this order, the student's saved answer,
the kit's (once its lab is closed) or a PyTorch stand-in, with a line saying which one is used.

A failed check (an ``AssertionError``) or a locked answer shows its message and the student's
own lines, not pages of the kit's frames (:func:`_short_errors`). A demo that needs an earlier
lab's answer which nothing fills (no saved answer, no stand-in) runs its body inside
:func:`unless_locked`: the locked answer ends that body with one line naming the lab, the cell
does not fail (Run All goes on), and the names the later cells read are set before it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "CPU_LABS",
    "DEVICE_ENV",
    "THREADS_ENV",
    "Session",
    "choose_device",
    "setup",
    "unless_locked",
    "yours_or_kit",
]

THREADS_ENV = "TRANSFORMER_LAB_THREADS"
DEVICE_ENV = "TRANSFORMER_LAB_DEVICE"
# Labs whose models (widths 16-64, a few thousand tokens a step) are too small to gain from a
# GPU: a training step is a few hundred kernel launches of microseconds of arithmetic each, so
# the GPU waits on the Python that launches them, and the CUDA start-up comes on top. Measured
# in the full profile (benchmarks/RESULTS.md, item 4, issue 39): an H200 took 15.8, 46.0, 66.8,
# 38.0 and 65.4 s for labs 01, 03, 04, 05 and 06, a quiet 2-core CPU 4.1, 13.8, 68.5, 14.6 and
# 35.3 s. Labs 02, 07 and 08 gained from the GPU (8.3 s against 15.9; 30.0 against 34.4; 43.6
# against 233) and use it.
CPU_LABS = frozenset(
    {
        "01_positional_encoding",
        "03_multi_head_attention",
        "04_transformer_block",
        "05_masking",
        "06_decoder_training",
    }
)
_SMALL_NOTE = (
    f"a GPU is present, but this lab's models are too small to gain from it; {DEVICE_ENV}=cuda "
    "uses it"
)
_LAB = re.compile(r"^\d\d_[a-z0-9_]+$")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Session:
    """What :func:`setup` chose for a notebook.

    Attributes:
        lab: the lab's folder name, e.g. ``"01_positional_encoding"``.
        device: where the notebook's tensors and models go.
        profile: ``"grading"`` (small, CPU, the grader's) or ``"full"``.
        precision: the Lightning precision for training cells (``"32-true"``, ``"bf16-mixed"``...).
        threads: CPU threads PyTorch uses.
        runs: folder for this lab's training logs and checkpoints (beside the notebook).
    """

    lab: str
    device: Any
    profile: str
    precision: str
    threads: int
    runs: Path

    @property
    def grading(self) -> bool:
        """True in the grading profile (small training budgets)."""
        return self.profile == "grading"


def _threads() -> int:
    value = os.environ.get(THREADS_ENV, "").strip()
    if not value:
        return 1
    try:
        threads = int(value)
    except ValueError:
        threads = 0
    if threads < 1:
        raise ValueError(f"{THREADS_ENV}={value!r} must be a positive whole number of threads")
    return threads


def choose_device(lab: str) -> tuple[str, str | None]:
    """The lab's device, ``"cuda"`` or ``"cpu"``, and a note saying why when it is not the GPU.

    ``TRANSFORMER_LAB_DEVICE`` (``cuda`` or ``cpu``) decides when set; otherwise CUDA when
    present, except for the labs in :data:`CPU_LABS`, whose models train faster on the CPU.

    Raises:
        ValueError: ``TRANSFORMER_LAB_DEVICE`` names another device, or ``cuda`` without one.
    """
    from transformer_lab.training.devices import choose_accelerator

    wanted = os.environ.get(DEVICE_ENV, "").strip().lower()
    if wanted not in ("", "cuda", "cpu"):
        raise ValueError(f"{DEVICE_ENV}={wanted!r} is not one of 'cuda', 'cpu'")
    present = choose_accelerator() == "cuda"
    if wanted == "cuda" and not present:
        raise ValueError(f"{DEVICE_ENV}=cuda, but PyTorch sees no CUDA GPU on this machine")
    if wanted:
        return wanted, None
    if present and lab in CPU_LABS:
        return "cpu", _SMALL_NOTE
    return ("cuda" if present else "cpu"), None


def setup(lab: str, *, seed: int = 0) -> Session:
    """Prepare a lab notebook: seed, threads, device, precision and profile; print them.

    Args:
        lab: the lab's folder name (``NN_name``).
        seed: seed of PyTorch's global random generator.

    Returns:
        The :class:`Session`.

    Raises:
        ValueError: ``lab`` is not a lab name, or ``TRANSFORMER_LAB_THREADS`` is not a positive
            integer, or ``TRANSFORMER_LAB_PROFILE`` is not a profile, or
            ``TRANSFORMER_LAB_DEVICE`` is not a device of this machine (:func:`choose_device`).
    """
    if not _LAB.match(lab):
        raise ValueError(f"lab={lab!r} is not a lab folder name such as '01_positional_encoding'")
    import torch

    import transformer_lab
    from transformer_lab.profiles import current_profile
    from transformer_lab.training.devices import choose_precision

    threads = _threads()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    accelerator, note = choose_device(lab)
    device = torch.device(accelerator)
    precision = choose_precision(accelerator)
    if accelerator == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls on tensor cores
        torch.backends.cudnn.allow_tf32 = True
    profile = current_profile()
    _quiet()
    _inline_figures()
    _short_errors()
    if "lightning" in sys.modules:  # the labs that train with Lightning import it above
        _one_line_progress()
    session = Session(lab, device, profile, precision, threads, Path("runs") / lab)
    where = f"{accelerator}, {threads} thread{'s' * (threads != 1)}"
    where += f" ({note})" if note else ""
    print(
        f"transformer_lab {transformer_lab.__version__} | lab {lab[:2]} | profile: {profile} | "
        f"device: {where} | precision: {precision}"
    )
    import inspect

    from transformer_lab import answers

    caller = inspect.currentframe().f_back  # type: ignore[union-attr]
    notebook = [caller.f_globals] if caller is not None else []
    for line in answers.summary(answers.install(before=lab, namespaces=notebook)):
        print(line)
    return session


def _quiet() -> None:
    """Silence warnings a student cannot act on (deprecations inside libraries); show the kit's
    own warnings (lab 08's offline corpus) as their text alone."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning, module="lightning")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    _plain_kit_warnings()


def _plain_kit_warnings() -> None:
    """A warning class of the kit's (``CorpusFallbackWarning``) is shown as ``Warning: <text>``:
    no site-packages path, no ``warnings.warn(...)`` source line, which say nothing to a student.
    Every other warning keeps Python's format."""
    previous = warnings.formatwarning
    if getattr(previous, "kit_plain", False):
        return

    def formatwarning(
        message: Warning | str, category: type[Warning], filename: str, lineno: int,
        line: str | None = None,
    ) -> str:  # fmt: skip
        if (getattr(category, "__module__", "") or "").startswith("transformer_lab."):
            return f"Warning: {message}\n"
        return previous(message, category, filename, lineno, line)

    formatwarning.kit_plain = True  # type: ignore[attr-defined]
    warnings.formatwarning = formatwarning


def _inline_figures() -> None:
    """In a notebook, show matplotlib figures (``plt`` and returned ``Figure`` objects) inline.

    A kernel that started with another backend (the grader's is headless) would otherwise show
    nothing, and the feedback would lose the figures the written questions refer to.
    """
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "kernel"):
        shell.run_line_magic("matplotlib", "inline")


def _one_line_progress() -> None:
    """Lightning's progress in a notebook: one line of text, updated in place.

    * The default bar is Lightning's TQDM one, not its Rich one (the default wherever ``rich``
      is installed, as on Colab): Rich draws into an ipywidgets ``Output``, which shows nothing
      without ipywidgets, in a saved notebook or in its feedback.
    * The training (and test, predict) bar is tqdm's text bar even where ipywidgets is
      installed: a ``\\r``-updated line, which JupyterLab, Colab and a terminal all draw in place,
      redrawn at most twice a second (Lightning refreshes it at every step).
    * Validation runs and the sanity check get no bar: without ipywidgets each left a bar of
      its own, pages of them in a long fit.
    """
    try:
        from lightning.pytorch.callbacks import TQDMProgressBar
        from lightning.pytorch.callbacks.progress import tqdm_progress
        from lightning.pytorch.trainer.connectors import callback_connector
        from tqdm.std import tqdm as text_tqdm
    except ImportError:
        return

    callback_connector._RICH_AVAILABLE = False  # Trainer(enable_progress_bar=True) -> TQDM

    class LineTqdm(text_tqdm):
        """tqdm's text bar with Lightning's number format, redrawn at most every 0.5 s."""

        format_num = staticmethod(tqdm_progress.Tqdm.format_num)

        def refresh(self, nolock: bool = False, lock_args: Any = None) -> Any:
            now = self._time()
            drawn = getattr(self, "_drawn_at", None)
            if drawn is not None and now - drawn < self.mininterval and self.n != self.total:
                return None
            self._drawn_at = now
            return super().refresh(nolock=nolock, lock_args=lock_args)

    def line(description: Callable[[Any], str]) -> Callable[[Any], Any]:
        def init(self: Any) -> Any:
            return LineTqdm(
                desc=description(self),
                position=2 * self.process_position,
                disable=self.is_disabled,
                leave=True,
                dynamic_ncols=True,
                file=sys.stdout,
                smoothing=0,
                mininterval=0.5,
                bar_format=self.BAR_FORMAT,
            )

        return init

    def no_bar(self: Any) -> Any:
        return tqdm_progress.Tqdm(disable=True)

    TQDMProgressBar.init_train_tqdm = line(lambda bar: bar.train_description)  # type: ignore[method-assign]
    TQDMProgressBar.init_test_tqdm = line(lambda bar: "Testing")  # type: ignore[method-assign]
    TQDMProgressBar.init_predict_tqdm = line(lambda bar: bar.predict_description)  # type: ignore[method-assign]
    TQDMProgressBar.init_validation_tqdm = no_bar  # type: ignore[method-assign]
    TQDMProgressBar.init_sanity_tqdm = no_bar  # type: ignore[method-assign]


def _short_errors() -> None:
    """In IPython, show a failed check or a locked answer as its message and the notebook's own
    lines (at most three), not the kit's frames. The cell still fails (nbgrader sees the error)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    from transformer_lab.graded import LockedAnswerError

    def handler(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None):
        import traceback

        package = str(Path(__file__).resolve().parent)
        own = [
            f"  {Path(f.filename).name} line {f.lineno}: {(f.line or '').strip()}"
            for f in traceback.extract_tb(tb)
            if not str(Path(f.filename).resolve()).startswith(package)
            and "site-packages" not in f.filename
        ]
        lines = [*own[-3:], f"{etype.__name__}: {value}"]
        value._render_traceback_ = lambda: lines  # type: ignore[attr-defined]
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return lines

    shell.set_custom_exc((AssertionError, LockedAnswerError), handler)


@contextlib.contextmanager
def unless_locked(what: str) -> Iterator[None]:
    """Run a demo's block; an earlier lab's locked answer that it needs ends the block with one
    line saying so, instead of an error that would stop *Run All*.

    Args:
        what: what the block shows, for the line (``"the sampled texts"``).

    Example::

        with lab.unless_locked("the sampled texts"):
            print(write(model, prompt_ids, 40, temperature=0.8))
    """
    from transformer_lab.graded import LockedAnswerError, locked_line

    try:
        yield
    except LockedAnswerError as exc:
        print(locked_line(f"Skipped {what}", str(exc)))


def yours_or_kit(
    yours: F, *, check: Callable[[Any], None], kit: str | None, quiet: bool = False
) -> F:
    """The student's function if its visible check passes (saved for later labs), else the best
    replacement, saying which.

    Replacements, in order: the student's saved answer (:mod:`transformer_lab.answers`), the
    kit's version once its lab is closed, a PyTorch stand-in
    (:data:`transformer_lab.standins.STAND_INS`).

    Args:
        yours: the student's function or class from the notebook.
        check: its visible check, e.g. ``lab01.check_sinusoidal_encoding``.
        kit: dotted name of the kit's version (used only when the student's fails); ``None``
            where the kit has no version with the same interface.
        quiet: print nothing when the student's function is used.

    Returns:
        ``yours``, or its replacement.

    Raises:
        RuntimeError: the student's version does not pass its check yet and nothing can
            replace it: fix the exercise first.
    """
    import inspect

    from transformer_lab import answers

    name = getattr(yours, "__name__", (kit or "your code").rpartition(".")[2])
    try:
        check(yours)
    except AssertionError as exc:
        found = _replacement(name, kit)
        if found is None:
            reason = str(exc).split("\n")[0]
            raise RuntimeError(
                f"This cell needs your {name}, which does not pass its visible check yet "
                f"({reason}). Fix it above and run this cell again."
            ) from None
        theirs, what = found
        print(f"Your {name} does not pass its visible check yet, so this uses {what}.")
        return theirs  # type: ignore[return-value]
    answer = next((a for a in answers.ANSWERS if a.name == name), None)
    if answer is not None:
        caller = inspect.currentframe().f_back  # type: ignore[union-attr]
        answers.save(answer.lab, name, yours, caller.f_globals if caller else {})
    if not quiet:
        print(f"(This uses your {name}.)")
    return yours


def _replacement(name: str, kit: str | None) -> tuple[Any, str] | None:
    """``(object, what it is)`` to use in place of the student's failing ``name``, or None."""
    from transformer_lab import answers, standins
    from transformer_lab.graded import is_locked

    answer = next((a for a in answers.ANSWERS if a.name == name), None)
    if answer is not None:
        saved = answers.load_saved(answer.lab).get(name)
        if saved is not None:
            return saved, f"your saved {name} from {answers.answers_folder()}"
    theirs = None if kit is None else answers.kit_object(kit)
    if theirs is not None and not is_locked(theirs):
        return theirs, "the kit's version"
    stand_in = None if kit is None else standins.STAND_INS.get(kit)
    if stand_in is not None:
        return stand_in, "a stand-in built from PyTorch's own modules"
    return None
