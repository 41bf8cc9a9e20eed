"""Lightning callbacks: writing predictions in input order; samples, attention heatmaps and the
best score in TensorBoard."""

from __future__ import annotations

import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, Timer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from seq2seq import compat
from seq2seq.data.batching import collate
from seq2seq.evaluation import gather_in_order, write_lines
from seq2seq.files import check_output_file
from seq2seq.nn import greedy_search


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
            (the module must decode that many).
    """

    def __init__(self, output_path: str = "predictions.txt", n_best: int = 1) -> None:
        super().__init__(write_interval="epoch")
        self.output_path = Path(output_path)
        self.n_best = n_best

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "predict" and trainer.is_global_zero:
            check_output_file(self.output_path, "TranslationWriter.output_path")

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.n_best = self.n_best

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
        if self.n_best == 1:
            lines = [hyps[0][0] for _, hyps, _ in ordered]
        else:
            lines = [f"{i}\t{score:.4f}\t{text}" for i, hyps, _ in ordered for text, score in hyps]
        write_lines(self.output_path, lines)
        print(f"wrote {len(ordered)} translations to {self.output_path}")


# ---------------------------------------------------------------------- TensorBoard monitoring
def _tensorboard(trainer: L.Trainer) -> TensorBoardLogger | None:
    """The trainer's first TensorBoardLogger (``None`` without one, or off rank 0)."""
    if not trainer.is_global_zero:
        return None
    return next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)


def _logging_step(trainer: L.Trainer) -> int:
    """The step Lightning logs the values of this moment at (its count of optimizer steps
    finished before the current batch, ``_batches_that_stepped``): during a validation in
    ``fit``, one below ``trainer.global_step``, at which the ``val/*`` scalars go to the
    loggers."""
    return compat.logged_step(trainer)


def _escape_markdown(text: str) -> str:
    """Text safe inside a Markdown table cell (TensorBoard renders text summaries as Markdown)."""
    text = text.replace("\\", "\\\\")
    for char in "|*_`[]<>#":
        text = text.replace(char, "\\" + char)
    return text or " "


