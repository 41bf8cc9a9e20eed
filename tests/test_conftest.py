"""Tests of the test set-up itself: a missing Multi30k stops the run once, with a hint."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import conftest
import pytest


def _item(nodeid: str, fixturenames=(), module_globals=(), skipped: bool = False):
    """A stand-in for a collected test: its fixture closure and its module's global names."""
    module = types.SimpleNamespace(**{name: None for name in module_globals})
    return types.SimpleNamespace(
        nodeid=nodeid,
        fixturenames=list(fixturenames),
        module=module,
        get_closest_marker=lambda name: object() if skipped and name == "skip" else None,
    )


def _session(*items, collectonly: bool = False):
    option = types.SimpleNamespace(collectonly=collectonly)
    return types.SimpleNamespace(items=list(items), config=types.SimpleNamespace(option=option))


def test_a_missing_multi30k_stops_the_run_when_a_selected_test_needs_it(tmp_path, monkeypatch):
    missing = tmp_path / "missing"
    monkeypatch.setattr(conftest, "MULTI30K", missing)
    monkeypatch.setenv("SEQ2SEQ_MULTI30K", str(missing))
    plain = _item("t.py::plain", fixturenames=["tmp_path"])
    for needing in (
        _item("t.py::by_fixture", fixturenames=["tiny_run", "multi30k_dir"]),
        _item("t.py::by_module", module_globals=["MULTI30K"]),
    ):
        with pytest.raises(pytest.exit.Exception) as info:
            conftest.pytest_collection_finish(_session(plain, needing))
        assert info.value.returncode == pytest.ExitCode.USAGE_ERROR
        message = str(info.value)
        assert f"{missing / 'train.de.gz'} does not exist (SEQ2SEQ_MULTI30K={missing})" in message
        assert "set SEQ2SEQ_MULTI30K to the folder" in message
        assert f"1 selected test(s) use it, e.g. {needing.nodeid}." in message
        conftest.pytest_collection_finish(_session(plain, needing, collectonly=True))
    # Tests that do not read the corpus, or are skipped anyway, run without it.
    skipped = _item("t.py::gpu", fixturenames=["multi30k_dir"], skipped=True)
    conftest.pytest_collection_finish(_session(plain, skipped))
    conftest.pytest_collection_finish(_session())
    # Present: nothing to say.
    missing.mkdir()
    (missing / "train.de.gz").write_bytes(b"")
    conftest.pytest_collection_finish(
        _session(plain, _item("t.py::x", module_globals=["MULTI30K"]))
    )


def test_pytest_without_multi30k_prints_the_hint_not_a_traceback(tmp_path):
    """End to end: ``pytest tests/test_corpus.py`` with SEQ2SEQ_MULTI30K naming no folder exits
    before any test with status 4 and the hint (it failed with a FileNotFoundError per test)."""
    env = {**os.environ, "SEQ2SEQ_MULTI30K": str(tmp_path / "nowhere")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
        + ["tests/test_corpus.py", "-k", "read_lines_gz_and_plain_agree"],
        cwd=conftest.REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, output
    assert "Multi30k not found: " in output and "set SEQ2SEQ_MULTI30K to the folder" in output
    assert "FileNotFoundError" not in output and "Traceback" not in output
    assert "1 selected test(s) use it" in output  # counted after -k deselected the others
    assert " passed" not in output and " failed" not in output
