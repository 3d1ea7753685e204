"""Restore the nbgrader metadata of a submission that went through Colab (or a careless editor).

nbgrader grades a notebook by the ``metadata.nbgrader`` of its cells: which cells are answers,
which are tests (and their points), which are locked. A round trip through Colab can lose
that metadata, duplicate it (a copied cell keeps its ``grade_id``) or extend it (Colab adds
``id``/``colab``/``executionInfo`` keys and may drop cell ids). This module matches every
cell of the release against the submission and rebuilds the metadata from the release:

1. by ``grade_id`` where it survived (duplicates: the copy that still looks like the
   release cell, or holds the student's work, keeps it; the others lose it);
2. by identical content (prose, locked and test cells the student did not touch), keeping
   the order of the cells;
3. by position and similarity inside the gap between two matched cells (answer cells the
   student filled in, test cells the student edited).

Test cells that were edited keep their (wrong) text here: nbgrader's ``OverwriteCells``
restores the source of locked cells from the gradebook, and ``add_missing_cells`` puts
deleted test cells back. A notebook whose graded cells cannot be matched (for instance
another lab's notebook) is reported as unmatched and must not be graded silently.

The caller keeps the student's file untouched: :func:`repair_notebook` works on a copy.

The work is bounded in what the student chose (it runs in the grader): at most
:data:`MAX_CELLS` cells are matched (more: unmatched, with the reason); identical content is
found through an index, not by comparing every pair; and similarity, the only costly
comparison (``difflib``, quadratic in the texts), reads at most :data:`SIMILAR_CHARS`
characters of each text, for at most :data:`CANDIDATES` cells of a gap, chosen by a cheap
upper bound of it (character counts). The work grows linearly with the submission's cells
and characters; :attr:`_Match.work` counts it, for the tests.

Reference: nbgrader's metadata format (nbgrader/nbgraderformat/v3.py) and
``OverwriteCells``/``DeduplicateIds`` preprocessors, which this complements.
"""

from __future__ import annotations

import collections
import copy
import difflib
from dataclasses import dataclass, field

import nbformat
from nbformat import NotebookNode

__all__ = ["RepairResult", "repair_notebook"]

# Cell-metadata keys added by Colab (and Jupyter front ends) that carry nothing for grading.
_EDITOR_KEYS = ("id", "colab", "colab_type", "executionInfo", "outputId", "cellView")
# Fraction of the release's answer cells that must be found for the notebook to count as matched.
_MIN_MATCHED = 0.5
#: Most cells a submission may have to be matched (a lab's notebook has a few hundred at most).
MAX_CELLS = 2000
#: Characters of each text that a similarity reads.
SIMILAR_CHARS = 1000
#: Most cells of a gap whose similarity to a release cell is computed.
CANDIDATES = 8


@dataclass
class RepairResult:
    """What :func:`repair_notebook` found and did.

    Attributes:
        notebook: the repaired copy (``None`` when the submission could not be matched).
        actions: one line per repair, in words an instructor can check.
        matched: graded release cells found in the submission.
        expected: graded cells in the release.
        reason: why the submission is unmatched (empty when matched).
    """

    notebook: NotebookNode | None
    actions: list[str] = field(default_factory=list)
    matched: int = 0
    expected: int = 0
    reason: str = ""

    @property
    def ok(self) -> bool:
        """True when the notebook was matched and can be graded."""
        return self.notebook is not None


def _norm(source: str | list[str]) -> str:
    text = "".join(source) if isinstance(source, list) else str(source)
    return "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").strip().split("\n"))


def _without_hidden_tests(text: str) -> str:
    """``text`` without its hidden-test regions (a solution notebook submitted as is)."""
    kept, hidden = [], False
    for line in text.split("\n"):
        if "BEGIN HIDDEN TESTS" in line:
            hidden = True
        elif "END HIDDEN TESTS" in line:
            hidden = False
        elif not hidden:
            kept.append(line)
    return "\n".join(kept).strip()


def _nbgrader(cell: NotebookNode) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader")
    return meta if isinstance(meta, dict) else {}


def _kind(meta: dict) -> str:
    if meta.get("grade") and meta.get("solution"):
        return "written answer"
    if meta.get("grade"):
        return "test cell"
    if meta.get("solution"):
        return "answer cell"
    if meta.get("task"):
        return "task cell"
    return "read-only cell"


