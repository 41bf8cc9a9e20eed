"""Shared fixtures: the Multi30k corpus and one tiny trained run reused across tests."""

from __future__ import annotations

import functools
import hashlib
import io
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


def _multi30k_dir() -> Path:
    env = os.environ.get("SEQ2SEQ_MULTI30K")
    if env:
        return Path(env)
    return REPO.parent / "shared" / "data" / "multi30k"


MULTI30K = _multi30k_dir()


def _multi30k_hint() -> str:
    """Says where Multi30k was looked for and how to point the tests at it."""
    env = os.environ.get("SEQ2SEQ_MULTI30K")
    where = (
        f"SEQ2SEQ_MULTI30K={env}"
        if env
        else "SEQ2SEQ_MULTI30K is unset, so the tests look in ../shared/data/multi30k beside "
        "the checkout"
    )
    return (
        f"Multi30k not found: {MULTI30K / 'train.de.gz'} does not exist ({where}); set "
        "SEQ2SEQ_MULTI30K to the folder holding the Multi30k files (train.de.gz, val.en.gz, ...)"
    )


_XDIST = {"worker": None, "workers": 0}  # this process as a pytest-xdist worker


def _xdist_worker() -> str | None:
    """This process's pytest-xdist worker name (``gw0``, ``gw1`` ...), None outside a worker
    (in xdist's controller, and in a pytest that a test starts)."""
    return _XDIST["worker"]


