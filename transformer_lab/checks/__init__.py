"""Self-checks the lab notebooks call, one module per lab (``labNN.py``).

Each ``check_<name>(fn)`` runs a student's graded function on small worked examples and
raises ``AssertionError`` with an actionable message when something is off; the
``hidden_check_<name>(fn, seed=...)`` variants (called from nbgrader's hidden test cells)
compare against an independent oracle on seeded random inputs and refuse shortcuts through
the package's own implementation. Shared helpers live in :mod:`transformer_lab.checks._common`.

Modules are imported by the notebooks as ``from transformer_lab.checks import lab01``;
nothing is imported here so that a lab pays only for its own checks.
"""
