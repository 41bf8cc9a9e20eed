"""The command line's words: argument errors in a few lines, help texts, the YAML pre-check.

Nothing here imports Lightning: the plain commands (``translate``, ``average``, ``export``)
start without it.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
import sys
from argparse import ArgumentParser
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from seq2seq import compat
from seq2seq.spelling import did_you_mean

_OFF_VALUES = ("", "0", "false", "no", "off")


def traceback_wanted() -> bool:
    """Whether ``SEQ2SEQ_TRACEBACK`` asks for tracebacks: set to anything but an off value
    (empty, ``0``, ``false``, ``no``, ``off``, in any case)."""
    return os.environ.get("SEQ2SEQ_TRACEBACK", "").strip().lower() not in _OFF_VALUES


#: ``--ckpt_path`` of ``validate``/``test``/``predict`` that asks for the model of the config
#: with freshly initialised weights (without any ``--ckpt_path`` they refuse to run).
UNTRAINED = "untrained"


#: What ``validate``/``test``/``predict`` do with the checkpoint (for their error and help).
USES = {
    "validate": ("score", "scores"),
    "test": ("score", "scores"),
    "predict": ("translate with", "translates with"),
}


_RST_ROLE = re.compile(r":(?:func|class|meth|attr|data|mod|obj):`~?([^`]+)`")


def plain_help(text: str) -> str:
    """``--help`` text without reStructuredText markup: roles become their target's name,
    double back-quotes go."""
    return _RST_ROLE.sub(r"\1", text).replace("``", "")


def argument_error_lines(message: str, parser: ArgumentParser) -> list[str]:
    """A jsonargparse error ``message`` as a few ``seq2seq: error: ...`` lines."""
    first, *rest = message.strip().splitlines() or [""]
    if first.startswith("unrecognized arguments: "):
        return _unrecognized_lines(first.split(": ", 1)[1].split(), parser)
    match = re.fullmatch(
        r"(?:Subcommand '[^']*'|Group '([^']*)') does not accept option '([^']*)'", first
    )
    if match:  # a key of a config file (or of a dict given on the command line)
        key = f"{match[1]}.{match[2]}" if match[1] else match[2]
        # a config file's key is reported by the root parser: the subcommand's has the keys
        names = [arg for arg in sys.argv[1:] if compat.subcommand_parser(parser, arg)]
        parser = compat.subcommand_parser(parser, names[0]) if names else parser
        keys = [
            a.dest for a in compat.parser_actions(parser) if a.option_strings and a.dest != "help"
        ]
        files = _config_files_with(key.split("."), sys.argv[1:])
        if len(files) != 1:
            return [f"seq2seq: error: unknown config key '{key}'{did_you_mean(key, keys)}"]
        # jsonargparse stops at the first: the file's others are named in the same run
        others = _unknown_keys(dict(_config_files(sys.argv[1:]))[files[0]], set(keys))
        return [
            f"seq2seq: error: unknown config key '{name}' in {files[0]}{_key_hint(name, keys)}"
            for name in (others if key in others else [key])
        ]
    match = re.match(r'Parser key "([^"]+)":\s*(.*)', first)
    if match:
        return _invalid_value_lines(match[1], match[2], rest)
    match = re.match(r"argument (\S+) --> (\S+): ", first)
    if match:  # a linked option given directly (jsonargparse words this badly)
        source = re.sub(r"^\w+\((.*)\)$", r"\1", match[1])
        return [
            f"seq2seq: error: --{match[2]} cannot be set: it is taken from --{source} "
            "(set that instead)"
        ]
    match = re.match(r"argument \S+: invalid choice: '([^']*)'", first)
    if match and compat.subcommand_names(parser):
        commands = [*compat.subcommand_names(parser), *plain_commands()]
        return [
            f"seq2seq: error: unknown command '{match[1]}'{did_you_mean(match[1], commands)}; "
            f"the commands are {', '.join(commands)}"
        ]
    return [f"seq2seq: error: {line.strip()}" for line in [first, *rest][:6] if line.strip()]


def _key_hint(name: str, keys: Sequence[str]) -> str:
    """:func:`did_you_mean` of a config file's dotted key among the parser's ``keys``; where
    none is close, the key with a misspelt first part put right (``modle.optimizer.init_args.lr``:
    ``model.optimizer.init_args.lr``; a class's arguments are no parser keys)."""
    hint = did_you_mean(name, keys)
    head, _, rest = name.partition(".")
    groups = {key.split(".", 1)[0] for key in keys}
    if hint or not rest or head in groups:
        return hint
    close = difflib.get_close_matches(head, sorted(groups), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}.{rest}?)" if close else ""


