"""What every lab's check tests share: run a set of checks on one answer, read the verdicts.

``tests/test_labNN_checks.py`` keeps a catalogue of typical mistakes and of correct variants; each
entry is run through the lab's checks with :func:`run_checks`, and :func:`assert_fails` states which
checks must fail and which words their messages must hold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def run_checks(checks: Mapping[str, Callable[[Any], Any]], answer: Any) -> dict[str, str]:
    """Check name -> ``""`` when the check passes on ``answer``, else its message."""
    out = {}
    for name, check in checks.items():
        try:
            check(answer)
            out[name] = ""
        except AssertionError as exc:
            out[name] = str(exc)
    return out


def assert_fails(
    checks: Mapping[str, Callable[[Any], Any]],
    answer: Any,
    failing: list[str],
    words: str | Mapping[str, str],
    *,
    generic: tuple[str, ...] = (),
    ignore_case: bool = False,
) -> None:
    """``answer`` fails exactly the ``failing`` checks, each message holding ``words``.

    Args:
        checks: the checks to run, by name.
        answer: the (wrong) answer.
        failing: the names of the checks that must fail; all others must pass.
        words: what each failing check's message must say, or per check name (one mistake may
            show differently in float32 and float16).
        generic: failing checks that cannot name this mistake (their words are not checked).
        ignore_case: compare ``words`` case-insensitively.
    """
    found = run_checks(checks, answer)
    assert sorted(n for n, msg in found.items() if msg) == sorted(failing), {
        n: m[:300] for n, m in found.items()
    }
    for name in failing:
        if name in generic:
            continue
        expected = words if isinstance(words, str) else words[name]
        message = found[name]
        if ignore_case:
            expected, message = expected.lower(), message.lower()
        assert expected in message, (name, found[name])
