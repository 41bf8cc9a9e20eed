"""``TranslationWriter``: ``predict``'s translations, one per source line, in input order."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter

from seq2seq.evaluation import gather_in_order, write_lines
from seq2seq.files import check_output_file


class TranslationWriter(BasePredictionWriter):
    """Writes one translation per source line, in input order, when ``predict`` ends.

    Under DDP each process translates a disjoint share; the shares are gathered and sorted by
    line number before rank 0 writes the file.

    The file is written through a temporary file beside it and a rename
    (:func:`seq2seq.files.atomic_write`); an ``output_path`` that is a folder, or whose folder
    cannot be written, is refused when ``predict`` starts, before anything is decoded.

    Args:
        output_path: file to write (parent folders are created).
        n_best: with more than 1, write ``line<TAB>score<TAB>text`` rows, ``n_best`` per line
            (set as the module's ``n_best`` when ``predict`` starts). A module that samples
            ``n_samples`` above 1 (``model.decoding.sampling``) gets these rows too, one per
            sample.
    """

    def __init__(self, output_path: str = "predictions.txt", n_best: int = 1) -> None:
        super().__init__(write_interval="epoch")
        self.output_path = Path(output_path)
        self.n_best = n_best

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "predict" and trainer.is_global_zero:
            check_output_file(self.output_path, "TranslationWriter.output_path")

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.n_best = self.n_best  # TranslationModule.n_best: what predict_step returns
        self._started = True

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        started = getattr(self, "_started", False)  # an error before: its message is enough
        if trainer.state.fn == "predict" and trainer.is_global_zero and started:
            print(
                f"seq2seq: predict stopped: nothing is written to {self.output_path}, which is "
                "written whole once every line is translated",
                file=sys.stderr,
            )

    def write_on_epoch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, predictions: Any, batch_indices
    ) -> None:
        if (
            predictions
            and isinstance(predictions[0], list)
            and predictions[0]
            and isinstance(predictions[0][0], list)
        ):
            predictions = [batch for loader in predictions for batch in loader]
        items = [(index, hyps, "") for batch in predictions for index, hyps in batch]
        ordered = gather_in_order(items)
        if trainer.global_rank != 0:
            return
        if self.n_best == 1 and all(len(hyps) == 1 for _, hyps, _ in ordered):
            lines = [hyps[0][0] for _, hyps, _ in ordered]
        else:
            lines = [f"{i}\t{score:.4f}\t{text}" for i, hyps, _ in ordered for text, score in hyps]
        write_lines(self.output_path, lines)
        print(f"wrote {len(ordered)} translations to {self.output_path}")
