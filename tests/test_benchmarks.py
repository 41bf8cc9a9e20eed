"""The benchmark scripts still run end to end (tiny sizes; their numbers mean nothing here)."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _benchmark(name: str):
    """The module of ``benchmarks/<name>.py`` (the folder is on ``sys.path`` while it imports
    its siblings, as when run as a script)."""
    sys.path[:0] = [str(ROOT / "benchmarks")]
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_cpu_vs_marian_runs(tmp_path):
    pytest.importorskip("transformers")  # the `bench` extra
    cpu_vs_marian = _benchmark("cpu_vs_marian")
    out = tmp_path / "r.json"
    cpu_vs_marian.main(
        [
            *("--d-model 32 --n-heads 2 --encoder-layers 1 --decoder-layers 1 --d-ff 64").split(),
            *("--vocab 200 --train-batch 4 --train-batches 2 --train-steps 1").split(),
            *("--decode-batch 3 --src-min-len 3 --src-max-len 6 --new-tokens 4").split(),
            *("--repeats 1 --warmup 1 --threads 1 --dtypes float32,bfloat16").split(),
            "--json",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    rows = {(r["system"], r["dtype"], r["measurement"]) for r in result["rows"]}
    assert ("ours", "float32", "beam5") in rows and ("marian", "bfloat16", "train") in rows
    checks = result["meta"]["forced_length_checks"]
    assert all(c["ours_lengths"] == [4] == c["marian_lengths"] for c in checks.values())


@pytest.mark.slow  # the data benchmark end to end: ~20 s
def test_data_pipeline_runs(tmp_path):
    out = tmp_path / "r.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "data_pipeline.py"),
            *("--pairs 3000 --vocab-size 300 --words 500").split(),
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(out),
        ],
        check=True,
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )
    assert json.loads(out.read_text())


def test_kv_cache_layout_runs(capsys):
    kv_cache_layout = _benchmark("kv_cache_layout")
    kv_cache_layout.main("--batch 2 --steps 3 --repeats 1 --evict-mb 1".split())
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[2:5]] == ["1", "2", "3"]
    assert lines[-1].startswith("sum over L=1..3: batch-major ")


def test_ema_sweep_runs(tmp_path, tiny_run, multi30k_dir):
    """Snapshots writes the weights every N steps; the sweep replays the average over them and
    scores the training weights and each decay (the last snapshot's weights translate as the
    run's checkpoint does)."""
    from types import SimpleNamespace

    import torch
    from conftest import multi30k_slice

    ema_sweep = _benchmark("ema_sweep")
    from seq2seq.module import TranslationModule

    module = TranslationModule.load_from_checkpoint(tiny_run / "checkpoints/tiny/last.ckpt")
    snapshots = ema_sweep.Snapshots(str(tmp_path / "snap"), every_n_steps=2)
    for step in range(1, 7):
        with torch.no_grad():
            for p in module.parameters():
                p.mul_(0.99)
        trainer = SimpleNamespace(global_step=step, global_rank=0)
        snapshots.on_train_batch_end(trainer, module)
    files = sorted((tmp_path / "snap").glob("*.pt"))
    assert [f.name for f in files] == ["step000002.pt", "step000004.pt", "step000006.pt"]
    data = multi30k_slice(tmp_path / "data", {"val": 12}, multi30k_dir)
    rows = ema_sweep.main(
        [
            "--snapshots", str(tmp_path / "snap"),
            "--ckpt", str(tiny_run / "checkpoints/tiny/last.ckpt"),
            "--data_dir", str(data), "--decays", "0.5,0.9", "--beam_size", "1", "--threads", "1",
        ]
    )  # fmt: skip
    assert [r[0] for r in rows] == ["training weights", "EMA decay 0.5", "EMA decay 0.9"]
    assert all(0.0 <= r[1] <= 100.0 for r in rows)


def test_cpu_bf16_counts_the_model_flops_of_every_product():
    """The FLOPs behind cpu_bf16.py's share of the matmul ceiling equal the count by hand:
    three times the forward products (each product's two gradients backward), attention and
    the output projection included."""
    cpu_bf16 = _benchmark("cpu_bf16")
    batch, length = 2, 5
    step, tokens = cpu_bf16.training_step(batch, length)
    d, d_ff, vocab, layers = 256, 1024, 8000, 3  # the README model that training_step builds
    rows = batch * length  # source and target tokens alike
    attention = 2 * 2 * rows * length * d  # scores and weighted values, all heads
    feed_forward = 2 * 2 * rows * d * d_ff
    encoder = 2 * rows * d * 3 * d + 2 * rows * d * d + attention + feed_forward
    decoder = (
        2 * rows * d * 3 * d + 2 * rows * d * d + attention  # self-attention
        + 2 * rows * d * d + 2 * rows * d * 2 * d + attention + 2 * rows * d * d  # cross
        + feed_forward
    )  # fmt: skip
    forward = layers * (encoder + decoder) + 2 * rows * d * vocab
    assert tokens == rows
    assert step.flops() == 3 * forward
    # The products timed alone for the ceiling at the model's shapes: all but attention's
    # fused kernels (3 per layer pair, forward and backward).
    shapes = step.products()
    run, flops = cpu_bf16.products_alone(shapes, torch.float32)
    assert flops == 3 * (forward - layers * 3 * attention)
    assert (1, rows, d, vocab) in shapes and (1, rows, d_ff, d) in shapes
    run()


@pytest.mark.slow  # 4 worker processes that each import torch and time steps
def test_cpu_bf16_times_each_dtype_in_a_process_of_its_own():
    """The training ratio that carries over to a fit comes from single-dtype processes: each
    worker builds and steps one dtype only, and the driver pairs them."""
    cpu_bf16 = _benchmark("cpu_bf16")
    step, _ = cpu_bf16.training_step(2, 3, dtypes=(True,))
    step(True)
    with pytest.raises(KeyError):
        step(False)  # no float32 model in a bf16 worker
    args = argparse.Namespace(
        threads=1, batch=2, length=3, steps=1, processes=1, varying_steps=1, max_tokens=96
    )
    medians, ratio = cpu_bf16.separate_process_rates(args)
    assert set(medians) == {"float32", "bf16"} and all(v > 0 for v in medians.values())
    assert ratio == pytest.approx(medians["bf16"] / medians["float32"])
    variants = {"float32": ("float32", []), "bf16": ("bf16", []), "off": ("bf16", ["--no-buckets"])}
    medians, _ = cpu_bf16.separate_process_rates(args, "--varying-worker", variants)
    assert set(medians) == set(variants) and all(v > 0 for v in medians.values())


def test_cpu_bf16_measures_float32_alone_where_bfloat16_is_emulated(monkeypatch):
    """``--dtypes auto`` drops the bf16 rows on a CPU without bfloat16 flags (its emulated steps
    would run for hours); ``both`` keeps them; a float32-only run has no ratio."""
    cpu_bf16 = _benchmark("cpu_bf16")
    for flags, dtypes, expected in [
        ("no bf16 flags", "auto", False), ("avx512_bf16", "auto", True),
        ("no bf16 flags", "both", True), ("amx_bf16, avx512_bf16", "float32", False),
    ]:  # fmt: skip
        monkeypatch.setattr(cpu_bf16, "cpu", lambda flags=flags: f"Some CPU ({flags})")
        assert cpu_bf16.measures_bf16(argparse.Namespace(dtypes=dtypes)) is expected
    args = argparse.Namespace(
        threads=1, batch=2, length=3, steps=1, processes=1, varying_steps=1, max_tokens=96
    )
    medians, ratio = cpu_bf16.separate_process_rates(args, variants={"float32": ("float32", [])})
    assert set(medians) == {"float32"} and medians["float32"] > 0 and math.isnan(ratio)


def test_cpu_bf16_varying_batches_are_collated_as_a_fit_sees_them():
    """Right padding, masks and real-position indices as collate makes them, within the token
    budget, and a new shape in (nearly) every batch."""
    cpu_bf16 = _benchmark("cpu_bf16")
    batches = cpu_bf16.varying_batches(30, max_tokens=1024)
    for src, tgt, src_mask, src_index, tgt_index, tokens in batches:
        assert src.numel() <= 1024 and tgt[:, 1:].numel() <= 1024
        assert torch.equal(src_mask[:, 0, 0], src != 0)
        assert torch.equal(src_index, (src.flatten() != 0).nonzero().squeeze(1))
        assert torch.equal(tgt_index, (tgt[:, 1:].flatten() != 0).nonzero().squeeze(1))
        assert tokens == tgt_index.numel()
    shapes = {(b[0].shape, b[1].shape, b[3].numel(), b[4].numel()) for b in batches}
    assert len(shapes) >= 25


@pytest.mark.slow
def test_cpu_bf16_decodes_each_engine_in_a_process_of_its_own(
    tiny_run, multi30k_dir, monkeypatch, capsys
):
    """Decoding against CTranslate2 is timed with one engine per process (in one process, our
    OpenMP threads slow down once CTranslate2 has run), and the ratios pair each round."""
    pytest.importorskip("ctranslate2")  # the `export` extra
    cpu_bf16 = _benchmark("cpu_bf16")
    workers = []
    run = subprocess.run

    def record(command, **kwargs):
        workers.append(command[command.index("--decode-worker") + 1])
        return run(command, **kwargs)

    monkeypatch.setattr(cpu_bf16.subprocess, "run", record)
    args = argparse.Namespace(
        threads=1, ckpt=str(tiny_run / "checkpoints" / "tiny" / "last.ckpt"), decode_processes=1,
        data_dir=str(multi30k_dir), split="test_2016_flickr", src_lang="de", tgt_lang="en",
        limit=4, decode_repeats=1,
    )  # fmt: skip
    cpu_bf16.decoding(args)
    assert workers == list(cpu_bf16.DECODING_ENGINES) * 2  # greedy, then beam 5
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if "| ours" in line]
    # per search: 2 dtypes, float32 without step or small_rows, bf16 without row_buckets
    assert len(rows) == 10
    assert sum("-row_buckets" in row[1] and row[5].startswith("ours bf16") for row in rows) == 2
    assert sum("-step" in row[1] and row[5].startswith("ours float32") for row in rows) == 2
    assert sum("-small_rows" in row[1] and row[5].startswith("ours float32") for row in rows) == 2
    for row in rows:
        assert float(row[2]) > 0 and row[4].endswith("x") and float(row[4][:-1]) > 0