def _config_files(argv: Sequence[str]) -> list[tuple[str, Any]]:
    """``(name, parsed YAML)`` of the ``--config`` (``-c``) files of ``argv`` that parse."""
    names = [
        value for option, value in zip(argv, argv[1:], strict=False) if option in ("-c", "--config")
    ]
    names += [arg.split("=", 1)[1] for arg in argv if arg.startswith("--config=")]
    files = []
    for name in names:
        try:
            files.append((name, yaml.safe_load(Path(name).read_text(encoding="utf-8"))))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
    return files


def _holds(node: Any, path: list[str]) -> bool:
    """Whether YAML ``node`` holds the key ``path`` (``init_args`` levels skipped); a path of
    one key is looked for at any depth (an argument of a class in a list, trainer.callbacks)."""
    if len(path) == 1 and isinstance(node, list | dict):
        values = node.values() if isinstance(node, dict) else node
        return (isinstance(node, dict) and path[0] in node) or any(_holds(v, path) for v in values)
    for part in path:
        if isinstance(node, dict) and part not in node and "init_args" in node:
            node = node["init_args"]
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _unknown_keys(node: Any, keys: set[str], prefix: str = "") -> list[str]:
    """The dotted keys of YAML ``node`` that are neither in ``keys`` (a parser's option
    names) nor the start of one, in file order. A group (``model``, itself an option that
    takes a file) is looked into; a class with its arguments (``class_path``) is not."""
    unknown = []
    for name, value in node.items() if isinstance(node, dict) else ():
        path = f"{prefix}{name}"
        group = isinstance(value, dict) and "class_path" not in value
        if group and any(key.startswith(f"{path}.") for key in keys):
            unknown += _unknown_keys(value, keys, f"{path}.")
        elif group and path not in keys:  # a misspelt group: its keys, as jsonargparse names them
            unknown += _unknown_keys(value, set(), f"{path}.") or [path]
        elif path not in keys:
            unknown.append(path)
    return unknown


def _config_files_with(path: list[str], argv: Sequence[str]) -> list[str]:
    """The ``--config`` files of ``argv`` that hold the key ``path`` (see :func:`_holds`), so
    an unknown key is reported with the file it is in."""
    return [name for name, node in _config_files(argv) if _holds(node, path)]


def _unrecognized_lines(tokens: list[str], parser: ArgumentParser) -> list[str]:
    options = [
        option
        for option in compat.option_strings(parser)
        if option.startswith("--") and not option.endswith(".help")
    ]
    lines = []
    after_option = False
    for token in tokens:
        if token.startswith("-") and not re.fullmatch(r"-[\d.eE+-]+", token):
            name = token.split("=", 1)[0]
            lines.append(f"seq2seq: error: unrecognized option {name}{did_you_mean(name, options)}")
            after_option = "=" not in token
        elif after_option:  # the value of the option before it
            after_option = False
        else:
            lines.append(f"seq2seq: error: unexpected argument {token!r}")
    if len(lines) > 5:
        lines[5:] = [f"seq2seq: error: ... and {len(lines) - 5} more"]
    return lines


