"""Run profiles: how much compute a notebook's training cells may spend.

Two profiles exist (see docs/curriculum.md, "Profiles"):

* ``grading``: CPU, at most about a minute of training per lab; the instructor's
  grading command selects it so hundreds of submissions autograde quickly.
* ``full``: the student's own run on a Colab GPU or a laptop, a few minutes.

The profile is read from the ``TRANSFORMER_LAB_PROFILE`` environment variable so
that the grader can set it for every notebook it executes without editing them.
Unset, it is ``full``: a student's laptop without a GPU runs the full profile too, and each
lab states how long that takes on a two-core CPU.
"""

from __future__ import annotations

import os
from typing import Literal

Profile = Literal["grading", "full"]
PROFILE_ENV = "TRANSFORMER_LAB_PROFILE"
PROFILES: tuple[Profile, ...] = ("grading", "full")


def current_profile() -> Profile:
    """Return the active profile (``grading`` or ``full``).

    Raises:
        ValueError: if ``TRANSFORMER_LAB_PROFILE`` holds anything else.
    """
    value = os.environ.get(PROFILE_ENV, "").strip().lower()
    if not value:
        return "full"
    if value not in PROFILES:
        raise ValueError(f"{PROFILE_ENV}={value!r} is not one of {PROFILES}")
    return value  # type: ignore[return-value]


def is_grading() -> bool:
    """True when training cells must stay within the grading budget."""
    return current_profile() == "grading"
