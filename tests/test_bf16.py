"""bfloat16 training and decoding: ``--trainer.precision bf16-mixed`` on the tiny config, and
``Translator(dtype="bfloat16")`` / ``translate --dtype bfloat16`` against float32."""

from __future__ import annotations

import csv
import math
import warnings

import pytest
import torch
from conftest import CONFIGS, multi30k_lines, run_main

from seq2seq.translator import Translator, decoding_dtype


def _losses(log_dir) -> list[float]:
    (metrics,) = log_dir.rglob("metrics.csv")
    with open(metrics, encoding="utf-8") as f:
        return [float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]


@pytest.mark.slow  # a bf16 fit and translations: ~23 s; CI runs the slow tier too
def test_bf16_mixed_training_of_the_tiny_config(tmp_path, multi30k_dir):
    from seq2seq.cli import cli_main

    cli_main(
        [
            "fit", "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir),
            "--data.cache_dir", str(tmp_path / "cache"),
            "--checkpoint_dir", str(tmp_path / "checkpoints"),
            "--trainer.precision", "bf16-mixed",
            "--trainer.max_steps", "30", "--trainer.log_every_n_steps", "1",
            "--trainer.val_check_interval", "30",
            "--trainer.logger", "lightning.pytorch.loggers.CSVLogger",
            "--trainer.logger.save_dir", str(tmp_path / "logs"),
        ]
    )  # fmt: skip
    losses = _losses(tmp_path / "logs")
    assert len(losses) == 30
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5, losses
    # The checkpoint holds float32 weights and translates in float32 without autocast.
    saved = torch.load(tmp_path / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert {v.dtype for v in saved["state_dict"].values() if v.is_floating_point()} == {
        torch.float32
    }
    translator = Translator.from_checkpoint(tmp_path / "checkpoints/last.ckpt", device="cpu")
    assert translator.dtype == torch.float32
    hyps = translator.translate(multi30k_lines("val", "de", 5))
    assert len(hyps) == 5 and all(isinstance(h, str) for h in hyps)
    assert any(h.strip() for h in hyps)


def test_bf16_mixed_clips_the_gradients_of_a_fused_optimizer(tmp_path, multi30k_dir, monkeypatch):
    """Lightning refuses gradient clipping for ``AdamW(fused=True)`` (tiny.yaml's optimizer)
    under every mixed precision; under bf16-mixed, which has no gradient scaler, the module
    clips, every optimizer step."""
    from lightning.pytorch.plugins.precision import Precision

    from seq2seq.cli import cli_main

    clipped = []
    by_norm = Precision.clip_grad_by_norm

    def spy(self, optimizer, clip_val):
        clipped.append((type(optimizer).__name__, optimizer.defaults["fused"], clip_val))
        by_norm(self, optimizer, clip_val)

    monkeypatch.setattr(Precision, "clip_grad_by_norm", spy)
    cli_main(
        [
            "fit", "--config", str(CONFIGS / "tiny.yaml"),
            "--data.data_dir", str(multi30k_dir),
            "--data.cache_dir", str(tmp_path / "cache"),
            "--checkpoint_dir", str(tmp_path / "checkpoints"),
            "--trainer.precision", "bf16-mixed", "--trainer.gradient_clip_val", "0.5",
            "--trainer.max_steps", "3", "--trainer.val_check_interval", "3",
            "--trainer.limit_val_batches", "1", "--trainer.logger", "false",
            "--trainer.default_root_dir", str(tmp_path),
        ]
    )  # fmt: skip
    assert clipped == [("AdamW", True, 0.5)] * 3


@pytest.mark.parametrize("beam", [1, 3])
def test_bf16_decoding_equals_float32_on_most_sentences(tiny_run, beam):
    ckpt = tiny_run / "checkpoints/tiny/last.ckpt"
    sources = multi30k_lines("val", "de", 100)
    float32 = Translator.from_checkpoint(ckpt, device="cpu").translate(sources, beam_size=beam)
    bf16 = Translator.from_checkpoint(ckpt, device="cpu", dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16
    hyps = bf16.translate(sources, beam_size=beam)
    same = sum(a == b for a, b in zip(float32, hyps, strict=True))
    assert same >= 80, same  # near-ties of a 20-step model may break either way


def test_bf16_decoding_runs_under_autocast(tiny_run, monkeypatch):
    """The bfloat16 translator's products compute in bfloat16 (autocast), not in float32."""
    import seq2seq.translator as translator_module

    seen = []
    real = translator_module.decode_batch

    def spy(*args, **kwargs):
        seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"))
        return real(*args, **kwargs)

    monkeypatch.setattr(translator_module, "decode_batch", spy)
    ckpt = tiny_run / "checkpoints/tiny/last.ckpt"
    Translator.from_checkpoint(ckpt, device="cpu", dtype="bfloat16").translate(["Ein Hund."])
    Translator.from_checkpoint(ckpt, device="cpu").translate(["Ein Hund."])
    assert seen == [torch.bfloat16, False]


def test_decoding_dtype_names_and_refusals():
    assert decoding_dtype("bf16") is torch.bfloat16
    assert decoding_dtype(torch.float32) is torch.float32
    with pytest.raises(ValueError, match="float16: decoding runs in float32 or bfloat16"):
        decoding_dtype("float16")


def test_translate_dtype_flag(tiny_run, monkeypatch, capsys, tmp_path):
    ckpt = str(tiny_run / "checkpoints/tiny/last.ckpt")
    source = tmp_path / "in.de"
    source.write_text("".join(s + "\n" for s in multi30k_lines("val", "de", 20)), encoding="utf-8")
    outputs = {}
    for dtype in ("float32", "bfloat16", "bf16"):  # bf16: the short name, as precision takes
        out = tmp_path / f"out.{dtype}"
        code, _, err = run_main(
            monkeypatch, capsys, "translate", "--ckpt_path", ckpt, "--input", str(source),
            "--output", str(out), "--dtype", dtype,
        )  # fmt: skip
        assert code == 0, err
        outputs[dtype] = out.read_text(encoding="utf-8").splitlines()
    assert len(outputs["bfloat16"]) == 20 and outputs["bf16"] == outputs["bfloat16"]
    assert sum(a == b for a, b in zip(outputs["float32"], outputs["bf16"], strict=True)) >= 14


@pytest.mark.parametrize(("has", "dtype", "warned"), [
    (False, "bf16", True), (True, "bf16", False), (None, "bf16", False), (False, "float32", False),
])  # fmt: skip
def test_translate_in_bfloat16_on_a_cpu_without_its_instructions_is_warned_about(
    tiny_run, monkeypatch, capsys, tmp_path, has, dtype, warned
):
    from seq2seq import machine

    monkeypatch.setattr(machine, "cpu_has_bfloat16_instructions", lambda: has)
    source = tmp_path / "in.de"
    source.write_text("ein Hund .\n", encoding="utf-8")
    ckpt = str(tiny_run / "checkpoints/tiny/last.ckpt")
    code, _, err = run_main(
        monkeypatch, capsys, "translate", "--ckpt_path", ckpt,
        "--input", str(source), "--output", str(tmp_path / "out.en"), "--dtype", dtype,
    )  # fmt: skip
    assert code == 0, err
    lines = [line for line in err if "bfloat16 instructions" in line]
    expected = (
        "seq2seq: warning: --dtype bfloat16 on a CPU without bfloat16 instructions (no "
        "avx512_bf16 or amx_bf16 in /proc/cpuinfo): they are emulated and run several times "
        "slower than --dtype float32"
    )
    assert lines == ([expected] if warned else []), err
    assert (tmp_path / "out.en").read_text(encoding="utf-8").count("\n") == 1


@pytest.mark.parametrize("has", [False, True, None])
def test_bfloat16_from_python_on_a_cpu_without_its_instructions_is_warned_about(
    tiny_run, monkeypatch, has
):
    """A Trainer's bf16 precision (at the module's setup) and a Translator's bfloat16 dtype
    warn where the CPU emulates bfloat16, as the commands do in their own words."""
    import lightning as L

    from seq2seq import machine
    from seq2seq.module import TranslationModule
    from seq2seq.translator import Translator

    monkeypatch.setattr(machine, "cpu_has_bfloat16_instructions", lambda: has)
    ckpt = tiny_run / "checkpoints/tiny/last.ckpt"
    module = TranslationModule.load_from_checkpoint(ckpt, map_location="cpu")
    tail = "on a CPU without bfloat16 instructions (no avx512_bf16 or amx_bf16 in /proc/cpuinfo)"
    for precision in ("bf16-mixed", "32-true"):
        module.trainer = L.Trainer(accelerator="cpu", precision=precision, logger=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module.setup("validate")
        expected = [
            f"precision 'bf16-mixed' {tail}: they are emulated and run several times slower "
            "than precision '32-true'"
        ]
        found = [str(w.message) for w in caught if "bfloat16 instructions" in str(w.message)]
        assert found == (expected if has is False and precision == "bf16-mixed" else [])
    for dtype in ("bfloat16", "float32"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            Translator.from_checkpoint(ckpt, device="cpu", dtype=dtype)
        expected = [
            f"dtype 'bfloat16' {tail}: they are emulated and run several times slower than "
            "dtype 'float32'"
        ]
        found = [str(w.message) for w in caught if "bfloat16 instructions" in str(w.message)]
        assert found == (expected if has is False and dtype == "bfloat16" else [])


def test_translate_refuses_an_unknown_dtype(tiny_run, monkeypatch, capsys):
    ckpt = str(tiny_run / "checkpoints/tiny/last.ckpt")
    code, _, err = run_main(
        monkeypatch, capsys, "translate", "--ckpt_path", ckpt, "--dtype", "float16"
    )
    assert code == 2
    assert "--dtype: invalid choice: 'float16'" in "\n".join(err)


@pytest.mark.parametrize(("has", "precision", "suggested"), [
    (True, "32-true", True), (False, "32-true", False), (None, "32-true", False),
    (True, "bf16-mixed", False),
])  # fmt: skip
def test_fit_in_float32_on_a_cpu_with_bfloat16_instructions_suggests_bf16_mixed(
    tiny_cache, multi30k_dir, tmp_path, monkeypatch, capsys, has, precision, suggested
):
    from seq2seq import machine
    from seq2seq.nn import fast

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(machine, "cpu_has_bfloat16_instructions", lambda: has)
    heap = []
    monkeypatch.setattr(fast, "keep_freed_heap", lambda: heap.append(1) or True)
    code, _, err = run_main(
        monkeypatch, capsys, "fit", "--config", str(CONFIGS / "tiny.yaml"),
        "--data.data_dir", str(multi30k_dir), "--data.cache_dir", str(tiny_cache),
        "--trainer.fast_dev_run", "true", "--trainer.precision", precision,
    )  # fmt: skip
    assert code == 0, err
    lines = [line for line in err if "bf16-mixed trains faster" in line]
    expected = (
        "seq2seq: this CPU has bfloat16 instructions (avx512_bf16 or amx_bf16): "
        "--trainer.precision bf16-mixed trains faster here (README, Precision)"
    )
    assert lines == ([expected] if suggested else []), err
    assert heap == ([1] if precision == "bf16-mixed" else [])  # CPU bfloat16 fits only


def test_a_ctranslate2_folder_refuses_bfloat16(tmp_path, monkeypatch, capsys):
    # The refusal comes before the folder is read, so an empty folder stands for an export.
    folder = tmp_path / "ct2"
    folder.mkdir()
    with pytest.raises(ValueError, match=r"dtype bfloat16: a CTranslate2 folder \(.*ct2\)"):
        Translator.from_checkpoint(folder, device="cpu", dtype="bfloat16")
    code, _, err = run_main(
        monkeypatch, capsys, "translate", "--ckpt_path", str(folder), "--dtype", "bfloat16"
    )
    assert code == 2
    assert "--dtype bfloat16: a CTranslate2 folder computes in the type it was exported" in (
        "\n".join(err)
    )