def plot_attention(
    weights: torch.Tensor,
    x_labels: list[str],
    y_labels: list[str],
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Draw an attention matrix as a heatmap with the tokens on the axes.

    Args:
        weights: ``(T, S)`` float attention probabilities: row ``t`` attends over ``S`` keys.
        x_labels: ``S`` key tokens (columns), e.g. source pieces.
        y_labels: ``T`` query tokens (rows), e.g. output pieces.
        ax: axes to draw into; ``None`` creates a new figure sized to the matrix.
        title: axes title.

    Returns:
        The figure holding the axes.

    Raises:
        ValueError: if the labels do not match the shape of ``weights``.
    """
    matrix = weights.detach().float().cpu().numpy()
    if matrix.ndim != 2 or matrix.shape != (len(y_labels), len(x_labels)):
        raise ValueError(
            f"weights of shape {tuple(matrix.shape)} do not match {len(y_labels)} row labels "
            f"and {len(x_labels)} column labels"
        )
    if ax is None:
        rows, cols = matrix.shape
        figure = Figure(figsize=(2.0 + 0.28 * cols, 1.5 + 0.28 * rows), layout="constrained")
        ax = figure.subplots()
    image = ax.imshow(matrix, cmap="viridis", vmin=0.0, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(x_labels)), x_labels, rotation=90, fontsize=8)
    ax.set_yticks(range(len(y_labels)), y_labels, fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    ax.figure.colorbar(image, ax=ax, fraction=0.05, pad=0.02)
    return ax.figure


class ValidationSamples(L.Callback):
    """Shows the first validation sentences with their current translation in TensorBoard.

    After each validation (``fit`` or ``validate``), writes a Markdown table (text summary
    ``val/samples``) with the source, the reference and the current hypothesis of the first
    ``n_samples`` lines of the validation set. The hypotheses are the ones validation decoded
    (``TranslationModule.last_hypotheses["val"]``); lines it skipped (``limit_val_batches``)
    are decoded here with the validation beam size.

    Args:
        n_samples: number of sentences shown (lines ``0 .. n_samples - 1``).
    """

    def __init__(self, n_samples: int = 3) -> None:
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        self.n_samples = n_samples

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        val_set = getattr(getattr(trainer, "datamodule", None), "val_set", None)
        decoded = getattr(pl_module, "last_hypotheses", {}).get("val")
        if trainer.sanity_checking or val_set is None or decoded is None:
            return
        examples = [val_set[i] for i in range(min(self.n_samples, len(val_set)))]
        hyps = {index: hyp for index, hyp, _ in decoded}
        missing = [e for e in examples if e["index"] not in hyps]
        if missing:
            hp = pl_module.hparams
            beam = hp.val_beam_size if trainer.state.fn == "fit" else None
            batch = collate(missing, pad_id=pl_module.tokenizer.pad_id)
            batch = {
                k: v.to(pl_module.device) if torch.is_tensor(v) else v for k, v in batch.items()
            }
            for e, n_best in zip(missing, pl_module.translate_batch(batch, beam), strict=True):
                hyps[e["index"]] = n_best[0][0]
        logger = _tensorboard(trainer)
        if logger is None:
            return
        rows = ["| line | source | reference | hypothesis |", "| --- | --- | --- | --- |"]
        for e in examples:
            texts = (e.get("src_text", ""), e.get("ref_text", ""), hyps[e["index"]])
            rows.append("| " + " | ".join([str(e["index"]), *map(_escape_markdown, texts)]) + " |")
        logger.experiment.add_text("val/samples", "\n".join(rows), _logging_step(trainer))


class AttentionHeatmaps(L.Callback):
    """Plots the attention of one fixed validation sentence in TensorBoard at each validation.

    After each validation (``fit`` or ``validate``), the sentence is translated greedily and
    the model is run once more with the hypothesis as target (BOS + hypothesis) through
    :meth:`seq2seq.nn.Transformer.attention_maps`. Each layer's cross-attention, averaged over
    heads, is drawn with source pieces as columns and output pieces (hypothesis + EOS) as rows,
    as image ``val/attention/decoder.{i}.cross``. With ``self_attention`` the encoder and
    decoder self-attention are drawn too (``val/attention/encoder.{i}.self``, ...).

    Every process runs the model (so sharded strategies stay in step); rank 0 plots.

    Args:
        sentence: line number (0-based) of the validation sentence.
        self_attention: also plot the self-attention of every layer.
    """

    def __init__(self, sentence: int = 0, self_attention: bool = False) -> None:
        if sentence < 0:
            raise ValueError(f"sentence must be >= 0, got {sentence}")
        self.sentence = sentence
        self.self_attention = self_attention

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        val_set = getattr(getattr(trainer, "datamodule", None), "val_set", None)
        tokenizer = getattr(pl_module, "tokenizer", None)
        if trainer.sanity_checking or val_set is None or tokenizer is None:
            return
        if self.sentence >= len(val_set):
            raise ValueError(
                f"AttentionHeatmaps.sentence is {self.sentence} but the validation set has "
                f"{len(val_set)} lines"
            )
        maps, src_ids, out_ids = self.attention(pl_module, val_set[self.sentence]["src"])
        logger = _tensorboard(trainer)
        if logger is None:
            return
        src_pieces = tokenizer.id_to_piece(src_ids)
        out_pieces = tokenizer.id_to_piece(out_ids)
        in_pieces = tokenizer.id_to_piece([tokenizer.bos_id, *out_ids[:-1]])
        for name, weights in maps.items():
            kind = name.rsplit(".", 1)[-1]
            if kind == "self" and not self.self_attention:
                continue
            if name.startswith("encoder."):
                x, y = src_pieces, src_pieces
            elif kind == "self":
                x, y = in_pieces, out_pieces
            else:
                x, y = src_pieces, out_pieces
            title = f"{name}, heads averaged, step {trainer.global_step}"
            figure = plot_attention(weights[0].mean(0), x, y, title=title)
            logger.experiment.add_figure(f"val/attention/{name}", figure, _logging_step(trainer))

    @staticmethod
    @torch.no_grad()
    def attention(
        pl_module: L.LightningModule, src_ids: list[int]
    ) -> tuple[dict[str, torch.Tensor], list[int], list[int]]:
        """Greedy translation of one source and the attention maps of the translation.

        Args:
            pl_module: a :class:`~seq2seq.module.TranslationModule` with a tokenizer.
            src_ids: source ids ending with EOS.

        Returns:
            The maps of :meth:`~seq2seq.nn.Transformer.attention_maps` for batch size 1, the
            source ids and the output ids (hypothesis + EOS, cut to ``max_positions``).
        """
        model, tokenizer, hp = pl_module.model, pl_module.tokenizer, pl_module.hparams
        src = torch.tensor([src_ids], dtype=torch.long, device=pl_module.device)
        mask = torch.ones(1, 1, 1, src.size(1), dtype=torch.bool, device=src.device)
        bos, eos = tokenizer.bos_id, tokenizer.eos_id
        hyp = greedy_search(
            model, src, mask, bos, eos, max_len_a=hp.max_len_a, max_len_b=hp.max_len_b, scores=False
        )[0][0]
        out_ids = [*hyp.tokens, eos][: model.max_positions]
        tgt = torch.tensor([[bos, *out_ids[:-1]]], dtype=torch.long, device=src.device)
        return model.attention_maps(src, tgt, mask), list(src_ids), out_ids


class BestScoreHparams(L.Callback):
    """Records the run's hyperparameters with its best validation score (TensorBoard HPARAMS).

    After each validation in ``fit``, the best value of ``monitor`` so far is logged as the
    scalar ``name``, at the step of the validation's own scalars (Lightning's logging step, one
    below ``trainer.global_step``), so both have their points at the same steps; after the
    first one, the hyperparameters Lightning logged at the start (model and data module
    ``__init__`` arguments) are written once more together with ``name`` as their metric, so
    the HPARAMS dashboard can compare runs by it. Create the ``TensorBoardLogger`` with
    ``default_hp_metric: false``, otherwise it also shows a placeholder ``hp_metric`` of -1.

    Args:
        monitor: logged metric to track.
        mode: ``"max"`` or ``"min"``: which values are better.
        name: tag of the best value (the HPARAMS metric).
    """

    def __init__(
        self, monitor: str = "val/bleu", mode: str = "max", name: str = "hp/best_bleu"
    ) -> None:
        if mode not in ("max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        self.monitor, self.mode, self.name = monitor, mode, name
        self.best: float | None = None
        self._hparams_written = False

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._hparams_written = False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        value = trainer.callback_metrics.get(self.monitor)
        if trainer.sanity_checking or trainer.state.fn != "fit" or value is None:
            return
        value = float(value)
        better = max if self.mode == "max" else min
        self.best = value if self.best is None else better(self.best, value)
        logger = _tensorboard(trainer)
        if logger is None:
            return
        metrics, step = {self.name: self.best}, _logging_step(trainer)
        if self._hparams_written:
            logger.log_metrics(metrics, step)
        else:
            params = dict(logger.hparams) or dict(pl_module.hparams_initial)
            logger.log_hyperparams(params, metrics=metrics, step=step)
            self._hparams_written = True

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best = state_dict.get("best")


class LastCheckpoint(L.Callback):
    """Writes ``last.ckpt`` after every validation of ``fit`` and when ``fit`` stops on an
    exception (Ctrl-C, SIGTERM, an error), in the folder of the trainer's ``ModelCheckpoint``.

    Lightning's ``ModelCheckpoint(save_last=True)`` rewrites ``last.ckpt`` only when it also keeps
    a checkpoint (a validation whose score ranks among the best ``save_top_k``), so without this
    callback a run resumed with ``--ckpt_path last`` restarts from its last improvement. The
    file holds the full training state (the ``ModelCheckpoint`` state included, so ``best`` still
    resolves). An interrupted run's state goes to ``last.ckpt`` only, not among the scored
    checkpoints (``ModelCheckpoint(save_on_exception=True)`` would add an unscored file there,
    which ``seq2seq average --last`` would then pick). When training ends after steps that no
    validation followed (``max_steps`` reached between validations), their state is written to
    ``last.ckpt`` too, so the file always holds the final step. Needs a ``ModelCheckpoint`` with
    a ``dirpath``; does nothing otherwise, nor in a ``fast_dev_run`` (which writes no
    checkpoint, as Lightning's own callbacks do there).

    In a single-process run, Ctrl-C (SIGINT) inside a training batch lets that batch finish,
    its optimizer update included, and stops at its end (a second Ctrl-C stops at once): an
    update cut short half-way would leave weights and optimizer state that no step of an
    uninterrupted run has. Outside a batch (e.g. during a validation) Ctrl-C stops at once.
    With gradient accumulation a "batch" here is the whole window of ``accumulate_grad_batches``
    batches of one optimizer step, for Ctrl-C and for Lightning's graceful stop on SIGTERM
    alike: a stop between them would lose the gradients of the window's first batches.
    """

    def __init__(self) -> None:
        self._saved_step: int | None = None  # global step of the last state written
        self._start_step: int | None = None  # global step when this process started training
        self._in_batch = False  # inside a training batch (or an accumulation window)
        self._interrupt_pending = False
        self._sigterm_pending = False  # a SIGTERM inside an accumulation window, held back
        self.stopped_on_ctrl_c = False  # fit stopped at a batch's end after a Ctrl-C
        self._previous_handler: Any = None  # the SIGINT handler replaced in on_train_start

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._in_batch and not self._interrupt_pending:
            self._interrupt_pending = True
            print(
                "Ctrl-C: stopping after the training batch under way (Ctrl-C again to stop now)",
                file=sys.stderr,
                flush=True,
            )
            return
        raise KeyboardInterrupt

    def _restore_sigint(self) -> None:
        if self._previous_handler is not None:
            if signal.getsignal(signal.SIGINT) == self._on_sigint:
                signal.signal(signal.SIGINT, self._previous_handler)
            self._previous_handler = None
        self._in_batch = self._interrupt_pending = self._sigterm_pending = False

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        self._in_batch = True

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        if compat.accumulating(trainer):
            # No optimizer update yet: the batch window goes on. A SIGTERM now would stop with
            # the window's gradients accumulated but not applied, which a resumed run cannot
            # recover (it skips the batches counted as done): Lightning's stop waits for the
            # window's end.
            if compat.sigterm_received(trainer):
                compat.set_sigterm_received(trainer, False)
                self._sigterm_pending = True
            return
        self._in_batch = False
        if self._sigterm_pending:
            self._sigterm_pending = False
            compat.set_sigterm_received(trainer, True)
        if self._interrupt_pending:
            self._interrupt_pending = False
            self.stopped_on_ctrl_c = True
            # Lightning's graceful stop, as for SIGTERM: after this batch's logging (and a
            # validation due here), with the batch counted as done.
            if not compat.set_sigterm_received(trainer, True):
                raise KeyboardInterrupt

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_sigint()
        path = self._path(trainer)
        if path is None or trainer.global_step in (0, self._saved_step):
            return
        self._save(trainer, path)
        checkpoint = trainer.checkpoint_callback
        if getattr(checkpoint, "monitor", None) and not getattr(checkpoint, "best_model_path", ""):
            rank_zero_info(
                f"training ended at step {trainer.global_step} before its first validation: no "
                f"checkpoint is scored by {checkpoint.monitor} yet (--ckpt_path best finds "
                f"none); the training state is in {path}: use --ckpt_path last"
            )

    def _path(self, trainer: L.Trainer) -> Path | None:
        checkpoint = trainer.checkpoint_callback
        if trainer.state.fn != "fit" or trainer.fast_dev_run:
            return None
        if not getattr(checkpoint, "dirpath", None):
            return None
        return Path(checkpoint.dirpath) / "last.ckpt"

    def _save(self, trainer: L.Trainer, path: Path) -> None:
        logged_steps = compat.logged_step(trainer)  # the step Lightning's loggers use
        batches = trainer.fit_loop.epoch_loop.batch_progress.current
        if batches.ready > batches.processed and logged_steps > 0:
            # Stopped inside a batch (Ctrl-C): the resumed run trains that batch again, and
            # Lightning, which adds one to this count when it resumes, would log it (and every
            # later value) one step late.
            compat.set_logged_step(trainer, logged_steps - 1)
        try:
            trainer.save_checkpoint(path, weights_only=False)
        finally:
            compat.set_logged_step(trainer, logged_steps)
        self._saved_step = trainer.global_step

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start_step = trainer.global_step
        if (
            trainer.world_size == 1
            and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler
        ):
            self._previous_handler = signal.signal(signal.SIGINT, self._on_sigint)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = self._path(trainer)
        if path is None or trainer.sanity_checking:
            return
        # Runs before ModelCheckpoint's own hook (Lightning calls checkpoint callbacks last),
        # which overwrites this file with its updated record when it keeps this validation.
        self._save(trainer, path)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore_sigint()
        path = self._path(trainer)
        if path is None or self._start_step is None or trainer.global_step == self._start_step:
            # Nothing trained in this process (e.g. an error while resuming, before the first
            # batch): the checkpoint it started from, or an earlier run's, is worth more.
            return
        self._save(trainer, path)
        cause = "KeyboardInterrupt" if self.stopped_on_ctrl_c else type(exception).__name__
        if self.stopped_on_ctrl_c or isinstance(exception, KeyboardInterrupt | SIGTERMException):
            rank_zero_info(
                f"{cause}: saved the training state at step "
                f"{trainer.global_step} to {path}; resume with --ckpt_path last"
            )
        else:  # an error: resuming before its cause is mended meets it again
            rank_zero_info(
                f"training stopped on an error ({cause}, below); the training state at step "
                f"{trainer.global_step} is saved to {path}: once the cause is mended, resume "
                "with --ckpt_path last"
            )


class TextProgress(L.Callback):
    """One plain line of training progress every ``every_n_steps`` optimizer steps, for a log
    written to a file or a pipe (where a progress bar's redraws would fill it with carriage
    returns; fairseq switches to its ``simple`` log format there in the same way)::

        epoch 3 | step 350 | loss 3.214 | lr 8.93e-04 | tok/s 2,950 | 0:05:12

    ``loss`` is the mean of the ``train/loss`` values (the module's loss per real target token
    of one optimizer step) of the optimizer steps since the previous line (for the first line:
    since this process started training, also in a resumed run), as fairseq's log lines
    average over their interval (one step's value alone swings from step to step); with
    gradient accumulation each optimizer step counts once. ``lr`` is the learning rate of the
    optimizer step just taken (the first parameter group's, read from the optimizer, so it is
    known from the first step of a process, also in a resumed run); ``tok/s`` the real target
    tokens of the batches trained since the previous line (for the first line: since this
    process started training) divided by the wall-clock seconds they took, validations
    excluded, so it never reuses figures of an interrupted run. The time
    (hours:minutes:seconds) is, when the trainer has Lightning's ``Timer`` callback
    (``--trainer.max_time``), its training time of the whole run: the wall-clock time of
    every process of the run, validations included, restored from the checkpoint in a
    resumed run, the time ``max_time`` is checked against; without a ``Timer``, the wall-clock
    time since this process started training. ``seq2seq fit`` adds this callback, with
    ``trainer.log_every_n_steps``, when stdout is not a terminal and no progress bar is asked
    for.

    Args:
        every_n_steps: optimizer steps between lines.
    """

    def __init__(self, every_n_steps: int = 50) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self._start = time.monotonic()
        self._printed: int | None = None
        self._lr: float | None = None  # learning rate of the last optimizer step
        self._tokens = 0  # real target tokens trained since the last line
        self._seconds = 0.0  # training time, in seconds, of those tokens before `_since`
        self._since: float | None = None  # when the clock last started; None while paused
        self._loss_sum = 0.0  # sum of the train/loss values of the steps since the last line
        self._loss_steps = 0  # number of those optimizer steps
        self._stepped = False  # an optimizer step was taken in the batch under way

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.monotonic()
        self._printed = trainer.global_step
        self._lr = None
        self._tokens, self._seconds, self._since = 0, 0.0, None
        self._loss_sum, self._loss_steps, self._stepped = 0.0, 0, False

    def _pause(self) -> None:
        """Stops the clock of the tok/s window (a validation, the end of an epoch)."""
        if self._since is not None:
            self._seconds += time.monotonic() - self._since
            self._since = None

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pause()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pause()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._since is None:  # the first batch of this process, an epoch, or after a pause
            self._since = time.monotonic()

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        self._lr = float(optimizer.param_groups[0]["lr"])
        # The module logs this step's train/loss after this hook (Lightning calls the
        # callbacks' hook first): it is read when the batch ends.
        self._stepped = True

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        if isinstance(batch, dict):
            self._tokens += int(batch.get("n_tokens", 0))
        if self._stepped:  # the last batch of an optimizer step: its loss is logged now
            self._stepped = False
            loss = trainer.callback_metrics.get("train/loss")
            if loss is not None:
                self._loss_sum += float(loss)
                self._loss_steps += 1
        step = trainer.global_step
        if step == self._printed or step % self.every_n_steps:
            return
        self._printed = step
        now = time.monotonic()
        seconds = self._seconds + (now - self._since if self._since is not None else 0.0)
        tokens, loss_sum, loss_steps = self._tokens, self._loss_sum, self._loss_steps
        self._tokens, self._seconds, self._since = 0, 0.0, now
        self._loss_sum, self._loss_steps = 0.0, 0
        if not trainer.is_global_zero:
            return
        parts = [f"epoch {trainer.current_epoch}", f"step {step}"]
        if loss_steps:
            parts.append(f"loss {loss_sum / loss_steps:.3f}")
        lr = self._lr if self._lr is not None else trainer.progress_bar_metrics.get("train/lr")
        if lr is not None:
            parts.append(f"lr {float(lr):.2e}")
        if tokens and seconds > 0:
            parts.append(f"tok/s {tokens / seconds:,.0f}")
        timer = next((c for c in getattr(trainer, "callbacks", ()) if isinstance(c, Timer)), None)
        elapsed = timer.time_elapsed("train") if timer is not None else now - self._start
        parts.append(str(timedelta(seconds=int(elapsed))))
        print(" | ".join(parts), flush=True)
