"""The ``transformer-lab`` console script.

Subcommands:

* ``fit`` / ``validate`` / ``test`` / ``predict``: Lightning's own CLI
  (``LightningCLI``) over the kit's modules and data, configured by YAML files in
  ``configs/`` (``transformer-lab fit --config configs/reverse.yaml``).
* ``generate``: decode from a trained checkpoint.
* ``info``: device, precision and library versions.
* ``labs``: the instructor's nbgrader pipeline (``build``, ``check``, ``grade``).

Each subcommand lives in its own module and is imported only when used, so that
``transformer-lab info`` does not pay for nbgrader and ``labs`` does not pay for Lightning.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the subcommand named by the first argument."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else ""
    if command == "labs":
        from transformer_lab.grading.cli import main as labs_main

        return labs_main(args[1:])
    if command == "info":
        from transformer_lab.training.devices import print_info

        print_info()
        return 0
    return _run_on_answers(args)


def _run_on_answers(args: list[str]) -> int:
    """``generate`` or Lightning's CLI, with every locked answer filled first: the student's saved
    one, or for ``fit`` a PyTorch stand-in (:mod:`transformer_lab.answers`), said in one line;
    one still missing ends the command with status 2 and one line naming its lab."""
    from transformer_lab.answers import install, whose_code
    from transformer_lab.graded import (
        LockedAnswerError,
        LockedAnswerExit,
        exit_on_locked,
        locked_line,
    )

    name = (
        f"transformer-lab {args[0]}" if args and not args[0].startswith("-") else "transformer-lab"
    )
    # A checkpoint given to generate was trained on the kit's own layers: no stand-ins there.
    said = whose_code(install(stand_ins=args[:1] != ["generate"]))
    if said and args[:1] in (["fit"], ["generate"], ["validate"], ["test"], ["predict"]):
        print(f"{name} {said}.", file=sys.stderr)  # a student package: whose code this runs
    try:
        with exit_on_locked(name):
            if args[:1] == ["generate"]:
                from transformer_lab.training.generate_cli import main as generate_main

                return generate_main(args[1:])
            from transformer_lab.training.cli import run_lightning_cli

            return run_lightning_cli(args)
    except LockedAnswerExit as stop:
        return int(stop.code)
    except LockedAnswerError as error:  # raised while the command ran (a locked training hook)
        print(locked_line(name, str(error)), file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
