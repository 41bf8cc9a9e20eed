"""``seq2seq import``: Hugging Face Transformers folders as seq2seq checkpoints.

:mod:`.huggingface` reads a folder and maps its ``config.json`` to
:class:`~seq2seq.nn.TransformerConfig` fields (refusing in one line what they cannot
represent), :mod:`.weights` maps its weights (the inverse of
:func:`seq2seq.export.huggingface.state_dict`), :mod:`.generation` its decoding settings, and
:mod:`.checkpoint` writes the checkpoint.
"""

from seq2seq.importing.checkpoint import ImportResult, check_replaceable, import_huggingface

__all__ = ["ImportResult", "check_replaceable", "import_huggingface"]
