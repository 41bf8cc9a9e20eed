"""The ``seq2seq`` console script: :func:`seq2seq.cli.main`, with a Ctrl-C that lands while the
command line's libraries (PyTorch, Lightning) are still being imported reported in one line
(exit status 130) instead of an import traceback."""

from __future__ import annotations

import sys


def main() -> int:
    """Imports :mod:`seq2seq.cli` and runs its ``main``.

    Returns:
        ``seq2seq.cli.main``'s exit status; 130 after a Ctrl-C during the import.
    """
    try:
        from seq2seq.cli import main as cli_main
    except KeyboardInterrupt:
        print("seq2seq: interrupted", file=sys.stderr)
        return 130
    return cli_main()


if __name__ == "__main__":
    raise SystemExit(main())
