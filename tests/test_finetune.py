"""Fine-tuning an imported Hugging Face model on Multi30k, as a user would: ``fit --init_from``
tokenises the corpus with the checkpoint's own tokenizer (no SentencePiece model is trained),
the loss falls, a SIGKILL and resume is exact, ``test`` scores every set with sacreBLEU and
``translate`` works."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
import yaml
from conftest import multi30k_lines, run_main
from hf_folders import D_MODEL, FFN, fairseq_spm, marian_folder, nllb_folder
from test_resume import CKPT_EVERY, KILL_AT, MAX_STEPS, _config, _fit, _logged, _write_corpus

from seq2seq.checkpoint import load_checkpoint
from seq2seq.checkpoint.format import weights_origin
from seq2seq.checkpoint.models import load_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def imported(tmp_path_factory, multi30k_dir) -> dict[str, Path]:
    """Imported checkpoints of a tiny random Marian and NLLB model, and a 600-line corpus."""
    from seq2seq.importing import import_huggingface

    root = tmp_path_factory.mktemp("finetune")
    spm = fairseq_spm(root, multi30k_dir)
    import_huggingface(marian_folder(root / "marian", spm), root / "marian.ckpt")
    nllb = nllb_folder(root / "nllb", spm)
    import_huggingface(nllb, root / "nllb.ckpt", src_lang="deu_Latn", tgt_lang="eng_Latn")
    data = _write_corpus(
        multi30k_dir, root / "data", {"train": 600, "val": 20, "test_2016_flickr": 20}
    )
    return {"root": root, "marian": root / "marian.ckpt", "nllb": root / "nllb.ckpt", "data": data}


@pytest.fixture(scope="module")
def reference(imported) -> Path:
    """An uninterrupted fine-tuning run of the imported Marian model (``MAX_STEPS`` steps)."""
    root = imported["root"]
    run = _fit(_config(root, imported["data"], "reference"), "--init_from", str(imported["marian"]))
    assert run.returncode == 0, run.stderr[-3000:]
    return root / "reference"


def test_fit_init_from_an_imported_model_trains_with_its_tokenizer(imported, reference):
    losses = _logged(reference, "train/loss")
    assert sorted(losses) == list(range(MAX_STEPS))
    first, last = sum(losses[s] for s in range(3)), sum(losses[s] for s in range(9, 12))
    assert last < first, losses
    # no SentencePiece model was trained: the corpus was tokenised with the imported one
    assert not list((imported["root"] / "cache").rglob("spm_*.model"))
    started = load_checkpoint(imported["marian"])["seq2seq"]["tokenizer"]
    trained = load_checkpoint(reference / "checkpoints" / "last.ckpt")["seq2seq"]["tokenizer"]
    assert torch.equal(started, trained)
    # the import records no origin: the run's is the fingerprint of the imported weights
    imported_model = load_model(imported["marian"], {})[0].model
    origin = load_checkpoint(reference / "checkpoints" / "last.ckpt")["seq2seq"]["origin"]
    assert origin == weights_origin(imported_model)


def test_init_from_warns_only_of_the_model_settings_a_config_names(imported, capsys):
    """A fine-tuning config names no model settings (configs/finetune_opus_mt.yaml): their
    defaults are no contradiction of the checkpoint's; a setting the config gives is."""
    from seq2seq.checkpoint import load_checkpoint as read
    from seq2seq.cli.checkpoint_args import _DEFAULTS, apply_init_from

    def config(**model):
        data = {"src_lang": "de", "tgt_lang": "en", "pairs": None, "vocab_size": 8000}
        data["max_positions"] = 256
        return {"init_from": str(imported["marian"]), "ckpt_path": None, "data": data,
                "model": {**_DEFAULTS, **model}}  # fmt: skip

    def fail(message):
        raise AssertionError(message)

    apply_init_from("fit", config(), fail, read)
    assert "other model settings" not in capsys.readouterr().err
    apply_init_from("fit", config(d_model=1024), fail, read)
    err = capsys.readouterr().err
    assert "other model settings than the config: model.d_model " in err
    assert "(config 1024); fit --init_from uses the checkpoint's" in err
    named = config(norm_first=False)
    named["data"]["vocab_size"] = 16000  # a data.* setting the model follows
    apply_init_from("fit", named, fail, read)
    assert "data.vocab_size " in capsys.readouterr().err


