"""The "did you mean" of an unrecognised option, a config key or a command: one leaf module,
for the LightningCLI commands (:mod:`seq2seq.cli.messages`) and the plain ones
(:mod:`seq2seq.commands`) alike."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean"]


#: Options of fairseq and Hugging Face's ``Seq2SeqTrainingArguments`` by name (dashes as
#: underscores), and what does their work here: the first whose option a command has is named.
ELSEWHERE: dict[str, tuple[str, ...]] = {
    "lr": ("--model.optimizer.init_args.lr",),
    "learning_rate": ("--model.optimizer.init_args.lr",),
    "weight_decay": ("--model.optimizer.init_args.weight_decay",),
    "adam_betas": ("--model.optimizer.init_args.betas",),
    "warmup_updates": ("--model.lr_scheduler.init_args.warmup_steps",),
    "warmup_steps": ("--model.lr_scheduler.init_args.warmup_steps",),
    "update_freq": ("--trainer.accumulate_grad_batches",),
    "gradient_accumulation_steps": ("--trainer.accumulate_grad_batches",),
    "clip_norm": ("--trainer.gradient_clip_val",),
    "max_grad_norm": ("--trainer.gradient_clip_val",),
    "share_all_embeddings": ("--model.tie_embeddings all",),
    "share_decoder_input_output_embed": ("--model.tie_embeddings decoder",),
    "max_update": ("--trainer.max_steps",),
    "max_epoch": ("--trainer.max_epochs",),
    "num_train_epochs": ("--trainer.max_epochs",),
    "save_dir": ("--checkpoint_dir",),
    "output_dir": ("--checkpoint_dir",),
    "seed": ("--seed_everything", "--sampling_seed"),
    "fp16": ("--trainer.precision 16-mixed",),
    "bf16": ("--trainer.precision bf16-mixed", "--dtype bfloat16"),
    "beam": ("--model.decoding.beam_size", "--beam_size"),
    "num_beams": ("--model.decoding.beam_size", "--beam_size"),
    "lenpen": ("--model.decoding.length_penalty", "--length_penalty"),
    "nbest": ("--n_best",),
    "validate_interval_updates": ("--trainer.val_check_interval",),
    "batch_size": ("--data.max_tokens", "--max_tokens"),
    "per_device_train_batch_size": ("--data.max_tokens",),
    "per_device_eval_batch_size": ("--data.eval_max_tokens", "--max_tokens"),
    "early_stopping_patience": ("--patience",),
    "eval_steps": ("--trainer.val_check_interval",),
    "logging_steps": ("--trainer.log_every_n_steps",),
    "resume_from_checkpoint": ("--ckpt_path last",),
    "label_smoothing_factor": ("--model.label_smoothing",),
    # a fixed limit: no part of it in proportion to the source
    "max_new_tokens": (
        "--model.decoding.max_len_a 0 --model.decoding.max_len_b N",
        "--max_len_a 0 --max_len_b N",
    ),
    "generation_max_length": (
        "--model.decoding.max_len_a 0 --model.decoding.max_len_b N",
        "--max_len_a 0 --max_len_b N",
    ),
    "num_return_sequences": ("--n_best", "--prediction_writer.n_best"),
    "max_source_length": ("--data.max_positions",),
    "source_lang": ("--data.src_lang", "--src_lang"),
    "target_lang": ("--data.tgt_lang", "--tgt_lang"),
}


def elsewhere(name: str, candidates: Iterable[str]) -> str | None:
    """What does the work of another toolkit's option ``name`` (:data:`ELSEWHERE`) among the
    options ``candidates`` (a class's arguments count by the class's option,
    ``--model.optimizer`` for ``--model.optimizer.init_args.lr``), or None."""
    options = set(candidates)
    for target in ELSEWHERE.get(name.lstrip("-").replace("-", "_"), ()):
        option = target.split()[0]
        if option in options or option.split(".init_args.")[0] in options:
            return target
    return None


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`` (did you mean X?)`` with the closest of ``candidates`` to ``name``, or ``""``; an
    option of another toolkit is answered with what does its work here (:func:`elsewhere`)."""
    candidates = list(dict.fromkeys(candidates))
    target = elsewhere(name, candidates) if name.startswith("-") else None
    if target is not None:
        return f" (did you mean {target}?)"
    last = name.lstrip("-").rsplit(".", 1)[-1]
    # the same last part: --trainer.max_epochs for --max_epochs or --model.max_epochs
    matches = [c for c in candidates if c != name and c.lower() == name.lower()]  # FR for fr
    if not matches:
        matches = [c for c in candidates if c != name and c.rsplit(".", 1)[-1] == last]
    if not matches:  # else the options it abbreviates: --beam_size for --beam
        matches = [c for c in candidates if c != name and c.startswith(name)]
    if not matches:  # else the options it ends: sampling_topp for topp
        matches = [c for c in candidates if c != name and c.endswith("_" + last)]
    if not matches:  # else similar spellings, not counting the group it names (--data.foo)
        others = [c for c in candidates if not name.startswith(c + ".")]
        matches = difflib.get_close_matches(name, others, n=3, cutoff=0.75)
        ratio = [difflib.SequenceMatcher(None, name, m).ratio() for m in matches]
        # only the spellings about as close as the closest (not --model.n_samples beside
        # --model.d_model for --model.d_modle)
        matches = [m for m, r in zip(matches, ratio, strict=True) if r >= ratio[0] - 0.1]
    return f" (did you mean {' or '.join(matches[:3])}?)" if matches else ""
