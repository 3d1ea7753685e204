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

Reference: nbgrader's metadata format (nbgrader/nbgraderformat/v3.py) and
``OverwriteCells``/``DeduplicateIds`` preprocessors, which this complements.
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass, field

import nbformat
from nbformat import NotebookNode

__all__ = ["RepairResult", "repair_notebook"]

# Cell-metadata keys added by Colab (and Jupyter front ends) that carry nothing for grading.
_EDITOR_KEYS = ("id", "colab", "colab_type", "executionInfo", "outputId", "cellView")
# Fraction of the release's graded cells that must be found for the notebook to count as matched.
_MIN_MATCHED = 0.5


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
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def repair_notebook(submitted: NotebookNode, release: NotebookNode) -> RepairResult:
    """Match ``submitted`` against ``release`` and return a copy with the release's metadata.

    Args:
        submitted: the student's notebook (not modified).
        release: the released notebook of the same lab.

    Returns:
        A :class:`RepairResult`; ``result.notebook`` is ``None`` when fewer than half of the
        release's graded cells could be found.
    """
    sub = copy.deepcopy(submitted)
    sub_cells = list(sub.get("cells", []))
    rel_cells = list(release.cells)
    graded = [i for i, c in enumerate(rel_cells) if _nbgrader(c).get("grade_id")]
    result = RepairResult(notebook=None, expected=len(graded))
    sub_src = [_norm(c.get("source", "")) for c in sub_cells]
    rel_src = [_norm(c.source) for c in rel_cells]
    # Compared without hidden tests: the release has none (a solution notebook does).
    sub_cmp = [_without_hidden_tests(x) for x in sub_src]
    match: dict[int, int] = {}  # release index -> submission index
    how: dict[int, str] = {}
    taken: set[int] = set()

    def bounds(r: int) -> tuple[int, int]:
        lo = max((s for rr, s in match.items() if rr < r), default=-1)
        hi = min((s for rr, s in match.items() if rr > r), default=len(sub_cells))
        return lo, hi

    # 1. grade_id
    by_id: dict[str, list[int]] = {}
    for s, cell in enumerate(sub_cells):
        gid = _nbgrader(cell).get("grade_id")
        if isinstance(gid, str):
            by_id.setdefault(gid, []).append(s)
    for r in graded:
        gid = rel_cells[r].metadata.nbgrader["grade_id"]
        candidates = [s for s in by_id.get(gid, []) if s not in taken]
        if not candidates:
            continue
        if len(candidates) > 1:
            locked = not _nbgrader(rel_cells[r]).get("solution")
            same = [s for s in candidates if sub_src[s] == rel_src[r]]
            changed = [s for s in candidates if sub_src[s] != rel_src[r]]
            preferred = (same if locked else changed) or candidates
            keep = preferred[0]
            dropped = [s for s in candidates if s != keep]
            result.actions.append(
                f"'{gid}' appeared in {len(candidates)} cells (copied cell?): kept cell "
                f"{keep + 1}, removed the grading metadata of cell(s) "
                f"{', '.join(str(s + 1) for s in dropped)}"
            )
            candidates = [keep]
        match[r] = candidates[0]
        how[r] = "grade_id"
        taken.add(candidates[0])

    # 2. identical content, in order (all release cells: prose anchors the gaps)
    for r, cell in enumerate(rel_cells):
        if r in match or not rel_src[r]:
            continue
        lo, hi = bounds(r)
        for s in range(lo + 1, hi):
            if (
                s not in taken
                and sub_cells[s].get("cell_type") == cell.cell_type
                and sub_cmp[s] == rel_src[r]
            ):
                match[r], how[r] = s, "content"
                taken.add(s)
                break

    # 3. position and similarity within the gap between matched neighbours
    for r in graded:
        if r in match:
            continue
        meta = _nbgrader(rel_cells[r])
        lo, hi = bounds(r)
        gap = [
            s
            for s in range(lo + 1, hi)
            if s not in taken and sub_cells[s].get("cell_type") == rel_cells[r].cell_type
        ]
        if not gap:
            continue
        # Release cells of this type still waiting for a partner in the same gap.
        rivals = [
            rr
            for rr in graded
            if rr not in match
            and bounds(rr) == (lo, hi)
            and rel_cells[rr].cell_type == rel_cells[r].cell_type
        ]
        one_to_one = len(gap) == 1 and len(rivals) == 1
        scores = {s: _similarity(sub_cmp[s], rel_src[r]) for s in gap}
        best = max(gap, key=lambda s: scores[s])
        threshold = 0.3 if meta.get("solution") else 0.5
        if scores[best] >= threshold or one_to_one:
            match[r], how[r] = best, "position"
            taken.add(best)

    result.matched = sum(1 for r in graded if r in match)
    if not graded or result.matched < _MIN_MATCHED * len(graded):
        result.reason = (
            f"only {result.matched} of the {len(graded)} graded cells of the release were found: "
            "is this the right lab's notebook?"
        )
        return result

    # Rebuild the metadata.
    sub_for = {s: r for r, s in match.items()}
    cleaned_editor = 0
    used_ids: set[str] = set()
    for s, cell in enumerate(sub_cells):
        meta = cell.setdefault("metadata", {})
        if any(k in meta for k in _EDITOR_KEYS):
            cleaned_editor += 1
            for key in _EDITOR_KEYS:
                meta.pop(key, None)
        r = sub_for.get(s)
        old = meta.get("nbgrader")
        if r is None or not _nbgrader(rel_cells[r]):
            if old is not None:
                gid = old.get("grade_id", "?") if isinstance(old, dict) else "?"
                if not (r is None and any(f"'{gid}' appeared" in a for a in result.actions)):
                    result.actions.append(
                        f"removed stray grading metadata ('{gid}') from cell {s + 1}"
                    )
                del meta["nbgrader"]
            for key in ("editable", "deletable"):
                meta.pop(key, None)
        else:
            rel_meta = rel_cells[r].metadata
            new = copy.deepcopy(dict(rel_meta["nbgrader"]))
            gid = new["grade_id"]
            # nbgrader recomputes checksums and cell types itself: not worth a report line.
            derived = ("checksum", "cell_type")
            same = isinstance(old, dict) and all(
                old.get(k) == v for k, v in new.items() if k not in derived
            )
            same = same and not (set(old) - set(new))
            if not same:
                if not isinstance(old, dict) or not old:
                    result.actions.append(
                        f"restored the lost metadata of {_kind(new)} '{gid}' "
                        f"(cell {s + 1}, matched by {how[r]})"
                    )
                elif old.get("grade_id") == gid:
                    extra = sorted(set(old) - set(new))
                    changed = sorted(k for k in new if k in old and old[k] != new[k])
                    detail = []
                    if extra:
                        detail.append(f"extra keys {extra}")
                    if changed:
                        detail.append(f"changed {changed}")
                    missing = sorted(set(new) - set(old))
                    if missing:
                        detail.append(f"missing {missing}")
                    result.actions.append(
                        f"reset the metadata of {_kind(new)} '{gid}' ({'; '.join(detail)})"
                    )
                else:
                    result.actions.append(
                        f"replaced the metadata of cell {s + 1} ('{old.get('grade_id')}') by "
                        f"that of {_kind(new)} '{gid}' (matched by {how[r]})"
                    )
            meta["nbgrader"] = new
            for key in ("editable", "deletable"):
                if key in rel_meta:
                    meta[key] = rel_meta[key]
                else:
                    meta.pop(key, None)
            if cell.get("cell_type") != rel_cells[r].cell_type:
                result.actions.append(f"cell '{gid}' changed type; nbgrader restores it")
            edited = sub_cmp[s] != rel_src[r]
            if not new.get("solution") and new.get("grade") and edited:
                result.actions.append(
                    f"test cell '{gid}' was edited; the original is restored for grading"
                )
        # Cell ids: keep the release's id for matched cells, make the rest unique.
        rid = rel_cells[r].get("id") if r is not None else None
        cid = cell.get("id")
        if rid and rid not in used_ids:
            cell["id"] = rid
        elif not cid or cid in used_ids:
            cell["id"] = f"extra-{s + 1}"
        used_ids.add(cell["id"])
    for r in graded:
        if r not in match:
            meta = rel_cells[r].metadata.nbgrader
            kind = _kind(meta)
            if meta.get("grade"):
                result.actions.append(
                    f"{kind} '{meta['grade_id']}' is missing; nbgrader puts it back for grading"
                )
            else:
                result.actions.append(
                    f"{kind} '{meta['grade_id']}' is missing and could not be matched; "
                    "the tests that need it will fail"
                )
    if cleaned_editor:
        result.actions.append(f"dropped editor metadata (Colab ids) from {cleaned_editor} cells")
    sub.nbformat = 4
    sub.nbformat_minor = max(int(sub.get("nbformat_minor", 5)), 5)
    sub.cells = sub_cells
    nbformat.validate(sub)
    result.notebook = sub
    return result
