"""Export a checkpoint to deployment engines: CTranslate2 (:mod:`seq2seq.export.ctranslate2`)
and Hugging Face Transformers (:mod:`seq2seq.export.huggingface`).

Both need the ``export`` extra (``pip install -e ".[export]"``: ctranslate2, transformers);
this package imports them only when an export or a CTranslate2 translation runs.
"""

from seq2seq.export.common import MARKER, check_output_folder, read_checkpoint

__all__ = ["MARKER", "check_output_folder", "read_checkpoint"]
