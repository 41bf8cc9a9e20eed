"""TensorBoard monitoring: scalars, validation samples, attention heatmaps, HPARAMS.

The event file is the one the shared ``tiny_run`` fit (configs/tiny.yaml: 20 steps,
validation every 10) writes to ``lightning_logs/tiny/version_0``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import CONFIGS, run_main, tiny_model
from matplotlib.figure import Figure
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from seq2seq.callbacks import (
    AttentionHeatmaps,
    BestScoreHparams,
    TextProgress,
    TokenThroughput,
    ValidationSamples,
    plot_attention,
)
from seq2seq.callbacks import progress as progress_module
from seq2seq.callbacks.tensorboard import _escape_markdown
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


def test_logged_learning_rate_is_the_one_of_the_step(events):
    """train/lr at TensorBoard step s is the rate optimizer step s + 1 was taken with
    (configs/tiny.yaml: peak 0.003, InverseSqrtLR warm-up 5), not the next step's, which the
    scheduler has set by the end of the batch."""
    for event in events.Scalars("train/lr"):
        step = event.step + 1  # Lightning's axis counts optimizer steps from 0
        expected = 0.003 * min(step / 5, math.sqrt(5 / step))
        assert event.value == pytest.approx(expected, rel=1e-6), (event.step, event.value)


class _Throughput:
    """A :class:`TokenThroughput` driven by hand: a clock, batches of 100 tokens, and the values
    it logs through the module."""

    def __init__(self, monkeypatch) -> None:
        from seq2seq.callbacks import throughput

        self.callback = TokenThroughput()
        self.module = tiny_model()
        self.connector = SimpleNamespace(should_update_logs=False)
        self.trainer = SimpleNamespace(_logger_connector=self.connector)
        self.logged: list[tuple[str, float, dict]] = []
        log = lambda name, value, **kw: self.logged.append((name, value, kw))  # noqa: E731
        monkeypatch.setattr(self.module, "log", log)
        self.clock = 0.0
        monkeypatch.setattr(throughput.time, "perf_counter", lambda: self.clock)

    def batch(self, ends_at: float, written: bool = False, index: int = 0) -> None:
        """A training batch of 100 tokens that ends at ``ends_at`` seconds; ``written``: its
        logged values go to the logger; ``index``: its index in the epoch."""
        self.clock, self.connector.should_update_logs = ends_at, written
        self.callback.on_train_batch_end(self.trainer, self.module, None, {"n_tokens": 100}, index)

    def values(self) -> list[float]:
        assert {name for name, _, _ in self.logged} == {"train/tokens_per_s"}
        assert all(kw == {"prog_bar": True} for _, _, kw in self.logged)
        return [value for _, value, _ in self.logged]


def test_tokens_per_s_averages_the_batches_since_the_last_logged_value(monkeypatch):
    """train/tokens_per_s: the tokens of the batches since the value last went to the logger,
    over their time (a slow batch between two logged steps is not lost), as fairseq's wps."""
    run = _Throughput(monkeypatch)
    run.batch(0.0)  # the first batch: no time since a previous one, no rate
    assert run.logged == []
    run.batch(1.0)  # 100 tokens in 1 s
    run.batch(4.0, written=True)  # 100 more in 3 s: logged over both batches, then a new window
    run.batch(5.0)  # 100 tokens in 1 s
    assert run.values() == pytest.approx([100.0, 50.0, 100.0])


def test_tokens_per_s_of_a_logged_step_covers_all_its_micro_batches(monkeypatch):
    """With accumulate_grad_batches 2 both micro-batches of a logged optimizer step are
    written: the window restarts after the second, not after the first."""
    run = _Throughput(monkeypatch)
    run.trainer.accumulate_grad_batches = 2
    run.batch(0.0, index=0)
    run.batch(1.0, index=1)  # 100 tokens in 1 s
    run.batch(2.0, written=True, index=2)  # a logged step's first micro-batch: 200 in 2 s
    run.batch(6.0, written=True, index=3)  # its second, 100 more in 4 s: 300 in 6 s, restart
    run.batch(7.0, index=4)
    assert run.values() == pytest.approx([100.0, 100.0, 50.0, 100.0])


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


def test_best_bleu_is_logged_at_the_step_of_the_validation_scalars(events):
    """hp/best_bleu, the samples and the attention images share the step of the val/*
    scalars (Lightning's logging step, one below the optimizer steps 10 and 20 the validations
    follow), so in TensorBoard a validation's entries have one step."""
    val_steps = [event.step for event in events.Scalars("val/bleu")]
    assert val_steps == [9, 19]
    assert [event.step for event in events.Scalars("hp/best_bleu")] == val_steps
    # The samples and the attention images of a validation too.
    assert [event.step for event in events.Tensors("val/samples/text_summary")] == val_steps
    assert [event.step for event in events.Images("val/attention/decoder.0.cross")] == val_steps


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