def _invalid_value_lines(key: str, inline: str, details: list[str]) -> list[str]:
    """``Parser key "key": ...`` (a value of the wrong type or an invalid class) in short."""
    value = None
    expected: list[str] = []
    choices: list[str] = []
    notes: list[str] = []
    prefix = ""  # the class that the next note is about
    # jsonargparse lists, for each type it tried, what it expected and the value given; the
    # user needs the value, the types expected and the notes of a class at fault, once each.
    for raw in details:
        line = raw.strip().removeprefix("- ").strip()
        if (
            not line
            or line in ("Errors:", "Does not validate against any of the Union subtypes")
            or line.startswith(("Subtypes:", "Given value type:", "Expected a path but "))
        ):
            continue
        if line.startswith("Given value: "):
            value = line.split(": ", 1)[1]
            continue
        match = re.fullmatch(r"Problem with given class_path '([^']*)':", line)
        if match:
            prefix = f"{match[1]}: "
            continue
        unknown = re.fullmatch(r"Option '([^']+)' is not accepted", line)
        if unknown and prefix:  # an argument of a class in a list (trainer.callbacks)
            flags = (f"--{key}.{unknown[1]}", f"--{key}.init_args.{unknown[1]}")
            if any(arg.split("=", 1)[0] in flags for arg in sys.argv[1:]):
                line = _unknown_argument_line(flags[0], prefix[:-2], unknown[1])
                patience = unknown[1] == "patience"
                return [
                    f"{line}; a --{key}.<argument> flag sets the last class of the list"
                    + (" (EarlyStopping's patience: --patience N)" if patience else "")
                ]
            files = _config_files_with([unknown[1]], sys.argv[1:])
            where = f"{key} in {files[0]}" if len(files) == 1 else f"--{key}"
            return [_unknown_argument_line(where, prefix[:-2], unknown[1])]
        required = re.fullmatch(r"the following arguments are required: (.+)", line)
        if required and prefix:  # a class of a list (trainer.callbacks) without what it needs
            names = [name.strip() for name in required[1].split(",")]
            example = " val/loss" if names == ["monitor"] else " ..."
            return [
                f"seq2seq: error: --{key}: {prefix[:-2]} needs {', '.join(names)}: give "
                f"--{key}.{names[0]}{example} after it (a --{key}.<argument> flag sets the "
                "last class of the list), or its init_args in the config file"
            ]
        match = re.fullmatch(r"Expected a dot import path string: (.*)", line)
        if match:
            notes.append(f"{match[1]!r} is not a known class name or import path")
            continue
        match = re.fullmatch(r".*callable class: the following arguments are required: (.+)", line)
        if match:  # a class given without an argument it needs
            given = re.search(r"class_path='([^']+)'", "\n".join(details))
            needs = ", ".join(f"--{key}.init_args.{arg.strip()}" for arg in match[1].split(","))
            of = f" {given[1]}" if given else ""
            return [f"seq2seq: error: --{key}{of} needs {needs}"]
        match = re.fullmatch(r".*callable class: Option '([^']+)' is not accepted\..*", line)
        given = re.search(r"class_path='([^']+)'", line)
        if match and given:  # an argument the class given does not take
            return [_unknown_argument_line(f"--{key}.init_args.{match[1]}", given[1], match[1])]
        match = re.fullmatch(r'.*: Parser key "([^"]+)":', line)
        if match and "." not in match[1]:  # an argument of the class given: the next line
            after = details[details.index(raw) + 1 :]
            nested = _nested_argument_line(key, match[1], raw, after)
            if nested:
                return [nested]
        match = re.fullmatch(r"Expected a (.+?)(?:\. Got value: (.*))?", line)
        if match and not prefix:
            if match[2] is not None:
                value = match[2]
            literal = re.fullmatch(r"(?:typing\.)?Literal\[(.*)\]", match[1])
            if literal:
                choices.append(literal[1])
            else:
                expected.append(_type_name(match[1]))
            continue
        notes.append(prefix + line)
        prefix = ""
    if choices:
        expected.insert(0, "one of " + ", ".join(choices))
    summary = "seq2seq: error: invalid value"
    if value is not None and not inline and not value.startswith("NestedArg("):
        summary += f" {value if len(value) <= 60 else value[:57] + '...'!r}"
    summary += f" for --{key}"
    if inline:
        summary += f": {inline}"
    if expected and not notes:  # with notes (a class at fault) the other types mislead
        summary += f" (expected {' or '.join(dict.fromkeys(expected))}"
        if value is not None and "list" in expected and not value.startswith("["):
            several = "," in value and not value.startswith(("{", '"', "'"))
            summary += f"; {'as a list' if several else 'a list of one'}: --{key} '[{value}]'"
        summary += ")"
    notes = list(dict.fromkeys(notes))
    if len(notes) > 4:
        notes[4:] = ["..."]
    return [summary, *(f"  {note}" for note in notes)]


