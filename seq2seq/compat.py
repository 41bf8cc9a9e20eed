"""Every access to a private attribute of Lightning, jsonargparse, argparse, datasets or torch.

seq2seq reads or sets a few attributes that these libraries do not document, where their
public API has no way to get the same behaviour. Each one is reached through a function here,
with a comment naming the upstream behaviour it works around, so that an upgrade that renames
or removes one breaks in one file, and ``tests/test_compat.py`` (one contract test per
accessor) says which. ``pyproject.toml`` bounds ``lightning`` and ``jsonargparse`` to the minor
versions these tests passed with.

Nothing here imports Lightning at module level: the plain commands (``translate``,
``average``, ``export``) start without it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

# ------------------------------------------------------------------------ Lightning trainer


def _epoch_loop(trainer: Any) -> Any:
    return getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)


def logged_step(trainer: Any) -> int:
    """The step Lightning's loggers write the values of this moment at.

    Lightning counts the optimizer steps finished before the current batch in the private
    ``_TrainingEpochLoop._batches_that_stepped`` (during a validation in ``fit`` one below
    ``trainer.global_step``) and has no public accessor for it; the TensorBoard images and
    texts of :mod:`seq2seq.callbacks` must land at the step of the ``val/*`` scalars.
    Outside ``fit``: ``trainer.global_step``.
    """
    return getattr(_epoch_loop(trainer), "_batches_that_stepped", trainer.global_step)


def set_logged_step(trainer: Any, step: int) -> None:
    """Sets the count of :func:`logged_step` (``_batches_that_stepped``).

    Lightning adds one to the count it restores from a checkpoint written inside a batch
    (Ctrl-C), which would log every later value one step late; ``LastCheckpoint`` lowers it
    while it writes such a checkpoint and puts it back after.
    """
    _epoch_loop(trainer)._batches_that_stepped = step


def add_to_saved_logged_step(checkpoint: dict[str, Any], steps: int) -> None:
    """Adds ``steps`` to the :func:`logged_step` count a checkpoint dict records.

    Lightning writes the count under the private key ``_batches_that_stepped`` of
    ``loops.fit_loop."epoch_loop.state_dict"``; a checkpoint written during the validation
    that a stop request added after the last batch is written before Lightning counted that
    batch, and a resumed run would log every value one step early. No-op for a checkpoint
    without loop state.
    """
    loop = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.state_dict")
    if loop is not None:
        loop["_batches_that_stepped"] = loop.get("_batches_that_stepped", 0) + steps


def accumulating(trainer: Any) -> bool:
    """Whether the batch just trained is not the last of its gradient-accumulation window.

    Lightning decides this in the private ``_TrainingEpochLoop._should_accumulate()``; a
    graceful stop (SIGTERM, Ctrl-C) inside a window would lose the window's gradients, so
    ``LastCheckpoint`` holds it back to the window's end.
    """
    return bool(_epoch_loop(trainer)._should_accumulate())


def logs_written_now(trainer: Any) -> bool:
    """Whether the values logged in this training batch go to the loggers at its end.

    Lightning's private ``_LoggerConnector.should_update_logs`` (``log_every_n_steps``); the
    ``train/tokens_per_s`` window of :class:`~seq2seq.callbacks.throughput.TokenThroughput`
    restarts at each written value, as fairseq's ``wps`` does. ``True`` where it cannot tell.
    """
    connector = getattr(trainer, "_logger_connector", None)
    return bool(getattr(connector, "should_update_logs", True))


def val_check_time_interval(trainer: Any) -> Any:
    """The time-based ``val_check_interval`` (a ``timedelta``-like value), else ``None``.

    Lightning keeps a ``val_check_interval`` given as a time in the private
    ``Trainer._val_check_time_interval``; the mirror of Lightning's "is a validation due" check
    in :mod:`seq2seq.callbacks.resume` needs it.
    """
    return getattr(trainer, "_val_check_time_interval", None)


def sigterm_received(trainer: Any) -> bool | None:
    """Whether Lightning's graceful stop on SIGTERM is pending (``None``: no such machinery).

    The flag is ``_SignalConnector.received_sigterm`` of the private ``Trainer._signal_connector``;
    Lightning checks it after each training batch and then stops with a checkpoint.
    """
    connector = getattr(trainer, "_signal_connector", None)
    return None if connector is None else bool(connector.received_sigterm)


def set_sigterm_received(trainer: Any, received: bool) -> bool:
    """Sets the flag of :func:`sigterm_received`: ``True`` asks Lightning to stop gracefully
    after this batch (used for Ctrl-C inside a batch, which Lightning would otherwise cut
    short), ``False`` holds a SIGTERM back to the end of an accumulation window.

    Returns:
        Whether the trainer has the flag (``False``: nothing was set).
    """
    connector = getattr(trainer, "_signal_connector", None)
    if connector is None:
        return False
    connector.received_sigterm = received
    return True


class SkipCheckpointHparams:
    """A LightningCLI mixin that turns off LightningCLI's private ``_parse_ckpt_path``.

    LightningCLI 2.x loads the whole ``--ckpt_path`` file (``torch.load``) right after parsing
    and merges its ``hyper_parameters`` into the ``model`` config, decoding settings included;
    seq2seq takes only the architecture from the checkpoint (read once, memory-mapped) in the
    public ``before_instantiate_classes`` hook, and the config's decoding settings. There is
    no public switch for Lightning's merge.
    """

    def _parse_ckpt_path(self) -> None:
        """Does nothing (see the class)."""


def subcommand_parsers(cli: Any) -> dict[str, Any]:
    """The parser of each LightningCLI subcommand (``fit``, ``validate``, ...).

    LightningCLI keeps them in the private ``_subcommand_parsers``; seq2seq rewords their help
    and reports argument errors through the subcommand's parser.
    """
    return cli._subcommand_parsers


# ----------------------------------------------------------------- argparse / jsonargparse


def parser_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """argparse's private ``_actions`` list (every argument, in order); argparse offers no
    public list, and the help rewording and error messages of :mod:`seq2seq.cli` walk it."""
    return parser._actions


def option_strings(parser: argparse.ArgumentParser) -> Iterable[str]:
    """Every option string of ``parser`` (argparse's private ``_option_string_actions``), for
    the "did you mean" of an unrecognised option."""
    return parser._option_string_actions.keys()


def action_groups(parser: argparse.ArgumentParser) -> list[Any]:
    """argparse's private ``_action_groups`` (the ``--help`` sections), to retitle the
    section LightningCLI names after the first sentence of a Trainer method's docstring."""
    return parser._action_groups


def subcommand_choice_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The one-line help entries of the subcommands (argparse's private ``_choices_actions``
    of the subparsers action), reworded in seq2seq's terms."""
    return [c for a in parser._actions for c in getattr(a, "_choices_actions", [])]


def subcommand_names(parser: Any) -> list[str]:
    """The subcommands of a jsonargparse parser (its private ``_subcommands_action``), or
    ``[]`` for a parser without subcommands; for the "unknown command" error."""
    action = getattr(parser, "_subcommands_action", None)
    return [] if action is None else list(action.choices)


def subcommand_parser(parser: Any, name: str) -> Any:
    """The parser of subcommand ``name`` of a jsonargparse ``parser`` (from its private
    ``_subcommands_action``), or ``None``."""
    action = getattr(parser, "_subcommands_action", None)
    return None if action is None else action.choices.get(name)


def error_parser(ex: Exception | None, parser: Any) -> Any:
    """The parser whose arguments an error ``ex`` is about: jsonargparse attaches the
    subcommand's parser to the exception as ``subcommand_parser`` (undocumented) when the
    error is in a subcommand's arguments; else ``parser``."""
    return getattr(ex, "subcommand_parser", None) or parser


def parser_logger(parser: Any) -> Any:
    """jsonargparse's private ``_logger`` of ``parser`` (``JSONARGPARSE_DEBUG``'s log), which
    its own ``error`` writes to and ``Seq2SeqArgumentParser.error`` keeps writing to."""
    return parser._logger


@contextmanager
def print_config_skipped() -> Iterator[None]:
    """A parse within which jsonargparse does not print ``--print_config``'s config (nor
    exit); :func:`print_config_if_requested` prints it afterwards.

    jsonargparse prints inside ``parse_args`` and exits, so the command-line shortcuts that
    rewrite the config after the parse (``--patience``, ``--checkpoint_dir``) would be missing
    from what it prints. Its private ``_ActionPrintConfig`` skips and prints on request; there
    is no public hook between the two.
    """
    from jsonargparse._actions import _ActionPrintConfig

    with _ActionPrintConfig.skip_print_config():
        yield


def print_config_if_requested(parser: Any, config: Any) -> None:
    """Prints ``config`` as ``--print_config`` asked (its flags, its subcommand's part) and
    exits, if the command line of the parse that ``parser`` (the root parser) made under
    :func:`print_config_skipped` asked for it; else does nothing."""
    from jsonargparse._actions import _ActionPrintConfig

    _ActionPrintConfig.print_config_if_requested(parser, config)


def action_typehint(action: argparse.Action) -> Any:
    """The type hint a jsonargparse argument parses with (``ActionTypeHint._typehint``,
    private); ``None`` for other actions."""
    return getattr(action, "_typehint", None)


def set_action_typehint(action: argparse.Action, typehint: Any) -> None:
    """Replaces the type hint of a jsonargparse argument (see :func:`action_typehint`).

    Works around typing's union cache: Lightning annotates ``limit_*_batches``
    ``Optional[Union[int, float]]``, and where ``Optional[Union[float, int]]`` was built first
    the annotation lists ``float`` first, so jsonargparse parses ``1`` as ``1.0`` (all
    batches). jsonargparse has no public way to retype an argument a class signature added.
    """
    action._typehint = typehint


# ------------------------------------------------------------------------ datasets / torch


def dataset_fingerprint(dataset: Any) -> str:
    """The content fingerprint of a ``datasets.Dataset`` (its private ``_fingerprint``),
    which changes with every transform: part of the key of the tokenised cache, so a Hub
    dataset that changed is tokenised again. ``datasets`` has no public accessor."""
    return dataset._fingerprint


def foreach_mul_(tensors: Sequence[Any], scalar: Any) -> None:
    """``tensors[i] *= scalar`` for every tensor, in one fused kernel per device and dtype
    (``torch._foreach_mul_``, underscored but used by torch's own optimizers and
    ``clip_grad_norm_``)."""
    import torch

    torch._foreach_mul_(list(tensors), scalar)


def foreach_norm(tensors: Sequence[Any]) -> list[Any]:
    """The 2-norm of every tensor in one fused kernel per device and dtype
    (``torch._foreach_norm``, as ``torch.nn.utils.clip_grad_norm_`` uses it)."""
    import torch

    return list(torch._foreach_norm(list(tensors)))


def foreach_lerp_(tensors: Sequence[Any], ends: Sequence[Any], weight: float) -> None:
    """``tensors[i] += weight * (ends[i] - tensors[i])`` for every pair, in one fused kernel per
    device and dtype (``torch._foreach_lerp_``, as ``torch.optim.swa_utils.get_ema_multi_avg_fn``
    uses it); ``weight`` a Python float, so no value is read back from the device."""
    import torch

    torch._foreach_lerp_(list(tensors), list(ends), weight)