def test_tokens_per_s_does_not_count_validation_or_epoch_start_time(monkeypatch):
    """train/tokens_per_s divides a batch's tokens by the time since the previous batch ended;
    after a validation or an epoch's start that previous batch is unknown, so the next batch
    adds nothing to the rate."""
    run = _Throughput(monkeypatch)
    run.batch(0.0)
    run.batch(1.0)  # 100 tokens in 1 s
    run.callback.on_validation_epoch_start(run.trainer, run.module)
    run.batch(7.0)  # 6 s after the previous batch, a validation between: left out
    run.batch(9.0)  # 100 tokens in 2 s
    run.callback.on_train_epoch_start(run.trainer, run.module)
    run.batch(20.0)  # left out
    run.batch(21.0)  # 100 tokens in 1 s
    assert run.values() == pytest.approx([100.0, 100.0, 200 / 3, 200 / 3, 300 / 4])


# ---------------------------------------------------------------------- plain progress lines
def _fields(line: str) -> dict[str, str]:
    """``{"epoch": "0", "step": "10", "loss": "5.955", ..., "time": "0:00:01"}`` of a line."""
    *parts, elapsed = line.split(" | ")
    return {**dict(part.rsplit(" ", 1) for part in parts), "time": elapsed}


def test_first_progress_line_after_a_resume_is_complete(
    tmp_path, multi30k_dir, tiny_cache, monkeypatch, capsys
):
    """``fit --ckpt_path last`` into a log (stdout not a terminal): the first line the resumed
    process prints, here right after its first batch (stopped at step 9, a line every 5
    steps), has the learning rate of the step just taken, as the uninterrupted run prints it,
    and a loss and a tok/s over that process's own steps: its one step's loss, as the
    uninterrupted run logged it to TensorBoard (whose line at step 10 averages steps 6 to 10)."""
    base = [
        "fit", "--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(multi30k_dir),
        "--data.cache_dir", str(tiny_cache), "--trainer.enable_progress_bar", "null",
    ]  # fmt: skip

    def fit(folder: str, *argv: str) -> list[dict[str, str]]:
        (tmp_path / folder).mkdir(exist_ok=True)
        monkeypatch.chdir(tmp_path / folder)
        code, out, err = run_main(monkeypatch, capsys, *base, *argv)
        assert code == 0, err[-20:]
        return [_fields(line) for line in out.splitlines() if line.startswith("epoch ")]

    reference = fit("reference", "--trainer.max_steps", "10")
    assert [line["step"] for line in reference] == ["5", "10"]
    assert [line["step"] for line in fit("resumed", "--trainer.max_steps", "9")] == ["5"]
    resumed = fit("resumed", "--trainer.max_steps", "10", "--ckpt_path", "last")
    assert [line["step"] for line in resumed] == ["10"]
    first = resumed[0]
    assert list(first) == ["epoch", "step", "loss", "lr", "tok/s", "time"], first
    assert first["lr"] == reference[1]["lr"]
    logs = EventAccumulator(str(tmp_path / "reference" / "lightning_logs" / "tiny" / "version_0"))
    logs.Reload()
    step_10 = [event.value for event in logs.Scalars("train/loss") if event.step == 9]
    assert first["loss"] == f"{step_10[0]:.3f}"
    assert float(first["tok/s"].replace(",", "")) > 0


def _fake_trainer(**attributes) -> SimpleNamespace:
    """A stand-in for the ``Trainer`` of :class:`TextProgress`'s hooks on rank 0, whose
    ``callback_metrics`` and ``progress_bar_metrics`` show the same logged values."""
    metrics: dict[str, torch.Tensor] = {}
    return SimpleNamespace(
        is_global_zero=True, callback_metrics=metrics, progress_bar_metrics=metrics, **attributes
    )


