"""An exponential moving average (EMA) of the weights during training.

``ema = decay * ema + (1 - decay) * weights`` after every ``every_n_steps``-th optimizer step
from ``start_step`` on (Polyak and Juditsky, 1992; the "exponential smoothing" of Marian,
Junczys-Dowmunt et al. 2018, and OpenNMT-py's ``average_decay``). Validations inside ``fit``
score the averaged weights; checkpoints hold them as ``state_dict``, so ``test``, ``translate``,
``average``, ``export`` and ``--init_from`` take them, and keep the training weights beside them
(:data:`seq2seq.checkpoint.format.TRAINING_WEIGHTS`) for an exact resume.

Lightning's ``EMAWeightAveraging`` is not used: its ``torch.optim.swa_utils.AveragedModel`` reads
an update counter back from the device at every update (a host synchronisation per step),
deep-copies the whole LightningModule, and averages every buffer, integer ones included.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from seq2seq import compat
from seq2seq.checkpoint.format import EMA_KEY, TRAINING_WEIGHTS

__all__ = ["EMA"]


class EMA(L.Callback):
    """Keep an exponential moving average of the model's parameters; validate and save it.

    The average is kept in float32 on the parameters' device, one tensor per parameter
    (``bf16-true`` weights are averaged in float32 too), and updated with fused ``lerp`` kernels
    whose weight is a Python float: no value is read back from the device. Under DDP every
    process holds the same weights, so every process updates the same average without
    communication. The first update copies the weights; before it, validations and checkpoints
    use the training weights as they are.

    Args:
        decay: weight of the old average at each update (the module's formula), in (0, 1);
            the average spans about ``every_n_steps / (1 - decay)`` steps.
        start_step: the first optimizer step (counted from 1) whose weights enter the average.
        every_n_steps: update after every this many optimizer steps (counted from
            ``start_step``), >= 1.

    Raises:
        ValueError: for a ``decay`` outside (0, 1), a negative ``start_step`` or an
            ``every_n_steps`` below 1.
    """

    def __init__(self, decay: float = 0.999, start_step: int = 0, every_n_steps: int = 1) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must lie in (0, 1), got {decay}")
        if start_step < 0:
            raise ValueError(f"EMA start_step must be >= 0, got {start_step}")
        if every_n_steps < 1:
            raise ValueError(f"EMA every_n_steps must be >= 1, got {every_n_steps}")
        self.decay = float(decay)
        self.start_step = int(start_step)
        self.every_n_steps = int(every_n_steps)
        self.updates = 0
        self._params: list[torch.nn.Parameter] = []
        self._keys: list[list[str]] = []  # state-dict keys of each parameter (tied: several)
        self._average: list[torch.Tensor] | None = None
        self._training: list[torch.Tensor] | None = None  # while the average is in the model
        self._last_step = -1
        self._loaded: dict[str, torch.Tensor] | None = None

    # ---------------------------------------------------------------- training
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        keys: dict[int, list[str]] = {}
        for name, tensor in pl_module.state_dict(keep_vars=True).items():
            if isinstance(tensor, torch.nn.Parameter):
                keys.setdefault(id(tensor), []).append(name)
        self._params = [p for p in pl_module.parameters() if id(p) in keys]
        self._keys = [keys[id(p)] for p in self._params]

    def _take_loaded(self) -> None:
        """The average read from a checkpoint, onto the parameters' device (known only once
        the strategy has moved the model, after the checkpoint was read)."""
        if self._loaded is not None:
            self._average = [
                self._loaded[keys[0]].to(p.device, torch.float32).clone()
                for keys, p in zip(self._keys, self._params, strict=True)
            ]
            self._loaded = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        step = trainer.global_step  # optimizer steps taken; unchanged while accumulating
        if step == self._last_step:
            return
        self._last_step = step
        self._take_loaded()
        if step < max(self.start_step, 1) or (step - self.start_step) % self.every_n_steps:
            return
        weights = [p.detach() for p in self._params]
        if self._average is None or self.updates == 0:
            self._average = [w.to(torch.float32, copy=True) for w in weights]
        else:
            if weights[0].dtype != torch.float32:
                weights = [w.float() for w in weights]
            compat.foreach_lerp_(self._average, weights, 1.0 - self.decay)
        self.updates += 1

    # ---------------------------------------------------------------- validation with the EMA
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._take_loaded()
        if trainer.state.fn == "fit" and self._average is not None and self._training is None:
            self._training = [p.detach().clone() for p in self._params]
            self._copy_into_model(self._average)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_training_weights()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exc: Any) -> None:
        self._restore_training_weights()

    def _restore_training_weights(self) -> None:
        if self._training is not None:
            self._copy_into_model(self._training)
            self._training = None

    @torch.no_grad()
    def _copy_into_model(self, values: list[torch.Tensor]) -> None:
        for param, value in zip(self._params, values, strict=True):
            param.copy_(value)

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates, "last_step": self._last_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.updates = int(state_dict.get("updates", 0))
        self._last_step = int(state_dict.get("last_step", -1))

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._take_loaded()
        if self._average is None:
            return
        state = checkpoint["state_dict"]
        weights = dict(state)  # as written: the training weights, unless validating now
        average = dict(state)
        for i, (keys, param) in enumerate(zip(self._keys, self._params, strict=True)):
            current = self._training[i] if self._training is not None else state[keys[0]]
            mean = self._average[i].to(param.dtype)
            for key in keys:
                weights[key] = current
                average[key] = mean
        checkpoint["state_dict"] = average
        checkpoint[TRAINING_WEIGHTS] = weights
        checkpoint[EMA_KEY] = {
            "decay": self.decay,
            "start_step": self.start_step,
            "every_n_steps": self.every_n_steps,
            "updates": self.updates,
        }

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # TranslationModule.on_load_checkpoint has already put the training weights in the model
        # and left the average under EMA_KEY["state_dict"].
        ema = checkpoint.get(EMA_KEY)
        if isinstance(ema, dict) and "state_dict" in ema:
            self._loaded = ema["state_dict"]
            self.updates = int(ema.get("updates", self.updates))
            if (ema.get("decay"), ema.get("start_step"), ema.get("every_n_steps")) != (
                self.decay,
                self.start_step,
                self.every_n_steps,
            ):
                rank_zero_info(
                    f"resuming the weight average of decay {ema.get('decay')}, start_step "
                    f"{ema.get('start_step')}, every_n_steps {ema.get('every_n_steps')} with "
                    f"decay {self.decay}, start_step {self.start_step}, every_n_steps "
                    f"{self.every_n_steps}"
                )