def _similarity(a: str, b: str) -> float:
    """difflib's ratio of the first :data:`SIMILAR_CHARS` characters of each text."""
    a, b = a[:SIMILAR_CHARS], b[:SIMILAR_CHARS]
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def _similarity_bound(a: collections.Counter, b: collections.Counter, size: int) -> float:
    """An upper bound of :func:`_similarity` from the texts' character counts (difflib's
    ``quick_ratio``); ``size`` is both texts' lengths together."""
    return 2.0 * sum((a & b).values()) / size if size else 1.0


def _counts(text: str) -> collections.Counter:
    return collections.Counter(text[:SIMILAR_CHARS])


@dataclass
class _Match:
    """The matching state: release cell index -> submission cell index, and how."""

    sub_cells: list[NotebookNode]
    rel_cells: list[NotebookNode]
    graded: list[int]  # release cells with a grade id
    sub_src: list[str]
    rel_src: list[str]
    sub_cmp: list[str]  # submission sources without hidden-test regions
    match: dict[int, int] = field(default_factory=dict)
    how: dict[int, str] = field(default_factory=dict)
    taken: set[int] = field(default_factory=set)
    duplicated: set[str] = field(default_factory=set)  # grade ids found in several cells
    counts: dict[int, collections.Counter] = field(default_factory=dict)  # see _candidates
    #: Steps taken (a cell looked at, a similarity computed): the tests' measure of the cost.
    work: int = 0

    def take(self, r: int, s: int, how: str) -> None:
        self.match[r], self.how[r] = s, how
        self.taken.add(s)

    def bounds(self, r: int) -> tuple[int, int]:
        """Submission indices of the matched neighbours of release cell ``r``."""
        lo = max((s for rr, s in self.match.items() if rr < r), default=-1)
        hi = min((s for rr, s in self.match.items() if rr > r), default=len(self.sub_cells))
        return lo, hi


def _match_by_grade_id(m: _Match, actions: list[str]) -> None:
    """Step 1: cells whose grade id survived; of duplicates, keep the most plausible copy."""
    by_id: dict[str, list[int]] = {}
    for s, cell in enumerate(m.sub_cells):
        gid = _nbgrader(cell).get("grade_id")
        if isinstance(gid, str):
            by_id.setdefault(gid, []).append(s)
    for r in m.graded:
        gid = m.rel_cells[r].metadata.nbgrader["grade_id"]
        candidates = [s for s in by_id.get(gid, []) if s not in m.taken]
        if not candidates:
            continue
        m.work += len(candidates)
        if len(candidates) > 1:
            m.duplicated.add(gid)
            locked = not _nbgrader(m.rel_cells[r]).get("solution")
            same = [s for s in candidates if m.sub_src[s] == m.rel_src[r]]
            changed = [s for s in candidates if m.sub_src[s] != m.rel_src[r]]
            keep = ((same if locked else changed) or candidates)[0]
            dropped = ", ".join(str(s + 1) for s in candidates if s != keep)
            actions.append(
                f"'{gid}' appeared in {len(candidates)} cells (copied cell?): kept cell "
                f"{keep + 1}, removed the grading metadata of cell(s) {dropped}"
            )
            candidates = [keep]
        m.take(r, candidates[0], "grade_id")


def _match_by_content(m: _Match) -> None:
    """Step 2: identical content, in order (every release cell: prose anchors the gaps).

    The submission's cells are indexed by type and content once, so each release cell looks
    only at the cells that hold its text.
    """
    index: dict[tuple[str, str], list[int]] = {}
    for s, cell in enumerate(m.sub_cells):
        index.setdefault((str(cell.get("cell_type")), m.sub_cmp[s]), []).append(s)
    m.work += len(m.sub_cells)
    for r, cell in enumerate(m.rel_cells):
        if r in m.match or not m.rel_src[r]:
            continue
        lo, hi = m.bounds(r)
        for s in index.get((cell.cell_type, m.rel_src[r]), []):
            m.work += 1
            if lo < s < hi and s not in m.taken:
                m.take(r, s, "content")
                break