def test_evaluating_or_resuming_a_fine_tuned_model_checks_the_settings_a_config_names(
    imported, reference, capsys
):
    """``test`` of an imported checkpoint, or of a run started from one, warns of the model
    settings the config names against it (and of none that it leaves at their defaults), as
    does a resume of such a run, which, as its start, takes the checkpoint's."""
    from seq2seq.checkpoint import load_checkpoint as read
    from seq2seq.cli.checkpoint_args import (
        _DEFAULTS,
        _check_resumable,
        apply_checkpoint_architecture,
    )

    last = reference / "checkpoints" / "last.ckpt"

    def config(ckpt, **model):
        data = {"src_lang": "de", "tgt_lang": "en", "pairs": None, "vocab_size": 8000}
        data["max_positions"] = 256
        return {"ckpt_path": str(ckpt), "data": data, "model": {**_DEFAULTS, **model}}

    for ckpt in (imported["marian"], last):
        apply_checkpoint_architecture("test", config(ckpt), read)
        assert capsys.readouterr().err == ""
        apply_checkpoint_architecture("test", config(ckpt, d_model=1024), read)
        err = capsys.readouterr().err
        assert "other model settings than the config: model.d_model " in err, err
        assert err.rstrip().endswith("(config 1024); test uses the checkpoint's")
    checkpoint = read(last)
    for key in ("optimizer", "lr_scheduler"):  # not configured here: their check left out
        checkpoint["seq2seq"].pop(key)
    _check_resumable(config(last), str(last), checkpoint, None)
    assert capsys.readouterr().err == ""
    resumed = config(last, d_model=1024)
    _check_resumable(resumed, str(last), checkpoint, None)  # as its start: the checkpoint's
    err = capsys.readouterr().err
    assert "model.d_model " in err and err.rstrip().endswith(
        "fit --ckpt_path uses the checkpoint's"
    )
    assert resumed["model"]["d_model"] == read(last)["seq2seq"]["model_config"]["d_model"]


def test_imported_and_fine_tuned_models_test_and_translate(
    imported, reference, monkeypatch, capsys
):
    last = reference / "checkpoints" / "last.ckpt"
    data, tiny = imported["data"], Path(__file__).parent.parent / "configs" / "tiny.yaml"
    # zero-shot, fine-tuned; NLLB's codes (deu_Latn, eng_Latn) for the corpus's de and en
    for ckpt in (imported["marian"], last, imported["nllb"]):
        code, out, err = run_main(
            monkeypatch, capsys, "test", "--config", str(tiny), "--data.data_dir", str(data),
            "--data.test_splits", "[test_2016_flickr]",
            "--data.cache_dir", str(imported["root"] / "cache"), "--ckpt_path", str(ckpt),
            "--trainer.logger", "false", "--trainer.limit_test_batches", "null",
            "--trainer.default_root_dir", str(imported["root"]),  # config.yaml, hypotheses/
        )  # fmt: skip
        assert code == 0, err[-20:]
        # tiny.yaml names model settings (n_heads 2, ...): named in one line, not taken
        (named,) = [line for line in err if "other model settings" in line]
        assert "model.n_heads 4 (config 2)" in named, named
        assert named.endswith("; test uses the checkpoint's"), named
        assert "test/bleu" in out and "nrefs:1|case:mixed|eff:no|tok:13a" in out + "\n".join(err)
    sources = multi30k_lines("val", "de", 5)
    for ckpt, extra in ((last, []), (imported["nllb"], ["--tgt_lang", "fra_Latn"])):
        code, out, err = run_main(
            monkeypatch, capsys, "translate", "--ckpt_path", str(ckpt), *extra,
            stdin="\n".join(sources).encode() + b"\n",
        )  # fmt: skip
        assert code == 0, err
        assert len(out.splitlines()) == 5 and "__" not in out and "_Latn" not in out
    code, out, err = run_main(
        monkeypatch, capsys, "translate", "--ckpt_path", str(imported["nllb"]),
        "--tgt_lang", "xx", stdin=b"Ein Hund.\n",
    )  # fmt: skip
    assert code != 0 and len(err) == 1
    assert "'xx'" in err[0] and "deu_Latn, eng_Latn, fra_Latn, spa_Latn" in err[0]