@pytest.mark.slow
def test_decode_steps_times_both_engines_on_the_same_steps(tiny_run, multi30k_dir, capsys):
    """Each engine decodes exactly --steps steps for each row count (a worker refuses other
    lengths), and the fit of the per-step times is printed for both."""
    pytest.importorskip("ctranslate2")  # the `export` extra
    decode_steps = _benchmark("decode_steps")
    decode_steps.main(
        [
            "--ckpt", str(tiny_run / "checkpoints" / "tiny" / "last.ckpt"),
            "--data_dir", str(multi30k_dir), "--rows", "1,3", "--steps", "4",
            "--repeats", "1", "--processes", "1", "--threads", "1",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("| 1 ", "| 3 "))]
    assert len(rows) == 2
    for row in rows:
        assert float(row[1]) > 0 and float(row[2]) > 0 and row[3].endswith("x |")
    assert "ours: " in out and "ctranslate2: " in out and "us per row" in out


def test_decode_steps_fits_a_line():
    decode_steps = _benchmark("decode_steps")
    fixed, per_row = decode_steps._line([1.0, 16.0, 64.0], [2.5 + 0.1 * x for x in (1, 16, 64)])
    assert fixed == pytest.approx(2.5) and per_row == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rows", "0,4"], "argument --rows: must be >= 1, got 0"),
        (["--rows", "a,b"], "argument --rows: not an integer: 'a'"),
        (["--steps", "0"], "argument --steps: must be >= 1, got 0"),
        (["--processes", "0"], "argument --processes: must be >= 1, got 0"),
        ([], "--ckpt missing.ckpt: no such file"),
    ],
)
def test_decode_steps_refuses_bad_arguments_in_one_line(flags, message, capsys):
    decode_steps = _benchmark("decode_steps")
    with pytest.raises(SystemExit) as stop:
        decode_steps.main(["--ckpt", "missing.ckpt", *flags])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"error: {message}")