def _match_by_position(m: _Match) -> None:
    """Step 3: position and similarity inside the gap between matched neighbours."""
    for r in m.graded:
        if r in m.match:
            continue
        lo, hi = m.bounds(r)
        kind = m.rel_cells[r].cell_type
        gap = [
            s
            for s in range(lo + 1, hi)
            if s not in m.taken and m.sub_cells[s].get("cell_type") == kind
        ]
        m.work += hi - lo
        if not gap:
            continue
        # Release cells of this type still waiting for a partner in the same gap.
        rivals = [
            rr
            for rr in m.graded
            if rr not in m.match and m.bounds(rr) == (lo, hi) and m.rel_cells[rr].cell_type == kind
        ]
        scores = {s: _similarity(m.sub_cmp[s], m.rel_src[r]) for s in _candidates(m, r, gap)}
        m.work += len(gap) + len(scores)
        best = max(scores, key=lambda s: scores[s])
        threshold = 0.3 if _nbgrader(m.rel_cells[r]).get("solution") else 0.5
        if scores[best] >= threshold or (len(gap) == 1 and len(rivals) == 1):
            m.take(r, best, "position")


def _candidates(m: _Match, r: int, gap: list[int]) -> list[int]:
    """The cells of ``gap`` whose similarity to release cell ``r`` is worth computing: all of
    a gap of :data:`CANDIDATES` cells or fewer (any honest notebook), else the
    :data:`CANDIDATES` with the highest upper bound of it, in the gap's order."""
    if len(gap) <= CANDIDATES:
        return gap
    ours = _counts(m.rel_src[r])
    length = min(len(m.rel_src[r]), SIMILAR_CHARS)

    def bound(s: int) -> float:
        if s not in m.counts:
            m.counts[s] = _counts(m.sub_cmp[s])
        size = length + min(len(m.sub_cmp[s]), SIMILAR_CHARS)
        return _similarity_bound(m.counts[s], ours, size)

    best = sorted(gap, key=lambda s: (-bound(s), s))[:CANDIDATES]
    return sorted(best)


def _recognised(m: _Match) -> tuple[int, int]:
    """``(found, needed)``: the release's student cells found in the submission.

    Test cells do not count: nbgrader puts deleted ones back, so a submission whose test
    cells were all deleted is still recognised by its answers and written answers (and, when
    it has none, by its locked cells).
    """
    own = [r for r in m.graded if _nbgrader(m.rel_cells[r]).get("solution")]
    basis = own or [r for r in m.graded if not _nbgrader(m.rel_cells[r]).get("grade")]
    basis = basis or m.graded
    return sum(1 for r in basis if r in m.match), len(basis)


def _describe_change(old: object, new: dict, gid: str, s: int, how: str) -> str | None:
    """A report line for replacing ``old`` metadata by ``new`` (None: nothing worth saying)."""
    derived = ("checksum", "cell_type")  # nbgrader recomputes these itself
    if (
        isinstance(old, dict)
        and not (set(old) - set(new))
        and all(old.get(k) == v for k, v in new.items() if k not in derived)
    ):
        return None
    if not isinstance(old, dict) or not old:
        return (
            f"restored the lost metadata of {_kind(new)} '{gid}' (cell {s + 1}, matched by {how})"
        )
    if old.get("grade_id") == gid:
        detail = []
        extra = sorted(set(old) - set(new))
        changed = sorted(k for k in new if k in old and old[k] != new[k])
        missing = sorted(set(new) - set(old))
        if extra:
            detail.append(f"extra keys {extra}")
        if changed:
            detail.append(f"changed {changed}")
        if missing:
            detail.append(f"missing {missing}")
        return f"reset the metadata of {_kind(new)} '{gid}' ({'; '.join(detail)})"
    return (
        f"replaced the metadata of cell {s + 1} ('{old.get('grade_id')}') by that of "
        f"{_kind(new)} '{gid}' (matched by {how})"
    )