def test_print_config_shows_the_settings_init_from_takes(imported, monkeypatch, capsys):
    """``fit --init_from X --print_config`` prints the model settings of X, as the run uses."""
    config = Path(__file__).parent.parent / "configs" / "finetune_opus_mt.yaml"
    argv = ["fit", "--config", str(config), "--init_from", str(imported["marian"])]
    code, out, _ = run_main(monkeypatch, capsys, *argv, "--print_config")
    assert code == 0
    model = yaml.safe_load(out)["model"]
    assert (model["d_model"], model["d_ff"], model["norm_first"]) == (D_MODEL, FFN, False)


def test_init_from_beside_a_resume_of_its_run_resumes(imported, reference, tmp_path, caplog):
    """fit --init_from X --ckpt_path C: C's run started from X is resumed (X unset, noted);
    --ckpt_path last before any last.ckpt starts from X; C of another start is refused,
    naming where C's run started."""
    from seq2seq.cli.checkpoint_args import apply_init_from, resume_over_init_from

    def config(init_from, ckpt_path, folder):
        callback = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                    "init_args": {"dirpath": str(folder)}}  # fmt: skip
        return {"init_from": str(init_from), "ckpt_path": ckpt_path,
                "trainer": {"callbacks": [callback]}}  # fmt: skip

    def fail(message):
        raise AssertionError(message)

    folder, read = reference / "checkpoints", load_checkpoint
    resumed = config(imported["marian"], "last", folder)
    with caplog.at_level("INFO"):
        resume_over_init_from(resumed, read)
    assert (resumed["init_from"], resumed["ckpt_path"]) == (None, str(folder / "last.ckpt"))
    assert "where its run started, is not read again" in caplog.text
    fresh = config(imported["marian"], "last", tmp_path / "empty")
    resume_over_init_from(fresh, read)
    assert (fresh["init_from"], fresh["ckpt_path"]) == (str(imported["marian"]), None)
    other = config(imported["nllb"], "last", folder)
    resume_over_init_from(other, read)
    assert other["init_from"] == str(imported["nllb"])
    with pytest.raises(AssertionError, match=r"not both \(.*last\.ckpt is a run started from "):
        apply_init_from("fit", other, fail, read)


@pytest.mark.slow  # 2 more fit processes; CI runs the slow tier too (.ci/run)
def test_sigkill_and_resume_of_a_fine_tuning_run_is_exact(imported, reference):
    root, init = imported["root"], ["--init_from", str(imported["marian"])]
    killed = _fit(_config(root, imported["data"], "resumed", kill_at=KILL_AT), *init)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    last = root / "resumed" / "checkpoints" / "last.ckpt"
    assert load_checkpoint(last)["global_step"] == KILL_AT // CKPT_EVERY * CKPT_EVERY
    # the run's command with --ckpt_path last added resumes it (--init_from not read again)
    resumed = _fit(_config(root, imported["data"], "resumed"), *init, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final, expected = load_checkpoint(last), load_checkpoint(reference / "checkpoints/last.ckpt")
    assert final["global_step"] == expected["global_step"] == MAX_STEPS
    for key, value in expected["state_dict"].items():
        assert torch.equal(final["state_dict"][key], value), key
    start = KILL_AT // CKPT_EVERY * CKPT_EVERY
    got, want = _logged(root / "resumed", "train/loss"), _logged(reference, "train/loss")
    assert {s: got[s] for s in range(start, MAX_STEPS)} == {
        s: want[s] for s in range(start, MAX_STEPS)
    }
