"""TensorBoard monitoring: validation samples, attention heatmaps, the best score as the
HPARAMS metric, each at the step of the ``val/*`` scalars."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from seq2seq import compat
from seq2seq.data.batching import collate
from seq2seq.evaluation import heldout_sets
from seq2seq.nn import DecodingConfig, greedy_search


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
    ``val/samples``; with one validation set per pair, ``val/<pair>/samples`` for each) with
    the source, the reference and the current hypothesis of the first ``n_samples`` lines of
    the set. The hypotheses are the ones validation decoded
    (``TranslationModule.last_hypotheses[<key>]``); lines it skipped (``limit_val_batches``)
    are decoded here with the validation beam size.

    Args:
        n_samples: number of sentences shown (lines ``0 .. n_samples - 1``).
    """

    def __init__(self, n_samples: int = 3) -> None:
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        self.n_samples = n_samples

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        decoded = getattr(pl_module, "last_hypotheses", {})
        tables = {
            key: self._table(trainer, pl_module, val_set, decoded[key])
            for key, val_set in heldout_sets(trainer, "validate").items()
            if val_set is not None and key in decoded
        }  # on every process: decoding the lines validation skipped runs the model
        logger = _tensorboard(trainer)
        if logger is None:
            return
        for key, table in tables.items():
            logger.experiment.add_text(f"{key}/samples", table, _logging_step(trainer))

    def _table(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        val_set: Any,
        decoded: list[tuple[int, str, str]],
    ) -> str:
        """The Markdown table of the first lines of ``val_set`` and their hypotheses."""
        examples = [val_set[i] for i in range(min(self.n_samples, len(val_set)))]
        hyps = {index: hyp for index, hyp, _ in decoded}
        missing = [e for e in examples if e["index"] not in hyps]
        if missing:
            hp = pl_module.hparams
            beam = hp.val_beam_size if trainer.state.fn == "fit" else None
            tokenizer = pl_module.tokenizer
            batch = collate(missing, pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id)
            batch = {
                k: v.to(pl_module.device) if torch.is_tensor(v) else v for k, v in batch.items()
            }
            for e, n_best in zip(missing, pl_module.translate_batch(batch, beam), strict=True):
                hyps[e["index"]] = n_best[0][0]
        rows = ["| line | source | reference | hypothesis |", "| --- | --- | --- | --- |"]
        for e in examples:
            texts = (e.get("src_text", ""), e.get("ref_text", ""), hyps[e["index"]])
            rows.append("| " + " | ".join([str(e["index"]), *map(_escape_markdown, texts)]) + " |")
        return "\n".join(rows)


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
        sentence: line number (0-based) of the validation sentence (of the first pair's
            validation set, with one per pair).
        self_attention: also plot the self-attention of every layer.
    """

    def __init__(self, sentence: int = 0, self_attention: bool = False) -> None:
        if sentence < 0:
            raise ValueError(f"sentence must be >= 0, got {sentence}")
        self.sentence = sentence
        self.self_attention = self_attention

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        val_set = next(iter(heldout_sets(trainer, "validate").values()), None)
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
        model, tokenizer, hp = pl_module.model, pl_module.tokenizer, pl_module.decoding
        src = torch.tensor([src_ids], dtype=torch.long, device=pl_module.device)
        mask = torch.ones(1, 1, 1, src.size(1), dtype=torch.bool, device=src.device)
        bos, eos = tokenizer.bos_id, tokenizer.eos_id
        limits = DecodingConfig(max_len_a=hp.max_len_a, max_len_b=hp.max_len_b)
        hyp = greedy_search(model, src, mask, bos, eos, limits, scores=False)[0][0]
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