def test_progress_line_rates_count_this_process_training_time_only(monkeypatch, capsys):
    """tok/s on a line: the real target tokens of the batches since the previous line (the
    first line: since this process started training) over the time they took, without the
    time of validations; lr: the learning rate of the optimizer step just taken, read from
    the optimizer (a scheduler has moved it on by the time the line is printed)."""
    clock = [100.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock[0])
    progress = TextProgress(every_n_steps=2)
    trainer = _fake_trainer(global_step=40, current_epoch=3)
    optimizer = SimpleNamespace(param_groups=[{"lr": 1e-3}])

    def batch(seconds: float, tokens: int, lr: float) -> None:
        progress.on_train_batch_start(trainer, None, {"n_tokens": tokens}, 0)
        clock[0] += seconds
        optimizer.param_groups[0]["lr"] = lr
        progress.on_before_optimizer_step(trainer, None, optimizer)
        optimizer.param_groups[0]["lr"] = lr / 2  # the scheduler's step
        trainer.global_step += 1
        trainer.callback_metrics["train/loss"] = torch.tensor(2.5)
        progress.on_train_batch_end(trainer, None, None, {"n_tokens": tokens}, 0)

    progress.on_train_start(trainer, None)  # resumed at step 40
    clock[0] += 30.0  # e.g. reading the stream up to the resume position
    batch(1.0, 300, 2e-3)
    progress.on_validation_start(trainer, None)
    clock[0] += 60.0
    progress.on_validation_end(trainer, None)
    clock[0] += 0.5
    batch(1.0, 500, 1e-3)  # step 42: a line over both batches, 800 tokens in 2 s
    clock[0] += 1.0
    batch(1.0, 100, 1e-3)
    batch(2.0, 200, 5e-4)  # step 44: 300 tokens since the last line, in 4 s
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "epoch 3 | step 42 | loss 2.500 | lr 1.00e-03 | tok/s 400 | 0:01:32",
        "epoch 3 | step 44 | loss 2.500 | lr 5.00e-04 | tok/s 75 | 0:01:36",
    ]


def _train_steps(progress, trainer, losses, accumulate=1) -> None:
    """Drive ``progress`` through one optimizer step per value of ``losses`` (its
    ``train/loss``), each made of ``accumulate`` batches, as Lightning calls the hooks: the
    module logs the step's loss in ``on_before_optimizer_step``, during the window's last
    batch; the metrics keep the previous step's value during the other batches."""
    optimizer = SimpleNamespace(param_groups=[{"lr": 1e-3}])
    for loss in losses:
        for micro in range(accumulate):
            progress.on_train_batch_start(trainer, None, {"n_tokens": 10}, micro)
            if micro == accumulate - 1:
                progress.on_before_optimizer_step(trainer, None, optimizer)
                trainer.callback_metrics["train/loss"] = torch.tensor(loss)
                trainer.global_step += 1
            progress.on_train_batch_end(trainer, None, None, {"n_tokens": 10}, micro)


@pytest.mark.parametrize("accumulate", [1, 3])
def test_progress_line_loss_is_the_mean_over_the_steps_since_the_previous_line(accumulate, capsys):
    """loss on a line: the mean of the train/loss values of the optimizer steps since the
    previous line (for the first line: since this process started training), not the last
    step's alone; with gradient accumulation each optimizer step counts once, however many
    batches it has."""
    progress = TextProgress(every_n_steps=3)
    trainer = _fake_trainer(global_step=10, current_epoch=0)
    trainer.callback_metrics["train/loss"] = torch.tensor(9.0)  # the step before the resume
    progress.on_train_start(trainer, None)
    _train_steps(progress, trainer, [3.5, 4.75], accumulate)  # first line: steps 11 and 12
    _train_steps(progress, trainer, [3.25, 2.0, 3.0], accumulate)  # steps 13 to 15
    lines = [_fields(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["step"], line["loss"]) for line in lines] == [
        ("12", "4.125"),
        ("15", "2.750"),
    ]


def test_progress_line_time_is_the_timer_time_of_the_whole_run(monkeypatch, capsys):
    """With Lightning's Timer (``--trainer.max_time``), the time on a line is the Timer's
    training time, which it restores from the checkpoint in a resumed run (the time that
    max_time is checked against), not this process's own."""
    from lightning.pytorch.callbacks import Timer

    clock = [1000.0]
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock[0])
    timer = Timer(duration="00:00:15:00")
    timer.load_state_dict({"time_elapsed": {"train": 7 * 60 + 26.0}})  # the earlier processes
    progress = TextProgress(every_n_steps=2)
    trainer = _fake_trainer(global_step=120, current_epoch=1, callbacks=[timer, progress])
    timer.on_train_start(trainer, None)
    progress.on_train_start(trainer, None)
    clock[0] += 60.0
    _train_steps(progress, trainer, [3.0, 3.0])
    line = _fields(capsys.readouterr().out.strip())
    assert (line["step"], line["time"]) == ("122", "0:08:26")
