"""The commands that run without LightningCLI: ``seq2seq translate`` (:mod:`.translating`),
``seq2seq score`` (:mod:`.scoring`), ``seq2seq average`` (:mod:`.averaging`), ``seq2seq
export`` (:mod:`.exporting`) and ``seq2seq import`` (:mod:`.importing`; ``import`` is a
keyword, so its function is ``import_model``), on the argument parser of :mod:`.parsing`."""

from seq2seq.commands.averaging import average
from seq2seq.commands.exporting import export
from seq2seq.commands.importing import import_model
from seq2seq.commands.scoring import score
from seq2seq.commands.translating import translate

__all__ = ["average", "export", "import_model", "score", "translate"]