def _unknown_argument_line(where: str, class_path: str, name: str) -> str:
    """The line for an argument ``name`` that the class ``class_path`` (given ``where``: an
    option, a config file) does not take, with the closest of those it takes."""
    module, _, attr = class_path.rpartition(".")
    try:
        params = list(inspect.signature(getattr(importlib.import_module(module), attr)).parameters)
    except (ImportError, AttributeError, TypeError, ValueError):
        params = []
    params = [p for p in params if p not in ("self", "optimizer", "params", "args", "kwargs")]
    takes = f"; it takes {', '.join(params)}" if params else ""
    return (
        f"seq2seq: error: {where}: {class_path} takes no argument {name!r}"
        f"{did_you_mean(name, params)}{takes}"
    )


def _nested_argument_line(key: str, name: str, raw: str, details: list[str]) -> str | None:
    """The line for an invalid argument ``name`` of the class given to ``--key``: jsonargparse
    words it ``... callable class: Parser key "name":`` (the line ``raw``), then, indented
    deeper (``details``), the types it expected and the value given; ``None`` if none is."""
    indent = len(raw) - len(raw.lstrip(" -"))
    value, expected = None, []
    for line in details:
        if not line.strip():
            continue
        if len(line) - len(line.lstrip(" -")) <= indent:
            break
        line = line.strip().removeprefix("- ")
        got = re.search(r"(?:Got|Given) value: (.*?)(?:\. Got value: .*)?$", line)
        if got and value is None:
            value = got[1]
        match = re.match(r"Expected an? (.+?)(?:\. Got value: .*)?$", line)
        if match and not match[1].startswith(("dot import path", "path but")):
            literal = re.fullmatch(r"(?:typing\.)?Literal\[(.*)\]", match[1])
            expected.append(f"one of {literal[1]}" if literal else _type_name(match[1]))
    if value is None or not expected:
        return None
    flag = f"--{key}.init_args.{name}"
    return f"seq2seq: error: invalid value {value!r} for {flag} (expected {' or '.join(expected)})"


def _type_name(typehint: str) -> str:
    """``<class 'int'>`` -> ``int``, ``<class 'NoneType'>`` -> ``null``."""
    name = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", typehint).replace("typing.", "")
    return "null" if name == "NoneType" else name


