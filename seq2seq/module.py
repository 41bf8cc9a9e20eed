"""TranslationModule: the LightningModule that trains, evaluates and runs a Transformer."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType, rank_zero_warn

from seq2seq.callbacks.resume import ExactResume
from seq2seq.callbacks.throughput import TokenThroughput
from seq2seq.checkpoint.format import (
    CHECKPOINT_KEY,
    INIT_FROM,
    OPTIMIZER_KEY,
    ORIGIN,
    SCHEDULE_KEY,
    TRAINING_WEIGHTS,
    checkpoint_label,
    class_name,
    tokenizer_tensor,
    weights_origin,
)
from seq2seq.checkpoint.restore import (
    check_model_settings,
    check_resumed_training,
    check_same_tokenizer,
    check_vocab_size,
    tokenizer_from_checkpoint,
    train_on_training_weights,
)
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.evaluation import (
    METRICS,
    HeldOutScores,
    Score,
    check_metrics,
    corpus_scores,
    score_table,
    set_means,
    split_test_key,
    write_report,
)
from seq2seq.files import local_folder
from seq2seq.machine import emulated_bfloat16
from seq2seq.nn import (
    DecodingConfig,
    Transformer,
    TransformerConfig,
    fast,
    label_smoothed_cross_entropy,
    linear_label_smoothed_cross_entropy,
)
from seq2seq.optim import (
    check_optimizer_settings,
    check_pair_key,
    check_plateau_monitor,
    default_optimizer,
    default_scheduler,
    lightning_schedule,
    set_schedule_length,
    step_plateau_schedules,
    warn_other_length,
)
from seq2seq.text_decoding import apply_overrides, as_config, decode_batch
from seq2seq.train_step import StepWindow

__all__ = ["TranslationModule", "tokenizer_from_checkpoint"]


# The names of the defaults in configs that --print_config and the logged config.yaml wrote
# before they moved to seq2seq.optim.
_default_optimizer, _default_scheduler = default_optimizer, default_scheduler


def _warn_unused_sampling_fields(decoding: DecodingConfig) -> None:
    # translate's rule is that a sampling field asks for sampling; a config cannot tell a field
    # it sets from a default, so a sampling field set without sampling is warned about instead.
    default = DecodingConfig()
    given = [
        f for f in DecodingConfig.SAMPLING_FIELDS if getattr(decoding, f) != getattr(default, f)
    ]
    if given and not decoding.sampling:
        rank_zero_warn(
            f"model.decoding.{given[0]} applies to sampling, but model.decoding.sampling is "
            f"false: predict searches (beam_size {decoding.beam_size}); set "
            "model.decoding.sampling true to sample"
        )


def _cpu_bfloat16(trainer: L.Trainer) -> bool:
    """Whether ``trainer`` trains on CPU in ``bf16-mixed`` or ``bf16-true``."""
    return str(trainer.precision).startswith("bf16") and trainer.strategy.root_device.type == "cpu"


def _keeps_freed_heap(trainer: L.Trainer, stage: str) -> bool:
    """Whether this stage takes the ``heap`` trick (:func:`seq2seq.nn.fast.keep_freed_heap`):
    on CPU, decoding (validate, test, predict) and bfloat16 fits, where it was measured."""
    on_cpu = trainer.strategy.root_device.type == "cpu"
    return on_cpu and (stage != "fit" or _cpu_bfloat16(trainer))


class TranslationModule(L.LightningModule):
    """An encoder-decoder Transformer trained with label-smoothed cross entropy (Szegedy et al.,
    2016) per real target token, evaluated by decoding each held-out set and scoring it with
    sacreBLEU (:mod:`seq2seq.evaluation`).

    Gradients are per-token means over each optimizer step on all processes, and a non-finite
    loss stops training before the update (:class:`~seq2seq.train_step.StepWindow`). Every
    checkpoint carries what :mod:`seq2seq.checkpoint.format` lists, so a checkpoint alone can
    translate and a resumed run continues exactly (:class:`~seq2seq.callbacks.ExactResume`).
    That callback and :class:`~seq2seq.callbacks.TokenThroughput` (``train/tokens_per_s``) are
    added to every trainer of this module.

    Args:
        label_smoothing: epsilon of label smoothing, in [0, 1).
        optimizer: builds the optimizer from the parameters (default AdamW, lr 5e-4,
            betas (0.9, 0.98)).
        lr_scheduler: builds the schedule from the optimizer; stepped once per optimizer step
            (default :class:`~seq2seq.optim.InverseSqrtLR` with 4000 warmup steps), a
            ``ReduceLROnPlateau`` after each validation of the fit on its ``monitor``
            (Lightning's class) or else ``val/loss`` (mode ``min``) or ``val/bleu``
            (``max``); ``None``: a constant learning rate.
        decoding: how validation, test and predict decode (``--model.decoding.*``, see
            :class:`~seq2seq.nn.DecodingConfig`, or a dict of its fields). Only ``predict``
            samples: validation and test score the search's output.
        val_beam_size: beam size during validation in ``fit`` (``None``: that of
            ``decoding``).
        metrics: corpus metrics computed on held-out sets, logged as ``val/<name>``: ``bleu``,
            ``chrf``, ``ter`` (the default) and ``chrfpp`` (chrF++), see
            :data:`~seq2seq.evaluation.KNOWN_METRICS`.
        tgt_lang: target language code for sacreBLEU's tokenizer choice (``None``: 13a), for
            a data module that does not name each held-out set's (``heldout_tgt_lang``).
        compile: run the training and evaluation forward pass through ``torch.compile``
            (decoding stays eager) with torch's automatic dynamic shapes: compiled for the
            first batch's sizes, then once more with the sizes that changed (token-budget
            batches vary in rows and lengths) left symbolic.
        **architecture: the fields of :class:`seq2seq.nn.TransformerConfig` (``vocab_size``,
            ``d_model``, ``n_heads``, ...), each a flat ``--model.*`` key of the command line
            (LightningCLI reads them, with their documentation, from the config class).

    Raises:
        ValueError: at construction, naming the setting, for one out of its range
            (``model.decoding.max_len_a must be >= 0, got -1.0``), an unknown metric or sizes
            the Transformer refuses (``d_model`` not divisible by ``n_heads``); from
            :meth:`on_load_checkpoint`, for a checkpoint of another architecture or
            SentencePiece model.
    """

    def __init__(
        self,
        label_smoothing: float = 0.1,
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = default_scheduler,
        # Frozen, so that LightningCLI lists every field under --model.decoding.*.
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
        _warn_unused_sampling_fields(self.decoding)
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
        self.metrics = check_metrics(metrics if metrics is not None else METRICS)
        self._stand_ins = check_optimizer_settings(optimizer, lr_scheduler, self.metrics)
        self._run_length: int | None = None  # a CosineLR's max_steps set from the trainer
        self.tokenizer: Tokenizer | None = None
        self.initialised_from: str | None = None  # fit --init_from's checkpoint
        #: The fingerprint of the initial weights of the run (seq2seq.checkpoint.format.ORIGIN).
        self.origin: str | None = None
        #: The run's ``--checkpoint_dir`` (set by the command line when given), named in the
        #: messages that say how to resume.
        self.checkpoint_dir: str | None = None
        self._held_out = HeldOutScores()
        self._heldout_keys: list[str] = []  # of the evaluation's loaders, by dataloader_idx
        self._window = StepWindow()
        self._resume = ExactResume()
        self._throughput = TokenThroughput()
        # A bound method, not a module attribute, so the state dict keeps one copy of weights.
        forward = self.model.forward
        self._forward = torch.compile(forward) if compile else forward
        self.last_scores: dict[str, dict[str, Score]] = {}
        self._checkpoint_label: str | None = None  # of a loaded checkpoint: step<N>[.avg<K>]
        # (index, hypothesis, reference) of the last decoded held-out sets, in index order.
        self.last_hypotheses: dict[str, list[tuple[int, str, str]]] = {}
        self._logged: dict[str, float] = {}  # the last validation's metrics, for plateau schedules

    @property
    def model_config(self) -> dict[str, Any]:
        """The architecture as a dictionary (:meth:`TransformerConfig.to_dict`)."""
        return self.config.to_dict()

    # ------------------------------------------------------------------ set-up and checkpoints
    def setup(self, stage: str) -> None:
        if self._trainer is not None and _keeps_freed_heap(self.trainer, stage):
            fast.keep_freed_heap()  # the rest of this process keeps freed memory for reuse
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        if self.tokenizer is None and getattr(datamodule, "tokenizer", None) is not None:
            self.tokenizer = datamodule.tokenizer
        if self.tokenizer is not None:
            check_vocab_size(self.tokenizer, self.config.vocab_size, "the tokenizer")
        if self._trainer is not None and _cpu_bfloat16(self.trainer):
            precision = str(self.trainer.precision)
            message = emulated_bfloat16(f"precision {precision!r}", "precision '32-true'")
            if message:
                rank_zero_warn(message)

    def on_fit_start(self) -> None:
        # A fresh run's origin: its initial weights (random, or --init_from's where that
        # checkpoint recorded none); a resumed run restored its own with its checkpoint.
        if self.origin is None and self.trainer.ckpt_path is None:
            self.origin = weights_origin(self.model)
        for callback in self.trainer.callbacks:  # ModelCheckpoint's, before its first validation
            monitor = getattr(callback, "monitor", None)
            if isinstance(monitor, str):
                check_pair_key(type(callback).__name__, monitor, self._pair_names())

    def on_train_start(self) -> None:
        # After Lightning restored a resumed run's schedule, whose length is the checkpoint's.
        steps = self.trainer.max_steps
        name = "trainer.max_steps" if steps > 0 else "the run's length by trainer.max_epochs"
        for config in self.trainer.lr_scheduler_configs:
            warn_other_length(config.scheduler, steps if steps > 0 else self._run_length, name)

    def configure_callbacks(self) -> list[L.Callback]:
        # Exact resume and train/tokens_per_s belong to training this module, not to a config:
        # added here, once per trainer (a second fit or test would replace them, with a message).
        attached = self._trainer.callbacks if self._trainer is not None else []
        ours = (self._resume, self._throughput)
        return [c for c in ours if not any(a is c for a in attached)]

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # After ExactResume's hook, whose "rng" and "precision" entries it keeps
        # (seq2seq.checkpoint.format).
        resume = checkpoint.pop(CHECKPOINT_KEY, {})
        extra: dict[str, Any] = {"model_config": self.model_config}
        extra.update({k: resume[k] for k in ("rng", "precision") if resume.get(k) is not None})
        if self.tokenizer is not None:
            extra["tokenizer"] = tokenizer_tensor(self.tokenizer.to_bytes())
        if self.initialised_from is not None:
            extra[INIT_FROM] = self.initialised_from
        if self.origin is not None:
            extra[ORIGIN] = self.origin
        if self._trainer is not None and self.trainer.state.fn == "fit":
            configs, optimizers = self.trainer.lr_scheduler_configs, self.trainer.optimizers
            extra[SCHEDULE_KEY] = class_name(configs[0].scheduler if configs else None)
            extra[OPTIMIZER_KEY] = class_name(optimizers[0] if optimizers else None)
        checkpoint[CHECKPOINT_KEY] = extra
        logger = self._trainer.logger if self._trainer is not None else None
        if logger is not None and isinstance(getattr(logger, "version", None), int):
            # Where this run logs: a resumed fit continues the same folder (seq2seq.cli),
            # unless resumed from a copy of the checkpoints, written to another folder.
            folder = getattr(self.trainer.checkpoint_callback, "dirpath", None)
            extra["log"] = {"name": logger.name, "version": logger.version,
                            "checkpoint_dir": local_folder(folder)}  # fmt: skip

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._checkpoint_label = checkpoint_label(checkpoint)  # names validate/test outputs
        fitting = self._trainer is not None and self.trainer.state.fn == "fit"
        # Before Lightning loads the schedule's state into this run's (a subclass's own
        # configure_optimizers is its own business).
        own = type(self).configure_optimizers is TranslationModule.configure_optimizers
        if fitting and own and self._stand_ins is not None:
            check_resumed_training(checkpoint, *self._stand_ins)
        self.initialised_from = (checkpoint.get(CHECKPOINT_KEY) or {}).get(INIT_FROM)
        self.origin = (checkpoint.get(CHECKPOINT_KEY) or {}).get(ORIGIN)
        check_model_settings(checkpoint, self.model_config)
        tokenizer = tokenizer_from_checkpoint(checkpoint)
        if tokenizer is not None:
            check_vocab_size(tokenizer, self.config.vocab_size, "the checkpoint's tokenizer")
            check_same_tokenizer(tokenizer, self.tokenizer)
            self.tokenizer = tokenizer
        if TRAINING_WEIGHTS in checkpoint and fitting:  # written with seq2seq.callbacks.EMA
            train_on_training_weights(checkpoint, self.trainer.callbacks)

    # ------------------------------------------------------------------ training
    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, src_mask=None) -> torch.Tensor:
        """Logits ``(B, T, V)`` for source ``(B, S)`` and shifted target input ``(B, T)``."""
        return self.model(src, tgt_in, src_mask)

    def _loss_sums(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # collate's non-padding target positions; not under compile, where their varying number
        # would mean varying shapes.
        index = None if self.hparams.compile else batch.get("tgt_index")
        target, smoothing, pad = batch["tgt_out"], self.hparams.label_smoothing, self.model.pad_id
        if index is None or not fast.is_enabled("fused_loss"):
            logits = self._forward(batch["src"], batch["tgt_in"], batch["src_mask"])
            loss_sum, nll_sum = label_smoothed_cross_entropy(
                logits, target, smoothing, ignore_index=pad
            )
        else:
            # Eager path (seq2seq.nn.fast): decoder states at the real target positions only,
            # and the output projection fused with the loss (the (N, V) logits are never
            # materialised); the feed-forward sub-layers skip padding rows too.
            rows = fast.is_enabled("real_rows")
            src_index = batch.get("src_index") if rows else None
            if rows:  # fewer row counts for oneDNN's bfloat16 kernels (fast.row_buckets)
                weight = self.model.output_weight
                index = fast.bucket_index(index, target.numel(), weight)
                if src_index is not None:
                    src_index = fast.bucket_index(src_index, batch["src"].numel(), weight)
            hidden = self.model.features(
                batch["src"],
                batch["tgt_in"],
                batch["src_mask"],
                index,
                src_index=src_index,
                tgt_index=index if rows else None,
            )
            real_targets = target.reshape(-1).index_select(0, index)
            loss_sum, nll_sum = linear_label_smoothed_cross_entropy(
                hidden,
                self.model.output_weight,
                real_targets,
                smoothing,
                ignore_index=pad,
                bias=self.model.output_bias,
            )
        return loss_sum, nll_sum, (target != pad).sum()

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        """The batch's label-smoothed loss summed over its target tokens (times
        ``accumulate_grad_batches``, which Lightning divides by), not a mean: the gradients are
        divided by the optimizer step's token count before clipping and the update
        (:class:`~seq2seq.train_step.StepWindow`); ``train/loss`` logs the mean per token."""
        loss_sum, nll_sum, n_tokens = self._loss_sums(batch)
        tokens = int(batch["n_tokens"])  # a Python int from collate: no device sync
        pad = self.model.pad_id
        positions = batch["src"].numel() + batch["tgt_out"].numel()
        real = (batch["src"] != pad).sum() + n_tokens
        self.log("train/padding", 1.0 - real.float() / positions, batch_size=tokens)
        accumulate = self.trainer.accumulate_grad_batches
        return self._window.add(loss_sum, nll_sum, n_tokens, batch_idx, batch["index"], accumulate)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        values = self._window.close(self.parameters(), self.trainer, self.checkpoint_dir)
        self.log("train/loss", values.pop("train/loss"), prog_bar=True)
        self.log("train/nll", values.pop("train/nll"))
        self.log("train/ppl", values.pop("train/ppl"))
        # The learning rate this step is taken with (the scheduler moves it on afterwards).
        self.log("train/lr", float(optimizer.param_groups[0]["lr"]), prog_bar=True)
        for name, value in values.items():  # train/grad_norm
            self.log(name, value)

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Lightning's clipping, which under ``bf16-mixed`` also clips for an optimizer that
        would unscale gradients in its own step (``AdamW(fused=True)``): Lightning refuses that
        pair under every mixed precision, though bf16 has no gradient scaler (Lightning issue
        21435). Under ``16-mixed`` the refusal stands: the scaled gradients are not clipped."""
        plugin = self.trainer.precision_plugin
        if (
            gradient_clip_val
            and type(plugin) is MixedPrecision
            and plugin.scaler is None
            and getattr(optimizer, "_step_supports_amp_scaling", False)
        ):
            algorithm = GradClipAlgorithmType(gradient_clip_algorithm or "norm")
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val, algorithm)
            return
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self):
        optimizer = self.optimizer_factory(self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        self._run_length = set_schedule_length(scheduler, self._trainer)
        schedule = lightning_schedule(scheduler, self.metrics)
        if self._trainer is not None and self.trainer.state.fn == "fit":
            check_plateau_monitor(schedule, self._pair_names())
        return {"optimizer": optimizer, "lr_scheduler": schedule}

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        # A ReduceLROnPlateau steps after each validation instead (on_validation_epoch_end).
        if not isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            super().lr_scheduler_step(scheduler, metric)

    # ------------------------------------------------------------------ decoding
    def translate_batch(
        self,
        batch: dict[str, Any],
        beam_size: int | None = None,
        n_best: int = 1,
        tgt_lang: str | None = None,
        scores: bool = True,
        **decoding: Any,
    ) -> list[list[tuple[str, float]]]:
        """Decode a batch of sources into detokenized text
        (:func:`seq2seq.text_decoding.decode_batch`) with :attr:`decoding`, overridden by this
        call's settings; ``sampling`` applies outside a ``Trainer`` and in ``predict`` only.

        Args:
            batch: a collated batch with ``src`` ``(B, S)`` long and ``src_mask``
                ``(B, 1, 1, S)`` bool.
            beam_size: ``None``: that of :attr:`decoding`; 1 is greedy.
            n_best: hypotheses returned per sentence (at most the beam size).
            tgt_lang: the target language, for a tokenizer that forces it as the first
                decoder token (NLLB); ``None``: the tokenizer's own.
            scores: ``False``: greedy search skips the log-softmax, its scores are ``nan``.
            **decoding: other :class:`~seq2seq.nn.DecodingConfig` fields.

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
        return decode_batch(self.model, self.tokenizer, batch, config, n_best, tgt_lang, scores)

    def _held_out_step(self, batch: dict[str, Any], key: str, beam: int | None) -> None:
        sums = self._loss_sums(batch)
        lang = self._decoding_lang(self._tgt_lang(key))
        hyps = self.translate_batch(batch, beam_size=beam, tgt_lang=lang, scores=False)
        best = [n_best[0][0] for n_best in hyps]
        refs = batch.get("ref_text") or [""] * len(best)
        self._held_out.add(key, sums, batch["index"].tolist(), best, refs)

    def validation_step(
        self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        beam = self.hparams.val_beam_size if self.trainer.state.fn == "fit" else None
        self._held_out_step(batch, self._loader_key(dataloader_idx, "val"), beam)

    def test_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        self._held_out_step(
            batch, self._loader_key(dataloader_idx, f"test/set{dataloader_idx}"), None
        )

    def _loader_key(self, dataloader_idx: int, fallback: str) -> str:
        # fallback: loaders given to the trainer directly, without a data module to name them
        keys = self._heldout_keys
        return keys[dataloader_idx] if dataloader_idx < len(keys) else fallback

    def predict_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0):
        """Returns a list of ``(index, [(text, score), ...])`` for the batch's sentences."""
        datamodule = getattr(self.trainer, "datamodule", None)
        lang = self._decoding_lang(getattr(datamodule, "tgt_lang", None))
        hyps = self.translate_batch(batch, n_best=self.n_best, tgt_lang=lang)
        return list(zip(batch["index"].tolist(), hyps, strict=True))

    def _datamodule_keys(self, stage: str) -> list[str]:
        """The held-out key of each loader of ``stage`` (``"validate"``, ``"test"``): the data
        module's ``heldout_keys``, else one pair's (``val``; ``test/<set>`` per
        ``test_set_names``)."""
        datamodule = getattr(self.trainer, "datamodule", None)
        keys = getattr(datamodule, "heldout_keys", None)
        if keys is not None:
            return list(keys(stage))
        if stage == "validate":
            return ["val"]
        return [f"test/{name}" for name in getattr(datamodule, "test_set_names", None) or []]

    def _tgt_lang(self, key: str) -> str | None:
        """The target language of held-out set ``key``, which picks sacreBLEU's tokenizer."""
        tgt_lang = getattr(getattr(self.trainer, "datamodule", None), "heldout_tgt_lang", None)
        return tgt_lang(key) if tgt_lang is not None else self.hparams.tgt_lang

    def _decoding_lang(self, lang: str | None) -> str | None:
        """The tokenizer's name of target language ``lang`` (NLLB's ``eng_Latn`` for ``en``),
        which decoding is told; ``None`` (its default) where it has no token for it."""
        tokenizer = self.tokenizer
        return tokenizer.language_name(lang) if tokenizer is not None else None

    def _pair_names(self) -> list[str]:
        return list(getattr(getattr(self.trainer, "datamodule", None), "pair_names", None) or [])

    # ------------------------------------------------------------------ scoring
    def on_validation_epoch_start(self) -> None:
        self._held_out.reset()
        self._heldout_keys = self._datamodule_keys("validate")

    def on_test_epoch_start(self) -> None:
        self._held_out.reset()
        self._heldout_keys = self._datamodule_keys("test")

    def on_validation_epoch_end(self) -> None:
        self._score_held_out()
        if self._logged and self.trainer.state.fn == "fit":  # before the checkpoints are written
            step_plateau_schedules(self.trainer.lr_scheduler_configs, self._logged)
        self._resume.validation_scored()

    def on_test_epoch_end(self) -> None:
        scores = self._score_held_out()
        if not scores:
            return
        # test/<metric>: the first test set's, with several pairs the mean over its pairs.
        pairs = self._pair_names()
        for name, value in next(iter(set_means(scores, pairs).values())).items():
            self.log(f"test/{name}", value, add_dataloader_idx=False)
        if len(scores) > 1 and self.trainer.global_rank == 0:
            self.print(score_table(scores, pairs))

    def _score_held_out(self) -> dict[str, dict[str, Score]]:
        """Logs ``<key>/loss``, ``/nll``, ``/ppl`` and the metrics of every held-out set decoded
        (none in the sanity check), scored in the set's target language, and writes its report
        (:func:`.evaluation.write_report`). With one validation set per pair (``val/<pair>``),
        ``val/*`` is their unweighted mean: each direction counts the same, whatever its
        length or sacreBLEU tokenizer (``val/ppl`` is ``exp`` of the mean ``val/nll``)."""
        trainer, strategy, results = self.trainer, self.trainer.strategy, {}
        pairs, per_pair = self._pair_names(), []
        self._logged = {}
        for key, ordered in self._held_out.gathered(self._heldout_keys):
            self.last_hypotheses[key] = ordered
            if trainer.sanity_checking:
                continue
            loss, nll = self._held_out.loss(key, lambda t: strategy.reduce(t, reduce_op="sum"))
            hyps, refs = [hyp for _, hyp, _ in ordered], [ref for _, _, ref in ordered]
            scores = corpus_scores(hyps, refs, self.metrics, tgt_lang=self._tgt_lang(key))
            values = {name: score.value for name, score in scores.items()}
            of_pair = key.startswith("val/") or split_test_key(key, pairs)[0] is not None
            self._log_set(key, loss, nll, values, prog_bar=not of_pair)  # the means' instead
            if key.startswith("val/"):
                per_pair.append((loss, nll, values))
            results[key] = scores
            write_report(trainer, key, ordered, scores, self._checkpoint_label, self.print)
        if per_pair:
            n = len(per_pair)
            loss, nll = (sum(p[i] for p in per_pair) / n for i in (0, 1))
            means = {name: sum(p[2][name] for p in per_pair) / n for name in per_pair[0][2]}
            self._log_set("val", loss, nll, means, prog_bar=True)
            if n > 1 and trainer.global_rank == 0:  # the scores that pick the best checkpoint
                values = ", ".join(f"val/{name} {value:.2f}" for name, value in means.items())
                self.print(f"val: the mean of {n} pairs: {values}")
        self._held_out.reset()
        self.last_scores = results
        return results

    def _log_set(
        self,
        key: str,
        loss: torch.Tensor,
        nll: torch.Tensor,
        metrics: dict[str, float],
        prog_bar: bool,
    ) -> None:
        """Logs ``<key>/loss``, ``/nll``, ``/ppl`` and ``/<metric>`` (``<key>/bleu`` in the
        progress bar if ``prog_bar``), and keeps them in ``_logged``."""
        ppl = torch.exp(nll.clamp(max=50))
        values = {"loss": loss.float(), "nll": nll.float(), "ppl": ppl.float(), **metrics}
        for name, value in values.items():
            bar = prog_bar and name == "bleu"
            self.log(f"{key}/{name}", value, prog_bar=bar, add_dataloader_idx=False)
            self._logged[f"{key}/{name}"] = float(value)
