"""Command line: ``seq2seq fit|validate|test|predict`` (LightningCLI), ``translate``,
``average`` and ``export``.

Examples::

    seq2seq fit  --config configs/multi30k_de_en.yaml --data.data_dir ../shared/data/multi30k
    seq2seq test --config configs/multi30k_de_en.yaml --ckpt_path best
    seq2seq validate --config configs/tiny.yaml --ckpt_path untrained  # a smoke test
    seq2seq translate --ckpt_path model.ckpt < source.de > output.en
    seq2seq average --inputs a.ckpt b.ckpt --output averaged.ckpt

The package holds a module per concern: :mod:`~seq2seq.cli.entry` (``main``, dispatch, exit
statuses), :mod:`~seq2seq.cli.messages` (argument errors and help texts),
:mod:`~seq2seq.cli.parser`, :mod:`~seq2seq.cli.app` (the LightningCLI subclass and its hooks),
:mod:`~seq2seq.cli.checkpoint_args`, :mod:`~seq2seq.cli.run_folder` and
:mod:`~seq2seq.cli.environment`. Importing this package imports no Lightning: the plain
commands start without it; :class:`Seq2SeqCLI` is imported on first use.
"""

from __future__ import annotations

from typing import Any

from seq2seq.cli.entry import cli_main, main, version_line

__all__ = ["Seq2SeqCLI", "cli_main", "main", "version_line"]


def __getattr__(name: str) -> Any:
    if name == "Seq2SeqCLI":
        from seq2seq.cli.app import Seq2SeqCLI

        return Seq2SeqCLI
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