def check_config_position(argv: Sequence[str]) -> None:
    """Exit with status 2 and one line when ``-c/--config FILE`` comes before the subcommand
    but FILE holds one subcommand's settings (``trainer:``, ``model:``, ``data:``, as the files
    of ``configs/`` do), not a section per subcommand (``fit:``, ``test:``): jsonargparse
    would name the first option of the file as "not accepted before subcommand"."""
    if not argv or not (argv[0] in ("-c", "--config") or argv[0].startswith("--config=")):
        return
    name = argv[0].split("=", 1)[1] if "=" in argv[0] else (argv[1] if len(argv) > 1 else "")
    command = next((a for a in argv if a in SUBCOMMAND_HELP), None)
    try:
        settings = yaml.safe_load(Path(name).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return  # the other checks name the file
    if command and isinstance(settings, dict) and not set(settings) & set(SUBCOMMAND_HELP):
        print(
            f"seq2seq: error: {name} holds the settings of one command: give it after the "
            f"command, seq2seq {command} --config {name} ...",
            file=sys.stderr,
        )
        raise SystemExit(2)


def check_options_before_config(argv: Sequence[str]) -> None:
    """Exit with status 2 and one line when an option given before ``--config FILE`` (after
    the command) is one that FILE sets too: jsonargparse applies the arguments in order, so the
    file's value would silently replace the option's."""
    if not argv or argv[0] not in SUBCOMMAND_HELP:
        return
    args = list(argv[1:])
    for i, arg in enumerate(args):
        if arg in ("-c", "--config") and i + 1 < len(args):
            name = args[i + 1]
        elif arg.startswith("--config="):
            name = arg.split("=", 1)[1]
        else:
            continue
        try:
            settings = yaml.safe_load(Path(name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # the other checks name the file
        for earlier in args[:i]:
            key = earlier.split("=", 1)[0].removeprefix("--")
            if not earlier.startswith("--") or key in ("config", "print_config"):
                continue
            if _config_sets(settings, key.split(".")):
                print(
                    f"seq2seq: error: --{key} comes before --config {name}, which sets {key} "
                    f"too, and the later one wins: give the config first, seq2seq {argv[0]} "
                    f"--config {name} --{key} ...",
                    file=sys.stderr,
                )
                raise SystemExit(2)


def _config_sets(settings, parts: list[str]) -> bool:
    """Whether the parsed YAML ``settings`` hold the dotted key ``parts`` (looking into the
    ``init_args`` of a ``class_path`` entry)."""
    node = settings
    for part in parts:
        if isinstance(node, dict) and part not in node and isinstance(node.get("init_args"), dict):
            node = node["init_args"]
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def check_config_syntax(argv: Sequence[str]) -> None:
    """Exit with status 2 and one line naming the file, line and column when a YAML file given
    on the command line (``--config``, a ``--trainer`` piece, ...) is not valid YAML
    (jsonargparse reports such an error without naming the file) or sets one key twice (YAML
    loaders keep the last one silently), or when a ``--config`` file does not exist: then the
    files beside it spelt alike are named."""
    _check_config_files(argv)
    values = [a.split("=", 1)[1] if a.startswith("--") and "=" in a else a for a in argv]
    paths = [v for v in values if v.endswith((".yaml", ".yml")) and Path(v).is_file()]
    for name in paths:
        try:
            text = Path(name).read_text(encoding="utf-8")
            yaml.safe_load(text)
        except (OSError, UnicodeDecodeError):
            continue  # a missing or unreadable file: jsonargparse's error names it
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"{name}, line {mark.line + 1}, column {mark.column + 1}" if mark else name
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
            if context and start is not None:
                problem += f" ({context} at line {start.line + 1}, column {start.column + 1})"
            print(f"seq2seq: error: YAML syntax error in {where}: {problem}", file=sys.stderr)
            raise SystemExit(2) from None
        twice = _key_set_twice(yaml.compose(text, Loader=yaml.SafeLoader))
        if twice:
            key, first, again = twice
            print(
                f"seq2seq: error: {name}, line {again}: {key} is set twice (first on line "
                f"{first}), and only the last one would count: remove one of them",
                file=sys.stderr,
            )
            raise SystemExit(2)


def _key_set_twice(node: Any, path: str = "", seen: set[int] | None = None):
    """``(dotted key, first line, second line)`` of the first key that a mapping of the
    composed YAML ``node`` holds twice (``trainer.callbacks[1].init_args.monitor``), or
    ``None``. Merge keys (``<<``) are YAML's own and may repeat."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias of a node already walked
        return None
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value) if isinstance(key, yaml.ScalarNode) else "?"
            dotted = f"{path}.{name}" if path else name
            if isinstance(key, yaml.ScalarNode) and name != "<<":
                if name in lines:
                    return dotted, lines[name], key.start_mark.line + 1
                lines[name] = key.start_mark.line + 1
            found = _key_set_twice(value, dotted, seen)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _key_set_twice(item, f"{path}[{i}]", seen)
            if found:
                return found
    return None


def _check_config_files(argv: Sequence[str]) -> None:
    """Exit with status 2 and one line for a ``--config`` file name (``.yaml``, ``.yml`` or
    ``.json``; other values may be inline YAML) that names no file, with the files beside it
    spelt alike: ``multi30k_de_en.yaml`` for ``multi30k_de_en.yml``. The plain commands take
    no ``--config``, and say so."""
    if argv and argv[0] in plain_commands():
        return
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            value = arg.split("=", 1)[1]
        elif arg in ("--config", "-c") and i + 1 < len(argv):
            value = argv[i + 1]
        else:
            continue
        path = Path(value)
        if path.suffix not in (".yaml", ".yml", ".json") or path.exists():
            continue
        folder = path.parent
        names = [p.name for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []
        close = difflib.get_close_matches(path.name, names, n=3, cutoff=0.8)
        hint = f" (did you mean {' or '.join(str(folder / n) for n in close)}?)" if close else ""
        print(f"seq2seq: error: --config {value}: no such file{hint}", file=sys.stderr)
        raise SystemExit(2)


DESCRIPTION = "Train, evaluate and use encoder-decoder Transformer translation models."


def usage() -> str:
    """The usage line of ``seq2seq --help``."""
    return (
        "seq2seq {fit,validate,test,predict} [--config CONFIG] [OPTIONS]\n"
        f"       seq2seq {{{','.join(plain_commands())}}} [OPTIONS]"
    )


SUBCOMMAND_HELP = {
    "fit": "train a model (or resume a run with --ckpt_path last)",
    "validate": "score a checkpoint on the validation set (data.val_split)",
    "test": "score a checkpoint on the test sets (data.test_splits): BLEU, chrF, TER",
    "predict": "translate data.predict_file with a checkpoint, through the Trainer",
}


_PLAIN_HELP = {
    "translate": "translate text with a checkpoint alone (stdin/stdout or --input/--output)",
    "score": "the model's log-probability of given translations (--src, --tgt), one per line",
    "average": "average the parameters of several checkpoints",
    "export": "export a checkpoint to CTranslate2 or Hugging Face Transformers",
    "import": "import a Hugging Face Transformers folder (Marian, M2M-100, NLLB) as a checkpoint",
}


def plain_commands() -> list[str]:
    """The commands that run without LightningCLI (:mod:`seq2seq.commands`)."""
    return list(_PLAIN_HELP)


def overview_help() -> str:
    """``seq2seq --help``: every command in a line, written here so that it prints without
    importing Lightning (LightningCLI's own top-level help takes seconds to build)."""
    lines = [
        f"usage: {usage()}",
        "",
        DESCRIPTION,
        "",
        "Commands of a run (each has --help; settings come from YAML files, --config FILE after",
        "the command, configs/ has examples, and options such as --trainer.max_epochs 5;",
        "--print_config prints the resulting settings and exits):",
    ]
    lines += [f"  {name:<20}{text}" for name, text in SUBCOMMAND_HELP.items()]
    return "\n".join(lines) + "\n" + commands_help()


def commands_help() -> str:
    """The lines ``seq2seq --help`` ends with: the plain commands and ``--version``."""
    lines = ["", "Further commands (each has --help):"]
    for name, text in _PLAIN_HELP.items():
        lines.append(f"  {name:<20}{text}")
    lines += [
        "",
        "seq2seq --version prints the versions of seq2seq, torch, lightning, sentencepiece and "
        "sacrebleu.",
    ]
    return "\n".join(lines)


HPARAMS_CLASH = "Error while merging hparams"


def cli_value(value: Any) -> str:
    """``value`` as written on the command line: ``true``, ``null``, ``4096``."""
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)
