"""The import structure: no import cycle inside ``seq2seq``, ``seq2seq.nn`` on its own,
nothing but the console script importing the command line, and plain commands that start
without Lightning."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "seq2seq"
REPO = PACKAGE.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``node`` sits under ``if TYPE_CHECKING:`` (never run)."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that module ``name`` imports anywhere in its code (at module level
    or inside a function: a lazy import still closes a cycle), type-checking imports left
    out. ``from a import b`` counts as ``a.b`` where that is a module, else as ``a``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}, "g": set()}
    assert _cycles(graph) == [["a", "b", "c"], ["e", "f"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_inside_seq2seq():
    assert _cycles(_graph()) == []


def test_seq2seq_nn_imports_nothing_else_of_ours():
    outside = {
        name: sorted(t for t in targets if not t.startswith("seq2seq.nn"))
        for name, targets in _graph().items()
        if name == "seq2seq.nn" or name.startswith("seq2seq.nn.")
    }
    assert outside and {name: t for name, t in outside.items() if t} == {}


def test_nothing_but_the_console_script_imports_the_command_line():
    importers = {
        name
        for name, targets in _graph().items()
        if any(t == "seq2seq.cli" or t.startswith("seq2seq.cli.") for t in targets)
        and not (name == "seq2seq.cli" or name.startswith("seq2seq.cli."))
    }
    assert importers == {"seq2seq.console"}


def _run(code: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.parametrize("command", ["translate", "average"])
def test_plain_commands_start_without_lightning_cli(command):
    """``seq2seq translate --help`` and ``average --help`` import neither LightningCLI nor
    jsonargparse (their commands' own modules may import other parts of Lightning)."""
    lines = _run(
        f"""
        import sys
        from seq2seq import console
        sys.argv = ["seq2seq", "{command}", "--help"]
        try:
            console.main()
        except SystemExit as stop:
            assert stop.code == 0, stop.code
        print("LOADED", "lightning.pytorch.cli" in sys.modules, "jsonargparse" in sys.modules)
        """
    )
    assert lines[-1] == "LOADED False False"
    assert any(line.startswith("usage: seq2seq " + command) for line in lines)


def test_top_level_help_imports_neither_torch_nor_lightning():
    """``seq2seq --help`` prints in a fraction of a second, not the seconds of Lightning's
    import; ``| head`` closing the pipe early is no error."""
    lines = _run(
        """
        import sys
        from seq2seq import console
        sys.argv = ["seq2seq", "--help"]
        assert console.main() == 0
        print("LOADED", "torch" in sys.modules, "lightning" in sys.modules)
        """
    )
    assert lines[0].startswith("usage: seq2seq {fit,validate,test,predict}")
    assert lines[-1] == "LOADED False False"
    # the reader closes the pipe before the help is written
    proc = subprocess.Popen(
        [sys.executable, "-m", "seq2seq.cli", "--help"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == "", err


@pytest.mark.parametrize("command", ["translate", "average", "export"])
def test_the_console_path_itself_imports_neither_torch_nor_lightning(command):
    """With the commands module replaced by one that imports nothing, running a plain command
    through the console script loads neither torch nor Lightning: what the dispatch itself
    costs. ``export`` is dispatched like the other two where the commands module has it."""
    lines = _run(
        f"""
        import sys, types
        stub = types.ModuleType("seq2seq.commands")
        def run(argv, name="{command}"):
            print("RAN", name, argv)
        setattr(stub, "{command}", run)
        sys.modules["seq2seq.commands"] = stub
        from seq2seq import console
        sys.argv = ["seq2seq", "{command}", "--help"]
        assert console.main() == 0
        print("LOADED", "torch" in sys.modules, "lightning" in sys.modules)
        """
    )
    assert lines == [f"RAN {command} ['--help']", "LOADED False False"]
