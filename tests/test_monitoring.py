"""TensorBoard monitoring: scalars, validation samples, attention heatmaps, HPARAMS.

The event file is the one the shared ``tiny_run`` fit (configs/tiny.yaml: 20 steps,
validation every 10) writes to ``lightning_logs/tiny/version_0``.
"""

from __future__ import annotations

import math

import pytest
import torch
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from seq2seq.callbacks import (
    AttentionHeatmaps,
    BestScoreHparams,
    ValidationSamples,
    _escape_markdown,
    plot_attention,
)
from seq2seq.data.corpus import read_lines
from seq2seq.translator import Translator

TRAIN_SCALARS = [
    "train/loss",
    "train/nll",
    "train/ppl",
    "train/lr",
    "train/grad_norm",
    "train/tokens_per_s",
    "train/padding",
]
VAL_SCALARS = ["val/loss", "val/nll", "val/ppl", "val/bleu", "val/chrf"]
N_VALIDATIONS = 2  # max_steps 20, val_check_interval 10


@pytest.fixture(scope="module")
def events(tiny_run) -> EventAccumulator:
    accumulator = EventAccumulator(
        str(tiny_run / "lightning_logs" / "tiny" / "version_0"),
        size_guidance={"scalars": 0, "images": 0, "tensors": 0},
    )
    accumulator.Reload()
    return accumulator


def _values(events: EventAccumulator, tag: str) -> list[float]:
    return [event.value for event in events.Scalars(tag)]


def test_training_scalars_every_log_step(events):
    tags = events.Tags()["scalars"]
    for tag in TRAIN_SCALARS:
        assert tag in tags, f"{tag} missing from {sorted(tags)}"
        steps = [event.step for event in events.Scalars(tag)]
        assert len(steps) >= 3 and steps == sorted(steps), (tag, steps)  # log_every_n_steps 5
        assert all(math.isfinite(v) for v in _values(events, tag)), tag


def test_validation_scalars_every_validation(events):
    tags = events.Tags()["scalars"]
    for tag in VAL_SCALARS:
        assert tag in tags, f"{tag} missing from {sorted(tags)}"
        assert len(events.Scalars(tag)) == N_VALIDATIONS, tag
    for nll, ppl in zip(_values(events, "val/nll"), _values(events, "val/ppl"), strict=True):
        assert ppl == pytest.approx(math.exp(nll), rel=1e-5)


def test_no_placeholder_hp_metric(events):
    assert "hp_metric" not in events.Tags()["scalars"]


def test_best_bleu_is_running_maximum(events):
    bleu = _values(events, "val/bleu")
    best = _values(events, "hp/best_bleu")
    assert best == pytest.approx([max(bleu[: i + 1]) for i in range(len(bleu))])


def test_hparams_session_names_best_bleu(events):
    content = events.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    metrics = [info.name.tag for info in experiment.experiment.metric_infos]
    assert metrics == ["hp/best_bleu"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = start.session_start_info.hparams
    assert hparams["d_model"].number_value == 32
    assert hparams["vocab_size"].number_value == 500


def test_validation_samples_text(events, multi30k_dir):
    tag = "val/samples/text_summary"
    assert tag in events.Tags()["tensors"]
    samples = events.Tensors(tag)
    assert len(samples) == N_VALIDATIONS
    sources = read_lines(multi30k_dir / "val.de.gz")[:3]
    references = read_lines(multi30k_dir / "val.en.gz")[:3]
    for sample in samples:
        table = sample.tensor_proto.string_val[0].decode()
        rows = table.splitlines()
        assert rows[0] == "| line | source | reference | hypothesis |"
        assert len(rows) == 2 + 3
        for line, (row, src, ref) in enumerate(zip(rows[2:], sources, references, strict=True)):
            cells = [cell.strip() for cell in row.strip("|").split(" | ")]
            assert cells[:3] == [str(line), _escape_markdown(src), _escape_markdown(ref)]
            assert len(cells) == 4


def test_cross_attention_image(events):
    tag = "val/attention/decoder.0.cross"  # configs/tiny.yaml: one decoder layer
    assert events.Tags()["images"] == [tag]
    images = events.Images(tag)
    assert len(images) == N_VALIDATIONS
    assert images[0].encoded_image_string.startswith(b"\x89PNG")
    assert images[0].width > 100 and images[0].height > 100


def test_attention_of_a_greedy_translation(tiny_run):
    translator = Translator.from_checkpoint(tiny_run / "checkpoints" / "tiny" / "last.ckpt")
    module = translator.module
    src_ids = translator.encode(["Ein Mann fährt Fahrrad."])[0]
    maps, src, out = AttentionHeatmaps.attention(module, src_ids)
    assert src == src_ids and out[-1] == module.tokenizer.eos_id
    greedy = translator.translate(["Ein Mann fährt Fahrrad."], beam_size=1)[0]
    assert module.tokenizer.decode([out[:-1]])[0] == greedy
    cross = maps["decoder.0.cross"]
    assert cross.shape == (1, 2, len(out), len(src))
    torch.testing.assert_close(cross.sum(-1), torch.ones(1, 2, len(out)))


def test_plot_attention_labels_the_axes():
    weights = torch.softmax(torch.randn(3, 4), dim=-1)
    figure = plot_attention(weights, ["a", "b", "c", "d"], ["x", "y", "z"], title="t")
    assert isinstance(figure, Figure)
    ax = figure.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c", "d"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["x", "y", "z"]
    with pytest.raises(ValueError, match="do not match"):
        plot_attention(weights, ["a", "b"], ["x", "y", "z"])


def test_markdown_cells_are_escaped():
    assert _escape_markdown("a | b *c*") == "a \\| b \\*c\\*"
    assert _escape_markdown("") == " "


def test_invalid_settings():
    with pytest.raises(ValueError, match="n_samples"):
        ValidationSamples(n_samples=0)
    with pytest.raises(ValueError, match="sentence"):
        AttentionHeatmaps(sentence=-1)
    with pytest.raises(ValueError, match="mode"):
        BestScoreHparams(mode="largest")


def test_tokens_per_s_does_not_count_validation_time():
    """train/tokens_per_s divides a batch's tokens by the time since the previous batch ended;
    after a validation that previous batch is unknown, so the next batch logs no rate."""
    from seq2seq.module import TranslationModule

    module = TranslationModule(vocab_size=16, d_model=8, n_heads=2, d_ff=16)
    module._last_batch_time = 123.0  # set by on_train_batch_end
    module.on_validation_epoch_start()
    assert module._last_batch_time is None
