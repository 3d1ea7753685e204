"""The instructor pipeline behind ``transformer-lab labs build|check|grade`` (wraps nbgrader).

Modules: :mod:`~transformer_lab.grading.course` (paths, config, converters),
:mod:`~transformer_lab.grading.build`, :mod:`~transformer_lab.grading.check`,
:mod:`~transformer_lab.grading.grade`, :mod:`~transformer_lab.grading.repair`,
:mod:`~transformer_lab.grading.cli`. Settings live in ``nbgrader_config.py`` at the repository
root (``solutions/`` is nbgrader's source folder, ``labs/`` its release folder, the cell
timeout, restoring deleted test cells).

Authoring a lab (``NN_name``)
-----------------------------
1. Write the checks first, in ``transformer_lab/checks/labNN.py``: ``check_<name>(fn)`` for the
   visible cells and ``hidden_check_<name>(fn, seed=...)`` for hidden ones, built from
   :mod:`transformer_lab.checks._common` (``call_student``, ``expect_shape``, ``expect_close``,
   ``forbidden``). Messages name the likely mistake. Test them in ``tests/test_labNN*.py``
   against a catalogue of wrong implementations (each must fail the right check with the
   right words) and of correct variants (each must pass everything).
2. Write ``solutions/NN_name/NN_name.ipynb`` programmatically with ``nbformat`` (a throwaway
   script), then treat the notebook as the source of truth. Cell metadata
   (``metadata.nbgrader``, ``schema_version`` 3, unique ``grade_id``):

   - setup cell (first code cell): ``grade: false, solution: false, locked: true``;
   - answer cell: ``grade: false, solution: true, locked: false``, the graded function with
     its body between ``### BEGIN SOLUTION`` and ``### END SOLUTION``;
   - test cell: ``grade: true, solution: false, locked: true, points: n``; visible checks as
     plain calls, hidden ones between ``### BEGIN HIDDEN TESTS`` / ``### END HIDDEN TESTS``;
   - written answer: a markdown cell with ``grade: true, solution: true, points: n`` whose
     whole text (model answer and rubric) is replaced by "YOUR ANSWER HERE" in the release.

   Commit it without outputs.
3. ``transformer-lab labs build NN`` writes ``labs/NN_name/`` (never edit it by hand; a rerun
   is a no-op when nothing changed). Commit both.
4. ``transformer-lab labs check NN`` must print ``ok``: release in sync, no solution or hidden
   test leaked, the solution earns every autograded point without errors, the untouched
   release earns zero (about 10-20 s per lab: it runs both notebooks under nbgrader).

Grading a course
----------------
Keep ``DIR`` outside the repository (or at ``course/`` in it, which git ignores).
Put submissions in ``DIR/submitted/<student>/<lab>/<lab>.ipynb`` (Colab downloads may be
renamed ``<lab> (1).ipynb``; that is handled) and run
``transformer-lab labs grade --course DIR``. The gradebook ``DIR/gradebook.db`` is created on
first use and only ever updated, so grading again (after late submissions, or after a fix
to a lab's tests) is safe. Students' files are never modified: repairs happen in
``DIR/repaired/``. Results: ``DIR/grades.csv``, ``DIR/feedback/<student>/<lab>/*.html``,
``DIR/grading_report.json`` (status, scores and metadata repairs per submission). Written
answers are then graded by hand in nbgrader's formgrader, which reads the same gradebook.

Reference: nbgrader 0.9 documentation, https://nbgrader.readthedocs.io.
"""
