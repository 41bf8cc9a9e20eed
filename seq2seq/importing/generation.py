"""A Hugging Face folder's decoding settings (``generation_config.json``, else the same keys of
``config.json``) as a :class:`seq2seq.nn.DecodingConfig`, with what is not carried, in words.

Where the meanings match (:class:`~seq2seq.nn.DecodingConfig` documents ours):

* ``num_beams`` -> ``beam_size``;
* ``length_penalty`` -> ``length_penalty`` with ``length_penalty_form="fairseq"``:
  ``generate``'s beam search divides a hypothesis' summed log-probability by
  ``len ** length_penalty``, ``len`` its generated tokens with EOS, as ours;
* ``min_length`` (which counts the decoder start token) -> ``min_len = min_length - 1``;
  ``min_new_tokens`` -> ``min_len``;
* ``max_length`` / ``max_new_tokens`` shorter than the model -> the fixed limit
  ``max_len_a = 0``, ``max_len_b = max_length - 1`` (or ``max_new_tokens``); a limit of the
  whole model length (OPUS-MT's 512) is none, and our ``max_len_a * src_len + max_len_b``
  stays;
* ``no_repeat_ngram_size``, ``repetition_penalty`` (counted and applied as the field says);
* ``bad_words_ids`` / ``suppress_tokens`` of the padding and unknown tokens alone: our
  searches never generate padding, and a banned unknown token is ``disable_unk``;
* ``do_sample`` with ``top_k``, ``top_p``, ``temperature`` -> ``sampling`` and its fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from seq2seq.nn import DecodingConfig

__all__ = ["decoding_settings"]

#: Keys that decide nothing here: token ids the tokenizer maps, bookkeeping.
_IGNORED = frozenset(
    {
        "_from_model_config",
        "transformers_version",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "decoder_start_token_id",
        "forced_bos_token_id",  # the target language: the tokenizer's tgt_lang
        "use_cache",
        "output_scores",
        "return_dict_in_generate",
        "output_attentions",
        "output_hidden_states",
        "num_return_sequences",
        "is_assistant",
    }
)

#: Hugging Face's defaults of the keys that change decoding: a key at its default says
#: nothing to carry.
_DEFAULTS: dict[str, Any] = {
    "num_beams": 1,
    "length_penalty": 1.0,
    "early_stopping": False,
    "max_length": 20,
    "max_new_tokens": None,
    "min_length": 0,
    "min_new_tokens": None,
    "no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "do_sample": False,
    "top_k": 50,
    "top_p": 1.0,
    "temperature": 1.0,
    "forced_eos_token_id": None,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "encoder_no_repeat_ngram_size": 0,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "exponential_decay_length_penalty": None,
    "renormalize_logits": False,
    "remove_invalid_values": False,
    "max_time": None,
}


def decoding_settings(
    generation: Mapping[str, Any],
    config: Mapping[str, Any],
    pad_id: int,
    max_positions: int,
    unk_id: int | None = None,
) -> tuple[DecodingConfig, list[str]]:
    """Our decoding settings for a folder.

    Args:
        generation: ``generation_config.json`` (``{}``: the decoding keys of ``config.json``
            are read instead, as ``generate`` does for older folders).
        config: ``config.json``.
        pad_id: the source's padding id (Hugging Face numbering).
        max_positions: the model's positions (a length limit at it is no limit).
        unk_id: the source's unknown-token id (Hugging Face numbering), if it has one.

    Returns:
        ``(settings, notes)``: ``notes`` says, one entry per key, what was not carried and why.
    """
    source = dict(generation) if generation else {k: config[k] for k in _DEFAULTS if k in config}
    given = {
        k: v
        for k, v in source.items()
        if k not in _IGNORED and (k not in _DEFAULTS or v != _DEFAULTS[k])
    }
    fields: dict[str, Any] = {"length_penalty_form": "fairseq"}
    notes: list[str] = []

    def note(key: str, why: str) -> None:
        notes.append(f"{key}={given[key]!r} ({why})")

    if "num_beams" in given:
        fields["beam_size"] = int(given.pop("num_beams"))
    if "length_penalty" in given:
        fields["length_penalty"] = float(given.pop("length_penalty"))
    if "no_repeat_ngram_size" in given:
        fields["no_repeat_ngram_size"] = int(given.pop("no_repeat_ngram_size"))
    if "repetition_penalty" in given:
        fields["repetition_penalty"] = float(given.pop("repetition_penalty"))
    if given.get("min_new_tokens") is not None:
        fields["min_len"] = int(given.pop("min_new_tokens"))
        given.pop("min_length", None)
    elif "min_length" in given:
        fields["min_len"] = max(0, int(given.pop("min_length")) - 1)
    limit = given.get("max_new_tokens")
    key = "max_new_tokens"
    if limit is None and "max_length" in given:
        limit, key = int(given["max_length"]) - 1, "max_length"
    if limit is not None:
        # max_length counts the decoder start token: max_positions - 1 generated tokens fill
        # every position of the model.
        if limit < max_positions - 1:
            fields["max_len_a"], fields["max_len_b"] = 0.0, int(limit)
        else:
            note(
                key,
                "the model's whole length, no limit: seq2seq keeps its own, max_len_a * "
                "src_len + max_len_b",
            )
        given.pop("max_new_tokens", None)
        given.pop("max_length", None)
    for key in ("bad_words_ids", "suppress_tokens"):
        banned = _single_tokens(given.get(key))
        if banned and banned <= {pad_id, unk_id}:
            given.pop(key)  # our searches never generate the padding token
            if unk_id in banned:  # nor, with disable_unk, the unknown one
                fields["disable_unk"] = True
    if given.pop("do_sample", False):
        fields["sampling"] = True
        for theirs, ours in (
            ("top_k", "sampling_topk"),
            ("top_p", "sampling_topp"),
            ("temperature", "temperature"),
        ):
            if theirs in given:
                fields[ours] = given.pop(theirs)
    else:
        for theirs in ("top_k", "top_p", "temperature"):
            given.pop(theirs, None)  # read by sampling only
    if "forced_eos_token_id" in given:
        note(
            "forced_eos_token_id",
            "generate forces EOS at the length limit; a seq2seq hypothesis that reaches it "
            "ends without one",
        )
        given.pop("forced_eos_token_id")
    if "early_stopping" in given:
        note("early_stopping", "seq2seq's beam search stops as generate's does with False")
        given.pop("early_stopping")
    for key in sorted(given):
        note(key, "no seq2seq decoding setting")
    return DecodingConfig(**fields), notes


def _single_tokens(value: Any) -> set[int] | None:
    """The ids that ``suppress_tokens`` (ids) or ``bad_words_ids`` (id sequences) ban where
    each entry is one token, else ``None``."""
    if not isinstance(value, list):
        return None
    ids = [v[0] if isinstance(v, list) and len(v) == 1 else v for v in value]
    return set(ids) if all(isinstance(i, int) for i in ids) else None