def pytest_configure(config):
    """Under pytest-xdist, the cores are shared among the workers: each worker's torch (and
    every process a test starts, through ``OMP_NUM_THREADS``) uses its share of them instead
    of all of them, so the workers do not slow each other down by oversubscription.

    Without Multi30k the run stays in one process: xdist's workers collect the tests, and
    the stop of :func:`pytest_collection_finish` in a worker is reported as a crash instead
    of with its hint.
    """
    workerinput = getattr(config, "workerinput", None)  # set by pytest-xdist in its workers
    if workerinput:
        _XDIST.update(worker=workerinput["workerid"], workers=int(workerinput["workercount"]))
    elif not (MULTI30K / "train.de.gz").is_file():
        if getattr(config.option, "dist", "no") != "no":  # runs before xdist's own hook
            config.option.dist, config.option.tx, config.option.numprocesses = "no", [], 0
    workers = _XDIST["workers"]
    if workers and "OMP_NUM_THREADS" not in os.environ:  # a thread count of one's own wins
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        threads = max(1, (cores or 1) // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


_ROOT_AT_START: set[str] = set()


def pytest_sessionstart(session):
    _ROOT_AT_START.update(path.name for path in REPO.iterdir())


def pytest_sessionfinish(session, exitstatus):
    """Fails a session whose tests left files in the checkout's root (a fit without a logger
    writes config.yaml and hypotheses/ into its working folder), naming them."""
    if _xdist_worker():
        return
    left = sorted({path.name for path in REPO.iterdir()} - _ROOT_AT_START - {".pytest_cache"})
    if left:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write("\n")
        reporter.write_line(f"tests left {left} in {REPO}: write under tmp_path", red=True)


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` (``addopts``): pytest-xdist's load scheduling, each test sent on
    its own to the next free worker, except that the tests of a module defining a
    module-scoped fixture go to one worker together, which builds that fixture once, as a
    run without xdist does. (``xdist_group`` marks cannot do it here: pytest-xdist 3.8 groups
    by renaming the tests, which pytest 9.2 no longer allows.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return path if _defines_module_fixture(config.rootpath / path) else nodeid

    return ModuleFixtureScheduling(config, log)


@functools.cache
def _defines_module_fixture(path: Path) -> bool:
    return path.suffix == ".py" and 'scope="module"' in path.read_text(encoding="utf-8")


def _needs_multi30k(item) -> bool:
    """Whether a collected test reads Multi30k: it uses the ``multi30k_dir`` fixture (directly
    or through another fixture such as ``tiny_run``), or its module imports ``MULTI30K``.
    Tests marked to be skipped do not count."""
    if item.get_closest_marker("skip") is not None:
        return False
    module = getattr(item, "module", None)
    return "multi30k_dir" in getattr(item, "fixturenames", ()) or hasattr(module, "MULTI30K")


def pytest_collection_finish(session):
    """Stops the run before any test when a selected test needs Multi30k and it is missing,
    with one message saying where it was looked for and how to point the tests at it
    (instead of a ``FileNotFoundError`` from every test that reads it).

    Raises:
        pytest.exit: with exit status 4 (``ExitCode.USAGE_ERROR``) in that case; never with
            ``--collect-only``.
    """
    if session.config.option.collectonly or (MULTI30K / "train.de.gz").is_file():
        return
    needing = [item.nodeid for item in session.items if _needs_multi30k(item)]
    if needing:
        pytest.exit(
            f"{_multi30k_hint()}. {len(needing)} selected test(s) use it, e.g. {needing[0]}.",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


def quiet_cpu_trainer(root: Path, **kwargs):
    """A two-epoch CPU ``Trainer`` without logger, progress bar, summary or validation, whose
    batches come from the data module's own samplers (as the configs run)."""
    import lightning as L

    return L.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        use_distributed_sampler=False,
        default_root_dir=root,
        **kwargs,
    )


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """Folder with Multi30k task-1 raw files (``train.de.gz`` ...)."""
    if not (MULTI30K / "train.de.gz").is_file():
        pytest.fail(_multi30k_hint())
    return MULTI30K


def built_once(tmp_path_factory, name: str, build) -> Path:
    """The folder ``name`` that ``build(folder)`` fills, built once per test run: in a run
    without pytest-xdist a new temporary folder; under xdist one folder for all workers,
    built by the first worker that asks for it while the others wait on a file lock (the
    pattern of pytest-xdist's documentation), then read by all. Callers that change what is
    in it copy it first."""
    if not _xdist_worker():
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp().parent  # the run's folder, shared by its workers
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)  # left by a build that failed
            folder.mkdir(parents=True)
            build(folder)
            done.write_text("", encoding="utf-8")
    return folder


def _fit_tiny(workdir: Path, multi30k_dir: Path) -> None:
    from seq2seq.cli import cli_main

    previous, argv = Path.cwd(), sys.argv
    # a session fixture is set up before _plain_argv: LightningCLI must not see pytest's argv
    os.chdir(workdir)
    sys.argv = ["seq2seq"]
    try:
        cli_main(
            ["fit", "--config", str(CONFIGS / "tiny.yaml"), "--data.data_dir", str(multi30k_dir)]
        )
    finally:
        os.chdir(previous)
        sys.argv = argv


def _tiny_run_key(multi30k_dir: Path) -> str:
    """What the tiny run depends on, hashed: the package's code, configs/tiny.yaml, this file,
    the corpus files (names, sizes, times), the libraries that train and score it, and torch's
    thread count (under xdist a worker's share of the cores), which changes the sums' order."""
    from importlib.metadata import version

    digest = hashlib.sha256()
    for path in [*sorted((REPO / "seq2seq").rglob("*.py")), CONFIGS / "tiny.yaml", Path(__file__)]:
        digest.update(path.read_bytes())
    for path in sorted(multi30k_dir.iterdir()):
        stat = path.stat()
        digest.update(f"{path.name} {stat.st_size} {stat.st_mtime_ns}".encode())
    for name in ("torch", "lightning", "sentencepiece", "jsonargparse", "sacrebleu", "numpy"):
        digest.update(f"{name} {version(name)}".encode())
    digest.update(f"threads {torch.get_num_threads()}".encode())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def tiny_run(request, tmp_path_factory, multi30k_dir) -> Path:
    """Run ``seq2seq fit`` with configs/tiny.yaml once; returns the run's working folder.

    The folder holds ``checkpoints/tiny/last.ckpt``, ``lightning_logs/tiny/version_0`` and
    ``data/cache`` (the SentencePiece model). The run is kept in pytest's cache folder
    (``.pytest_cache``) under a hash of what it depends on (:func:`_tiny_run_key`), so a later
    pytest of the same code reuses it; each test process works in its own copy.
    """
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    if cache is None:
        built = built_once(tmp_path_factory, "tiny_run", lambda f: _fit_tiny(f, multi30k_dir))
    else:
        from filelock import FileLock

        root = cache.mkdir("tiny_run")
        built = root / _tiny_run_key(multi30k_dir)
        with FileLock(str(root / "lock")):  # other xdist workers, or another pytest
            if not (built / "done").is_file():
                shutil.rmtree(built, ignore_errors=True)  # a build that failed
                runs = sorted((p for p in root.iterdir() if p.is_dir()), key=os.path.getmtime)
                for old in runs[:-2]:  # keep the two newest keys' runs (-n 0 and xdist)
                    shutil.rmtree(old)
                built.mkdir()
                _fit_tiny(built, multi30k_dir)
                (built / "done").write_text("", encoding="utf-8")
    workdir = tmp_path_factory.mktemp("tiny_run")
    shutil.copytree(built, workdir, dirs_exist_ok=True)
    return workdir


@pytest.fixture
def tiny_cache(tiny_run) -> Path:
    """The tiny run's data cache: its SentencePiece model and tokenised Multi30k. A fit or
    evaluation with configs/tiny.yaml's data settings that reads it (``--data.cache_dir``)
    neither trains a SentencePiece model nor tokenises the corpus again."""
    return tiny_run / "data" / "cache"


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    """LightningCLI reads sys.argv; keep pytest's own arguments out of it."""
    monkeypatch.setattr("sys.argv", ["seq2seq"])


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Run the test inside an empty temporary folder."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_main(monkeypatch, capsys, *argv: str, stdin: bytes | None = None):
    """``seq2seq ARGV`` (the console script's ``main``) in this process, optionally reading
    ``stdin``: (exit status, stdout, stderr lines)."""
    from seq2seq.cli import main

    monkeypatch.setattr("sys.argv", ["seq2seq", *argv])
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    try:
        code = main()
    except SystemExit as exit_info:
        code = exit_info.code
    out = capsys.readouterr()
    return code, out.out, out.err.strip().splitlines()


def other_batching_warning(name: str, value, saved) -> str:
    """Regular expression of the data module's warning on resuming mid-epoch with
    ``--data.NAME=VALUE`` where the checkpoint has ``SAVED`` (``None`` written ``null``)."""
    saved = "null" if saved is None else saved
    return (
        rf"^Resuming with --data\.{name}={value}, but the checkpoint was written with "
        rf"--data\.{name}={saved}: training continues with other batches than the "
        r"interrupted run would have had \(in the epoch under way, [^\n]*\)\.$"
    )


def refuse_new_files(monkeypatch, folder_name: str) -> None:
    """Make every folder named ``folder_name`` refuse new files, as a read-only folder does
    (permission bits do not stop root, who runs the tests in some environments): the trial
    and temporary files of :mod:`seq2seq.files` fail there with ``EACCES``."""
    import tempfile

    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).name == folder_name:
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


# ---------------------------------------------------------------------- shared test helpers
def ddp_env(tests_dir: Path) -> dict[str, str]:
    """The environment of a ``python -m seq2seq.cli`` run with DDP on CPU processes: one
    thread each, unbuffered output, this test folder importable (for the test's callbacks) and
    a ``MASTER_PORT`` the system has just handed out as free (as Lightning picks one), named
    explicitly so that a ``MASTER_PORT`` of the caller's environment cannot make two runs at
    once (pytest-xdist workers) meet on one port."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MASTER_PORT=str(port))
    env["PYTHONPATH"] = os.pathsep.join([str(tests_dir), env.get("PYTHONPATH", "")])
    return env


def run_ddp_cli(args: list[str], cwd: Path, timeout: float = 300) -> str:
    """Runs ``python -m seq2seq.cli ARGS`` in ``cwd`` (created) with :func:`ddp_env`; fails the
    test if it exits non-zero or hangs past ``timeout`` seconds (its whole process group is
    killed then), and returns its output."""
    import signal
    import subprocess

    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "seq2seq.cli", *args], cwd=cwd,
        env=ddp_env(Path(__file__).parent), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"seq2seq {args[0]} hung (> {timeout} s):\n{output[-4000:]}")
    if proc.returncode != 0:
        pytest.fail(f"seq2seq {args[0]} failed ({proc.returncode}):\n{output[-4000:]}")
    return output


def multi30k_lines(split: str, lang: str, n: int | None = None, folder: Path = MULTI30K):
    """The first ``n`` lines (all for ``None``) of Multi30k's ``split.lang.gz``, without
    their newlines."""
    import gzip
    from itertools import islice

    with gzip.open(folder / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in islice(f, n)]


def write_lines(path: Path, lines, compress: bool = False) -> Path:
    """``lines`` as a text file, each ending in a newline (gzip-compressed with ``compress``);
    missing folders are created."""
    import gzip

    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(f"{line}\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def write_corpus(folder: Path, splits: dict, langs=("de", "en"), compress: bool = False) -> Path:
    """A corpus folder of aligned text files: ``{split: (src_lines, tgt_lines)}`` as
    ``split.<src>`` and ``split.<tgt>`` (``.gz`` with ``compress``)."""
    suffix = ".gz" if compress else ""
    for split, sides in splits.items():
        for lang, lines in zip(langs, sides, strict=True):
            write_lines(folder / f"{split}.{lang}{suffix}", lines, compress)
    return folder


def multi30k_slice(folder: Path, sizes: dict, folder_in: Path = MULTI30K) -> Path:
    """:func:`write_corpus` of the first ``n`` pairs of each Multi30k split ``{split: n}``."""
    splits = {
        split: tuple(multi30k_lines(split, lang, n, folder_in) for lang in ("de", "en"))
        for split, n in sizes.items()
    }
    return write_corpus(folder, splits)


def tiny_config(path: Path, **sections) -> Path:
    """``configs/tiny.yaml`` with the given top-level sections updated key by key (e.g.
    ``trainer={"max_steps": 4}``), written to ``path``."""
    import yaml

    config = yaml.safe_load((CONFIGS / "tiny.yaml").read_text(encoding="utf-8"))
    for section, values in sections.items():
        if isinstance(values, dict) and isinstance(config.get(section), dict):
            config[section].update(values)
        else:
            config[section] = values
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def tiny_model(**settings):
    """A ``TranslationModule`` small enough for a unit test (vocabulary 16, ``d_model`` 8, 2
    heads, ``d_ff`` 16), built from its public keyword arguments; ``settings`` override."""
    from seq2seq.module import TranslationModule

    return TranslationModule(
        **{"vocab_size": 16, "d_model": 8, "n_heads": 2, "d_ff": 16, **settings}
    )


_SPM_MODELS: dict = {}


@pytest.fixture(scope="session")
def train_spm(tmp_path_factory):
    """``train_spm(sentences, vocab_size)``: a SentencePiece model file of these sentences,
    trained once per test run for each distinct (sentences, vocab_size)."""
    from seq2seq.data.tokenizer import Tokenizer

    def train(sentences, vocab_size: int) -> Path:
        sentences = list(sentences)
        key = (hashlib.sha256("\n".join(sentences).encode()).hexdigest(), vocab_size)
        if key not in _SPM_MODELS:
            name = f"spm-{key[0][:16]}-{vocab_size}"  # one model for every xdist worker
            folder = built_once(
                tmp_path_factory,
                name,
                lambda folder: Tokenizer.train(
                    sentences, folder / f"spm_{vocab_size}.model", vocab_size
                ),
            )
            _SPM_MODELS[key] = folder / f"spm_{vocab_size}.model"
        return _SPM_MODELS[key]

    return train


@pytest.fixture(scope="module")
def one_thread():
    """Run single-threaded (``pytestmark = pytest.mark.usefixtures("one_thread")``): tiny
    matrices gain nothing from threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def copy_batch(n: int, g: torch.Generator, vocab: int, pad: int = 0, bos: int = 2, eos: int = 3):
    """A copy task: ``n`` sources of 2 to 8 tokens (ids 4 .. vocab - 1) and their copies as
    decoder inputs ``(BOS, x...)`` and targets ``(x..., EOS)``, padded with ``pad``."""
    lens = torch.randint(2, 9, (n,), generator=g)
    length = int(lens.max())
    src = torch.randint(4, vocab, (n, length), generator=g)
    src = src.masked_fill(torch.arange(length) >= lens[:, None], pad)
    tgt = torch.cat([src, torch.full((n, 1), pad)], dim=1)
    tgt[torch.arange(n), lens] = eos
    dec_in = torch.cat([torch.full((n, 1), bos), tgt[:, :-1]], dim=1).masked_fill(tgt == pad, pad)
    return src, dec_in, tgt