def _rebuild_metadata(m: _Match, actions: list[str]) -> None:
    """Give every matched cell the release's metadata and ids; strip the rest."""
    sub_for = {s: r for r, s in m.match.items()}
    cleaned_editor = 0
    used_ids: set[str] = set()
    for s, cell in enumerate(m.sub_cells):
        meta = cell.setdefault("metadata", {})
        if any(k in meta for k in _EDITOR_KEYS):
            cleaned_editor += 1
            for key in _EDITOR_KEYS:
                meta.pop(key, None)
        r = sub_for.get(s)
        old = meta.get("nbgrader")
        if r is None or not _nbgrader(m.rel_cells[r]):
            if old is not None:
                gid = old.get("grade_id", "?") if isinstance(old, dict) else "?"
                if not (r is None and isinstance(gid, str) and gid in m.duplicated):
                    actions.append(f"removed stray grading metadata ('{gid}') from cell {s + 1}")
                del meta["nbgrader"]
            for key in ("editable", "deletable"):
                meta.pop(key, None)
        else:
            rel_meta = m.rel_cells[r].metadata
            new = copy.deepcopy(dict(rel_meta["nbgrader"]))
            gid = new["grade_id"]
            line = _describe_change(old, new, gid, s, m.how[r])
            if line:
                actions.append(line)
            meta["nbgrader"] = new
            for key in ("editable", "deletable"):
                if key in rel_meta:
                    meta[key] = rel_meta[key]
                else:
                    meta.pop(key, None)
            if cell.get("cell_type") != m.rel_cells[r].cell_type:
                actions.append(f"cell '{gid}' changed type; nbgrader restores it")
            if not new.get("solution") and new.get("grade") and m.sub_cmp[s] != m.rel_src[r]:
                actions.append(
                    f"test cell '{gid}' was edited; the original is restored for grading"
                )
        # Cell ids: keep the release's id for matched cells, make the rest unique.
        rid = m.rel_cells[r].get("id") if r is not None else None
        cid = cell.get("id")
        if rid and rid not in used_ids:
            cell["id"] = rid
        elif not cid or cid in used_ids:
            cell["id"] = f"extra-{s + 1}"
        used_ids.add(cell["id"])
    if cleaned_editor:
        actions.append(f"dropped editor metadata (Colab ids) from {cleaned_editor} cells")


def _report_missing(m: _Match, actions: list[str]) -> None:
    for r in m.graded:
        if r in m.match:
            continue
        meta = m.rel_cells[r].metadata.nbgrader
        if meta.get("grade"):
            actions.append(
                f"{_kind(meta)} '{meta['grade_id']}' is missing; nbgrader puts it back for grading"
            )
        else:
            actions.append(
                f"{_kind(meta)} '{meta['grade_id']}' is missing and could not be matched; "
                "the tests that need it will fail"
            )


def repair_notebook(submitted: NotebookNode, release: NotebookNode) -> RepairResult:
    """Match ``submitted`` against ``release`` and return a copy with the release's metadata.

    Args:
        submitted: the student's notebook (not modified).
        release: the released notebook of the same lab.

    Returns:
        A :class:`RepairResult`; ``result.notebook`` is ``None`` when fewer than half of the
        release's answer cells (the cells a student fills in) could be found.
    """
    cells = submitted.get("cells", [])
    if len(cells) > MAX_CELLS:
        return RepairResult(
            notebook=None,
            reason=f"the notebook has {len(cells)} cells, more than the {MAX_CELLS} the grader "
            "matches against the release: is this the lab's notebook?",
        )
    sub = copy.deepcopy(submitted)
    sub_cells = list(sub.get("cells", []))
    rel_cells = list(release.cells)
    sub_src = [_norm(c.get("source", "")) for c in sub_cells]
    m = _Match(
        sub_cells=sub_cells,
        rel_cells=rel_cells,
        graded=[i for i, c in enumerate(rel_cells) if _nbgrader(c).get("grade_id")],
        sub_src=sub_src,
        rel_src=[_norm(c.source) for c in rel_cells],
        # Compared without hidden tests: the release has none (a solution notebook does).
        sub_cmp=[_without_hidden_tests(x) for x in sub_src],
    )
    result = RepairResult(notebook=None, expected=len(m.graded))
    _match_by_grade_id(m, result.actions)
    _match_by_content(m)
    _match_by_position(m)
    result.matched = sum(1 for r in m.graded if r in m.match)
    found, needed = _recognised(m)
    if not needed or found < _MIN_MATCHED * needed:
        result.reason = (
            f"only {found} of the {needed} answer cells of the release were found: "
            "is this the right lab's notebook?"
        )
        return result
    _rebuild_metadata(m, result.actions)
    _report_missing(m, result.actions)
    sub.nbformat = 4
    sub.nbformat_minor = max(int(sub.get("nbformat_minor", 5)), 5)
    sub.cells = sub_cells
    nbformat.validate(sub)
    result.notebook = sub
    return result
