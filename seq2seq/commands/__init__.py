"""The commands that run without LightningCLI: ``seq2seq translate`` (:mod:`.translating`),
``seq2seq average`` (:mod:`.averaging`) and ``seq2seq export`` (:mod:`.exporting`), on the
argument parser of :mod:`.parsing`."""

from seq2seq.commands.averaging import average
from seq2seq.commands.exporting import export
from seq2seq.commands.translating import translate

__all__ = ["average", "export", "translate"]
