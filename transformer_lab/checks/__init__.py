"""Self-checks the lab notebooks call, one module per lab (``labNN.py``).

Each ``check_<name>(fn)`` runs a student's graded function on small worked examples and
raises ``AssertionError`` with an actionable message when something is off. These are the
*visible* checks: they ship in the student package, Colab included. The hidden checks
(``hidden_check_<name>(fn, seed=...)``, called from nbgrader's hidden test cells, comparing
against an independent oracle on seeded random inputs) are not here: they live in
:mod:`transformer_lab.grading.hidden`, which only the grader has. Shared helpers live in
:mod:`transformer_lab.checks._common`, the stored worked examples in ``checks/fixtures/``, and
what a graded function may not call in :mod:`transformer_lab.judge.bans`.

Modules are imported by the notebooks as ``from transformer_lab.checks import lab01``;
nothing is imported here so that a lab pays only for its own checks.
"""
