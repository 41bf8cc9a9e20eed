"""TranslationModule: the LightningModule that trains, evaluates and runs a Transformer."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn

from seq2seq import compat
from seq2seq.checkpoint.format import (
    CHECKPOINT_KEY,
    EMA_KEY,
    TRAINING_WEIGHTS,
    differing_settings,
    model_config,
    tokenizer_blob,
    tokenizer_tensor,
)
from seq2seq.checkpoint.load import resume_flags
from seq2seq.checkpoint.training import (
    capture_rng_state,
    keep_cut_epoch_unfinished,
    restore_rng_state,
    run_validation_again,
    settle_validation_progress,
)
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.evaluation import METRICS, Score, corpus_scores, gather_in_order, write_lines
from seq2seq.nn import (
    DecodingConfig,
    Transformer,
    TransformerConfig,
    fast,
    label_smoothed_cross_entropy,
    linear_label_smoothed_cross_entropy,
)
from seq2seq.optim import InverseSqrtLR
from seq2seq.text_decoding import apply_overrides, as_config, decode_batch

log = logging.getLogger(__name__)

__all__ = ["TranslationModule", "tokenizer_from_checkpoint"]


def tokenizer_from_checkpoint(checkpoint: dict[str, Any]) -> Tokenizer | None:
    """The SentencePiece model stored in ``checkpoint["seq2seq"]["tokenizer"]`` (a uint8
    tensor of the serialized model), or ``None`` if the checkpoint carries none."""
    blob = tokenizer_blob(checkpoint)
    return None if blob is None else Tokenizer.from_bytes(blob)


def _default_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=5e-4, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.0)


def _default_scheduler(optimizer: torch.optim.Optimizer) -> InverseSqrtLR:
    return InverseSqrtLR(optimizer, warmup_steps=4000)


class TranslationModule(L.LightningModule):
    """An encoder-decoder Transformer trained with label-smoothed cross entropy.

    Training minimises label-smoothed cross entropy (Szegedy et al., 2016) summed over real
    target tokens and divided by their number (across all processes under DDP). Validation
    and test decode each held-out set (beam search, or greedy when the beam size is 1) and
    score the detokenized output with sacreBLEU against the raw reference lines.

    The SentencePiece model and the model configuration are stored in every checkpoint
    (``checkpoint["seq2seq"]``), so a checkpoint alone can translate, together with the states
    of the random generators, so that a run resumed from it draws the same dropout masks as
    an uninterrupted one. Loading a checkpoint whose architecture or SentencePiece model
    differs from this module's raises a ValueError naming the differing settings. A
    non-finite training loss stops training with a FloatingPointError naming the step and
    the batch, before the optimizer step could write it into the weights.

    Args:
        label_smoothing: epsilon of label smoothing, in [0, 1).
        optimizer: builds the optimizer from the parameters (default AdamW, lr 5e-4,
            betas (0.9, 0.98)).
        lr_scheduler: builds the schedule from the optimizer; stepped once per optimizer step
            (default :class:`~seq2seq.optim.InverseSqrtLR` with 4000 warmup steps).
        decoding: how validation, test and predict decode (``--model.decoding.*``, see
            :class:`~seq2seq.nn.DecodingConfig`, or a dict of its fields). Only ``predict``
            samples: validation and test score the search's output.
        val_beam_size: beam size during validation in ``fit`` (``None``: that of
            ``decoding``).
        metrics: corpus metrics computed on held-out sets (``bleu``, ``chrf``, ``ter``).
        tgt_lang: target language code for sacreBLEU's tokenizer choice (``None``: 13a).
        compile: run the training and evaluation forward pass through ``torch.compile``
            (decoding stays eager). Pair it with ``data.pad_to_multiple_of: 8`` so that
            variable-length batches reuse a few compiled shapes.
        **architecture: the fields of :class:`seq2seq.nn.TransformerConfig` (``vocab_size``,
            ``d_model``, ``n_heads``, ...), each a flat ``--model.*`` key of the command line
            (LightningCLI reads them, with their documentation, from the config class).

    Raises:
        ValueError: at construction, naming the setting, for a ``label_smoothing`` outside
            [0, 1), a ``val_beam_size`` below 1, a decoding setting out of range
            (``model.decoding.max_len_a must be >= 0, got -1.0``), an unknown metric, or
            sizes the Transformer
            refuses (e.g. ``d_model`` not divisible by ``n_heads``); from
            :meth:`on_load_checkpoint`, for a checkpoint of another architecture or
            SentencePiece model.
    """

    def __init__(
        self,
        label_smoothing: float = 0.1,
        optimizer: OptimizerCallable = _default_optimizer,
        lr_scheduler: LRSchedulerCallable = _default_scheduler,
        # A frozen (immutable) default, so that LightningCLI lists every field under
        # --model.decoding.*; None and a dict of fields (a checkpoint's) are taken too.
        decoding: DecodingConfig = DecodingConfig(),  # noqa: B008
        val_beam_size: int | None = None,
        metrics: list[str] | None = None,
        tgt_lang: str | None = None,
        compile: bool = False,
        **architecture: Any,
    ) -> None:
        super().__init__()
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        if val_beam_size is not None and val_beam_size < 1:
            raise ValueError(f"model.val_beam_size must be >= 1, got {val_beam_size}")
        # Checkpoints written before `decoding` existed hold its fields flat, and
        # load_from_checkpoint passes them here among the architecture's.
        flat = {k: architecture.pop(k) for k in DecodingConfig.field_names() if k in architecture}
        if flat:
            decoding = as_config(decoding).to_dict() | flat
        #: The decoding settings (:class:`~seq2seq.nn.DecodingConfig`).
        self.decoding = as_config(decoding, lambda name: f"model.decoding.{name}")
        #: Hypotheses per sentence that :meth:`predict_step` returns (``TranslationWriter``
        #: sets its ``n_best`` here when ``predict`` starts).
        self.n_best = 1
        self.config = TransformerConfig(**architecture)
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler", "decoding"])
        # Every architecture field, defaults included, in the hyperparameters (checkpoints,
        # TensorBoard's HPARAMS), not only the ones given; decoding as a plain dict, which
        # checkpoints load with weights_only=True.
        decoding_dict = {"decoding": self.decoding.to_dict()}
        self.save_hyperparameters(self.config.to_dict() | dict(self.hparams) | decoding_dict)
        self.model = Transformer(self.config)
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler
        self.metrics = list(metrics) if metrics is not None else list(METRICS)
        for name in self.metrics:
            if name not in METRICS:
                raise ValueError(f"unknown metric {name!r} in metrics; choose from {METRICS}")
        self.tokenizer: Tokenizer | None = None
        #: The run's ``--checkpoint_dir`` (set by the command line when given), named in the
        #: messages that say how to resume.
        self.checkpoint_dir: str | None = None
        self._outputs: dict[str, list[tuple[int, str, str]]] = {}
        self._heldout_sums: dict[str, torch.Tensor] = {}
        self._last_batch_time: float | None = None
        self._rate_tokens, self._rate_seconds = 0, 0.0  # train/tokens_per_s window
        self.register_buffer("_window_tokens", torch.zeros((), dtype=torch.long), persistent=False)
        # Summed label-smoothed loss and NLL of the optimizer step's micro-batches (float32).
        self.register_buffer("_window_losses", torch.zeros(2), persistent=False)
        self.register_buffer(
            "_window_nonfinite", torch.zeros((), dtype=torch.bool), persistent=False
        )
        self._window_batches: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        self._resume_rng_state: dict[str, Any] | None = None
        self._step_rng: dict[str, Any] | None = None  # at the start of the last training_step
        # A bound method, not a module attribute, so the state dict keeps one copy of weights.
        forward = self.model.forward
        self._forward = torch.compile(forward, dynamic=False) if compile else forward
        self.last_scores: dict[str, dict[str, Score]] = {}
        self._checkpoint_step: int | None = None  # global step of a loaded checkpoint
        self._training_epoch: int | None = None  # epoch under way in fit (on_train_epoch_start)
        self._validation_open = False  # a validation of fit under way, not yet scored
        # (index, hypothesis, reference) of the last decoded held-out sets, in index order.
        self.last_hypotheses: dict[str, list[tuple[int, str, str]]] = {}

    @property
    def model_config(self) -> dict[str, Any]:
        """The architecture as a dictionary (:meth:`TransformerConfig.to_dict`)."""
        return self.config.to_dict()

    # ------------------------------------------------------------------ set-up and checkpoints
    def setup(self, stage: str) -> None:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        if self.tokenizer is None and getattr(datamodule, "tokenizer", None) is not None:
            self.tokenizer = datamodule.tokenizer
        if self.tokenizer is not None:
            self._check_vocab(self.tokenizer.vocab_size, "the tokenizer")

    def _check_vocab(self, size: int, where: str) -> None:
        if size != self.config.vocab_size:
            raise ValueError(
                f"{where} has {size} pieces but model.vocab_size is "
                f"{self.config.vocab_size}: set data.vocab_size/model.vocab_size to the "
                "size the tokenizer was trained with, or retrain the tokenizer"
            )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The random generators' states let a resumed run draw the same dropout masks as an
        # uninterrupted one (Lightning restores optimizer, scheduler and loop state only).
        # Written inside a training batch (Ctrl-C): the resumed run trains that batch again,
        # with the generators' states from the start of its training_step.
        rng = self._step_rng if self._batch_under_way() else None
        extra: dict[str, Any] = {
            "model_config": self.config.to_dict(),
            "rng": rng or capture_rng_state(),
        }
        if self.tokenizer is not None:
            data = self.tokenizer.to_bytes()
            extra["tokenizer"] = tokenizer_tensor(data)
        checkpoint[CHECKPOINT_KEY] = extra
        if self._trainer is None:
            return
        logger = self._trainer.logger
        if logger is not None and isinstance(getattr(logger, "version", None), int):
            # Where this run logs: a resumed fit continues the same folder (seq2seq.cli).
            extra["log"] = {"name": logger.name, "version": logger.version}
        if self._epoch_cut_short():
            keep_cut_epoch_unfinished(checkpoint, self._training_epoch)
        if self._validation_open:  # stopped (Ctrl-C, SIGTERM) before this validation's score
            run_validation_again(checkpoint)
        else:
            settle_validation_progress(checkpoint)
        if self._in_validation_forced_by_stop() and "loops" in checkpoint:
            # Written during the validation that a stop request added after the last batch,
            # before Lightning counted that batch in its logging step. A resumed run counts it
            # on its own only where this validation was due anyway (it then skips it);
            # otherwise it would log every value one step early.
            compat.add_to_saved_logged_step(checkpoint, 1)

    def _fitting(self) -> bool:
        return self._trainer is not None and self.trainer.state.fn == "fit"

    def _batch_under_way(self) -> bool:
        """Whether fit is inside a training batch (begun, not processed yet)."""
        if self._trainer is None or not self.trainer.training:
            return False
        batches = self.trainer.fit_loop.epoch_loop.batch_progress.current
        return batches.ready > batches.processed

    def _epoch_cut_short(self) -> bool:
        """Whether fit is stopping (``max_time``, ``max_steps``, early stopping) inside the
        current training epoch, after some of its batches and before its last one."""
        trainer = self.trainer
        if not trainer.training or self._training_epoch is None:
            return False
        batches = trainer.fit_loop.epoch_loop.batch_progress
        if batches.current.completed == 0:
            return False
        if batches.is_last_batch or batches.current.ready >= trainer.num_training_batches:
            return False  # the epoch reached its end (or limit_train_batches)
        max_steps = trainer.max_steps
        return trainer.should_stop or (max_steps != -1 and trainer.global_step >= max_steps)

    def _in_validation_forced_by_stop(self) -> bool:
        """Whether fit is in a validation that runs after a training batch only because a stop
        was requested (``Trainer.should_stop``: ``max_time``, early stopping), not because the
        ``val_check_interval`` / epoch schedule asks for one at this batch.

        Mirrors Lightning's ``_TrainingEpochLoop._should_check_val_fx`` without its stop clause;
        a time-based ``val_check_interval`` counts as not due.
        """
        trainer = self.trainer
        if not (trainer.validating and trainer.state.fn == "fit" and trainer.should_stop):
            return False
        if trainer.sanity_checking:
            return False
        loop = trainer.fit_loop.epoch_loop
        batches = loop.batch_progress
        if batches.current.completed == 0 or batches.current.completed != batches.current.ready:
            return False  # not after a finished training batch
        if batches.is_last_batch:
            return False
        if compat.val_check_time_interval(trainer) is not None:
            return True
        if trainer.val_check_batch == float("inf"):
            return True
        every_epoch = trainer.check_val_every_n_epoch is not None
        iteration = loop.batch_idx if every_epoch else loop.total_batch_idx
        return (iteration + 1) % trainer.val_check_batch != 0

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._checkpoint_step = checkpoint.get("global_step")  # names validate/test outputs
        extra = checkpoint.get(CHECKPOINT_KEY, {})
        differing = [
            f"{key}: checkpoint {old!r} vs config {new!r}"
            for key, old, new in differing_settings(model_config(checkpoint), self.model_config)
        ]
        if differing:
            raise ValueError(
                "checkpoint was built with other model settings: " + "; ".join(differing)
            )
        tokenizer = tokenizer_from_checkpoint(checkpoint)
        if tokenizer is not None:
            self._check_vocab(tokenizer.vocab_size, "the checkpoint's tokenizer")
            if self.tokenizer is not None and self.tokenizer.to_bytes() != tokenizer.to_bytes():
                raise ValueError(
                    f"the checkpoint's SentencePiece model differs from the data module's "
                    f"({self.tokenizer.name}) although both have {tokenizer.vocab_size} pieces: "
                    "the checkpoint was trained on other text or with other data.* tokenizer "
                    "settings; use the data settings it was trained with"
                )
            self.tokenizer = tokenizer
        if TRAINING_WEIGHTS in checkpoint and self._fitting():
            # Written with seq2seq.callbacks.EMA: state_dict holds the average, which the
            # callback takes back; training goes on from the training weights.
            ema = checkpoint.setdefault(EMA_KEY, {})
            ema["state_dict"] = checkpoint["state_dict"]
            checkpoint["state_dict"] = checkpoint.pop(TRAINING_WEIGHTS)
            if not any(type(c).__name__ == "EMA" for c in self.trainer.callbacks):
                rank_zero_warn(
                    "the checkpoint holds an exponential moving average of the weights, but "
                    "no seq2seq.callbacks.EMA is configured: training goes on from its "
                    "training weights and the average is dropped"
                )
        # Restored at the next training step, after the data loaders have been set up.
        self._resume_rng_state = extra.get("rng")
        settle_validation_progress(checkpoint)  # before Lightning restores its loops from it

    # ------------------------------------------------------------------ training
    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, src_mask=None) -> torch.Tensor:
        """Logits ``(B, T, V)`` for source ``(B, S)`` and shifted target input ``(B, T)``."""
        return self.model(src, tgt_in, src_mask)

    def _loss_sums(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # collate's non-padding target positions; not under compile, where their varying number
        # would mean varying shapes.
        index = None if self.hparams.compile else batch.get("tgt_index")
        target = batch["tgt_out"]
        if index is None or not fast.is_enabled("fused_loss"):
            logits = self._forward(batch["src"], batch["tgt_in"], batch["src_mask"])
        else:
            # Eager path (seq2seq.nn.fast): decoder states at the real target positions only,
            # and the output projection fused with the loss (the (N, V) logits are never
            # materialised); the feed-forward sub-layers skip padding rows too.
            rows = fast.is_enabled("real_rows")
            hidden = self.model.features(
                batch["src"],
                batch["tgt_in"],
                batch["src_mask"],
                index,
                src_index=batch.get("src_index") if rows else None,
                tgt_index=index if rows else None,
            )
            loss_sum, nll_sum = linear_label_smoothed_cross_entropy(
                hidden,
                self.model.output_weight,
                target.reshape(-1).index_select(0, index),
                self.hparams.label_smoothing,
                ignore_index=self.model.pad_id,
            )
            n_tokens = (batch["tgt_out"] != self.model.pad_id).sum()
            return loss_sum, nll_sum, n_tokens
        loss_sum, nll_sum = label_smoothed_cross_entropy(
            logits, target, self.hparams.label_smoothing, ignore_index=self.model.pad_id
        )
        n_tokens = (batch["tgt_out"] != self.model.pad_id).sum()
        return loss_sum, nll_sum, n_tokens

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        if self._resume_rng_state is not None:
            # First step after resuming: continue the random streams (dropout) where the
            # checkpointed run left them.
            restore_rng_state(self._resume_rng_state)
            self._resume_rng_state = None
        self._step_rng = capture_rng_state()  # for a checkpoint written inside this batch
        loss_sum, nll_sum, n_tokens = self._loss_sums(batch)
        # A device-side flag (no synchronisation here); on_before_optimizer_step reads it
        # once per optimizer step and stops before non-finite gradients reach the weights.
        nonfinite = ~torch.isfinite(loss_sum.detach())
        self._window_nonfinite = self._window_nonfinite | nonfinite
        self._window_batches.append((batch_idx, batch["index"], nonfinite))
        # The returned loss is a *sum* over tokens; on_before_optimizer_step divides the
        # gradients by the real target tokens of the whole optimizer step (all accumulated
        # micro-batches on all processes), as fairseq does. Lightning divides the returned
        # loss by accumulate_grad_batches, which the multiplication here cancels.
        self._window_tokens = self._window_tokens + n_tokens.detach()
        # train/loss, train/nll and train/ppl are logged per optimizer step, over all its
        # micro-batches on all processes (on_before_optimizer_step).
        self._window_losses = (
            self._window_losses + torch.stack([loss_sum, nll_sum]).detach().float()
        )
        tokens = int(batch["n_tokens"])  # a Python int from collate: no device sync
        pad = self.model.pad_id
        positions = batch["src"].numel() + batch["tgt_out"].numel()
        real = (batch["src"] != pad).sum() + n_tokens
        self.log("train/padding", 1.0 - real.float() / positions, batch_size=tokens)
        return loss_sum * self.trainer.accumulate_grad_batches

    def on_train_batch_start(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._batch_tokens = int(batch.get("n_tokens", 0))

    def on_train_batch_end(self, outputs, batch: dict[str, Any], batch_idx: int) -> None:
        # train/tokens_per_s: this process's real target tokens over the time of the batches
        # since the value last went to the logger (every log_every_n_steps optimizer steps), as
        # fairseq's wps; a batch right after a validation or an epoch's start, whose time since
        # the previous batch is unknown, is left out.
        now = time.perf_counter()
        if self._last_batch_time is not None and self._batch_tokens:
            self._rate_tokens += self._batch_tokens
            self._rate_seconds += now - self._last_batch_time
        self._last_batch_time = now
        if self._rate_seconds > 0:
            rate = self._rate_tokens / self._rate_seconds
            self.log("train/tokens_per_s", rate, prog_bar=True)
            if compat.logs_written_now(self.trainer):
                self._rate_tokens, self._rate_seconds = 0, 0.0

    def on_train_start(self) -> None:
        # A run resumed mid-epoch continues its epoch without on_train_epoch_start.
        self._training_epoch = self.current_epoch  # see _epoch_cut_short
        self._validation_open = False

    def on_train_epoch_start(self) -> None:
        self._last_batch_time = None
        self._training_epoch = self.current_epoch

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Gradients hold d(sum of token losses); turn them into d(mean over the real target
        # tokens of this optimizer step). DDP has averaged them over processes, hence `world`.
        # The same sums give the logged training loss: label-smoothed loss and NLL per real
        # target token of the whole optimizer step (every micro-batch, every process), as
        # fairseq reports it, not the last micro-batch of process 0.
        world = self.trainer.world_size
        total = self._window_tokens.float()
        nonfinite = self._window_nonfinite.float()
        sums = torch.cat([torch.stack([total, nonfinite]), self._window_losses])
        if world > 1:
            sums = self.trainer.strategy.reduce(sums, reduce_op="sum")
        total, nonfinite, loss_sum, nll_sum = sums.unbind()
        if nonfinite.item():  # the one host synchronisation per optimizer step
            self._raise_nonfinite()
        self._window_nonfinite = torch.zeros_like(self._window_nonfinite)
        self._window_losses = torch.zeros_like(self._window_losses)
        self._window_batches = []
        per_token = torch.stack([loss_sum, nll_sum]) / total.clamp(min=1)
        self.log("train/loss", per_token[0], prog_bar=True)
        self.log("train/nll", per_token[1])
        self.log("train/ppl", torch.exp(per_token[1].clamp(max=50)))
        # The learning rate this step is taken with (the scheduler moves it on afterwards).
        self.log("train/lr", float(optimizer.param_groups[0]["lr"]), prog_bar=True)
        scale = world / total.clamp(min=1)
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        compat.foreach_mul_(grads, scale)
        self._window_tokens = torch.zeros_like(self._window_tokens)
        if grads:
            # Every step, like the losses: a run that stops between two logging steps
            # (max_time) flushes the step metrics once more, which must not repeat an older
            # step's norm. One fused pass over the gradients.
            norms = compat.foreach_norm(grads)
            self.log("train/grad_norm", torch.linalg.vector_norm(torch.stack(norms)))

    def _raise_nonfinite(self) -> None:
        """Raises FloatingPointError naming the step and the batches whose loss was not finite."""
        bad = [
            f"batch {batch_idx} of epoch {self.trainer.current_epoch} (sentences at 0-based "
            f"lines {index.tolist()[:8]}{' ...' if index.numel() > 8 else ''} of the training "
            "split)"
            for batch_idx, index, flag in self._window_batches
            if bool(flag)
        ]
        where = (
            "; ".join(bad)
            if bad
            else f"a batch of another process (this is rank {self.global_rank})"
        )
        raise FloatingPointError(
            f"non-finite training loss at step {self.trainer.global_step}: {where}. The "
            "optimizer step was not taken, so the weights and the checkpoints written so far "
            "are unaffected. Lower the learning rate, lengthen the warm-up or set "
            f"trainer.gradient_clip_val, then resume with {resume_flags(self.checkpoint_dir)}."
        )

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.parameters())
        scheduler = self.scheduler_factory(optimizer)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }

    # ------------------------------------------------------------------ decoding
    def translate_batch(
        self,
        batch: dict[str, Any],
        beam_size: int | None = None,
        n_best: int = 1,
        **decoding: Any,
    ) -> list[list[tuple[str, float]]]:
        """Decode a batch of sources into detokenized text
        (:func:`seq2seq.text_decoding.decode_batch`) with :attr:`decoding`, overridden by
        this call's ``beam_size`` and ``decoding`` (:class:`~seq2seq.nn.DecodingConfig`
        fields). Its ``sampling`` applies outside a ``Trainer`` and in ``predict``; validation
        and test score the search's output.

        Args:
            batch: a collated batch with ``src`` ``(B, S)`` long and ``src_mask``
                ``(B, 1, 1, S)`` bool.
            beam_size: ``None``: that of :attr:`decoding`; 1 is greedy.
            n_best: hypotheses returned per sentence (at most the beam size).
            **decoding: this call's decoding fields.

        Returns:
            As :func:`~seq2seq.text_decoding.decode_batch`.

        Raises:
            RuntimeError: if no tokenizer is attached (none in the data module or checkpoint).
            ValueError: naming the setting, for an unknown or out-of-range one, or an
                ``n_best`` above the beam size.
        """
        if self.tokenizer is None:
            raise RuntimeError(
                "no tokenizer attached: load a checkpoint that carries one or attach the "
                "data module's tokenizer before decoding"
            )
        trainer = self._trainer
        if "sampling" not in decoding and trainer is not None and not trainer.predicting:
            decoding["sampling"] = False  # held-out scores are those of the search
        config = apply_overrides(self.decoding, {"beam_size": beam_size, **decoding})
        return decode_batch(self.model, self.tokenizer, batch, config, n_best)

    def _decode_and_store(self, batch: dict[str, Any], key: str, beam_size: int | None) -> None:
        best = [hyps[0][0] for hyps in self.translate_batch(batch, beam_size=beam_size)]
        refs = batch.get("ref_text") or [""] * len(best)
        indices = batch["index"].tolist()
        self._outputs.setdefault(key, []).extend(zip(indices, best, refs, strict=True))

    def _held_out_step(self, batch: dict[str, Any], key: str, beam: int | None) -> None:
        loss_sum, nll_sum, n_tokens = self._loss_sums(batch)
        # Summed here and reduced once per set in _score_outputs: the loss is exactly
        # sum / tokens over the whole set, on any number of processes.
        sums = torch.stack([loss_sum.detach(), nll_sum.detach(), n_tokens]).double()
        self._heldout_sums[key] = self._heldout_sums.get(key, 0) + sums
        self._decode_and_store(batch, key, beam)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        beam = self.hparams.val_beam_size if self.trainer.state.fn == "fit" else None
        self._held_out_step(batch, "val", beam)

    def test_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._held_out_step(batch, f"test/{self._test_set_name(dataloader_idx)}", None)

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0):
        """Returns a list of ``(index, [(text, score), ...])`` for the batch's sentences."""
        hyps = self.translate_batch(batch, n_best=self.n_best)
        return list(zip(batch["index"].tolist(), hyps, strict=True))

    def _test_set_name(self, dataloader_idx: int) -> str:
        names = getattr(getattr(self.trainer, "datamodule", None), "test_set_names", None)
        return names[dataloader_idx] if names else f"set{dataloader_idx}"

    # ------------------------------------------------------------------ scoring
    def on_validation_epoch_start(self) -> None:
        self._outputs, self._heldout_sums = {}, {}
        self._last_batch_time = None  # train/tokens_per_s: not over a validation's time
        trainer = self._trainer
        fitting = trainer is not None and trainer.state.fn == "fit"
        self._validation_open = fitting and not trainer.sanity_checking

    def on_test_epoch_start(self) -> None:
        self._outputs, self._heldout_sums = {}, {}

    def on_validation_epoch_end(self) -> None:
        self._score_outputs()
        self._validation_open = False

    def on_test_epoch_end(self) -> None:
        scores = self._score_outputs()
        if scores:
            first = next(iter(scores.values()))
            for name, score in first.items():
                self.log(f"test/{name}", score.value, add_dataloader_idx=False)
        if len(scores) > 1 and self.trainer.global_rank == 0:
            self.print(_score_table(scores))

    def _score_outputs(self) -> dict[str, dict[str, Score]]:
        results = {}
        # In the order of data.test_splits (test/bleu is the first set's), the same on every
        # process whichever set's batches came first.
        names = getattr(getattr(self.trainer, "datamodule", None), "test_set_names", None) or []
        order = {f"test/{name}": i for i, name in enumerate(names)}
        for key, items in sorted(
            self._outputs.items(), key=lambda kv: (order.get(kv[0], -1), kv[0])
        ):
            ordered = gather_in_order(items)
            self.last_hypotheses[key] = ordered
            hyps = [hyp for _, hyp, _ in ordered]
            refs = [ref for _, _, ref in ordered]
            if self.trainer.sanity_checking:
                continue
            sums = self.trainer.strategy.reduce(self._heldout_sums[key], reduce_op="sum")
            loss, nll = sums[0] / sums[2].clamp(min=1), sums[1] / sums[2].clamp(min=1)
            self.log(f"{key}/loss", loss.float(), add_dataloader_idx=False)
            self.log(f"{key}/nll", nll.float(), add_dataloader_idx=False)
            self.log(f"{key}/ppl", torch.exp(nll.clamp(max=50)).float(), add_dataloader_idx=False)
            scores = corpus_scores(hyps, refs, self.metrics, tgt_lang=self.hparams.tgt_lang)
            for name, score in scores.items():
                self.log(
                    f"{key}/{name}",
                    score.value,
                    prog_bar=(name == "bleu"),
                    add_dataloader_idx=False,
                )
            results[key] = scores
            self._report(key, hyps, scores)
        self._outputs = {}
        self.last_scores = results
        return results

    def _report(self, key: str, hyps: list[str], scores: dict[str, Score]) -> None:
        if self.trainer.global_rank != 0:
            return
        lines = [
            f"{key}: {score.text}\n  signature: {score.signature}" for score in scores.values()
        ]
        total = self._heldout_size(key)
        if total is not None and len(hyps) < total:
            limit = "limit_val_batches" if key == "val" else "limit_test_batches"
            lines.append(
                f"  scored on {len(hyps)} of the {total} sentences (--trainer.{limit}): not the "
                "whole set's score"
            )
        if self.trainer.fast_dev_run:  # a smoke run writes no files (no logs, no checkpoints)
            self.print("\n".join(lines))
            return
        log_dir = self._log_dir()
        name = key.replace("/", ".")  # val, test.<set>
        step = self.trainer.global_step
        if self.trainer.state.fn != "fit" and self._checkpoint_step is not None:
            step = self._checkpoint_step  # the step of the checkpoint being evaluated
        hyp_path = write_lines(log_dir / "hypotheses" / f"{name}.step{step}.txt", hyps)
        # Through the progress bar (LightningModule.print): on lines of their own, not appended
        # to the bar's line.
        self.print("\n".join(lines) + f"\n  hypotheses: {hyp_path}")
        write_lines(
            hyp_path.with_suffix(".scores"), [f"{s.text}\t{s.signature}" for s in scores.values()]
        )

    def _heldout_size(self, key: str) -> int | None:
        """Sentences in the held-out set ``key`` (``val`` or ``test/<name>``) of the trainer's
        data module, if it says."""
        datamodule = getattr(self.trainer, "datamodule", None)
        if key == "val":
            dataset = getattr(datamodule, "val_set", None)
        else:
            dataset = (getattr(datamodule, "test_sets", None) or {}).get(key.partition("/")[2])
        try:
            return len(dataset) if dataset is not None else None
        except TypeError:
            return None

    def _log_dir(self) -> Path:
        logger = self.trainer.logger
        directory = getattr(logger, "log_dir", None) if logger is not None else None
        return Path(directory or self.trainer.default_root_dir)


def _score_table(scores: dict[str, dict[str, Score]]) -> str:
    """One row per test set, in ``data.test_splits`` order, one column per metric::

    set               BLEU  chrF2    TER
    newstest2013     26.41  54.12  58.30
    newstest2014     27.02  55.60  57.11
    (test/bleu, test/chrf, test/ter: newstest2013's)
    """
    names = [key.removeprefix("test/") for key in scores]
    first = next(iter(scores.values()))
    rows = [["set", *(score.text.split(" = ")[0] for score in first.values())]]
    rows += [
        [name, *(f"{score.value:.2f}" for score in sets.values())]
        for name, sets in zip(names, scores.values(), strict=True)
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.append(f"({', '.join(f'test/{m}' for m in first)}: {names[0]}'s)")
    return "\n".join(lines)
