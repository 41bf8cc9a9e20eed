"""The "did you mean" of an unrecognised option, a config key or a command: one leaf module,
for the LightningCLI commands (:mod:`seq2seq.cli.messages`) and the plain ones
(:mod:`seq2seq.commands`) alike."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean"]


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`` (did you mean X?)`` with the closest of ``candidates`` to ``name``, or ``""``."""
    candidates = list(dict.fromkeys(candidates))
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