def test_score_filter_runs_and_its_measures_are_right(tiny_run, multi30k_dir, capsys):
    score_filter = _benchmark("score_filter")
    assert score_filter.auc([2.0, 3.0], [1.0]) == 1.0
    assert score_filter.auc([1.0, 3.0], [1.0, 2.0]) == 0.625  # 1 tie of 4 pairs counts half
    src, tgt = [f"s{i}" for i in range(10)], [f"t{i}" for i in range(10)]
    made = score_filter.noisy_pairs(src, tgt, dict.fromkeys(score_filter.KINDS, 5), seed=1)
    assert [kind for *_, kind in made] == [k for k in score_filter.KINDS for _ in range(5)]
    for s, t, kind in made:
        if kind == "misaligned":
            assert t in tgt and t != tgt[src.index(s)]
        assert (t == s) == (kind == "untranslated") and (t == "") == (kind == "empty")
    ckpt = tiny_run / "checkpoints" / "tiny" / "last.ckpt"
    score_filter.main(["--ckpt", str(ckpt), "--data_dir", str(multi30k_dir),
                       "--clean", "40", "--noisy", "4,4,4,4"])  # fmt: skip
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| sum")]
    assert len(rows) == 1 and 0.0 <= float(rows[0].split("|")[2]) <= 1.0
