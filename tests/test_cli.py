"""The ``sandbox`` command explains itself: ``--help`` works on every command and subcommand (found by walking
the parser, so a new one is covered without editing this file) and describes every option; a bare
``sandbox`` prints the help; ``--device`` defaults to auto wherever it is offered; an error in ``--set`` names
``--set``."""
from __future__ import annotations

import argparse

import pytest

from sandbox.cli import build_parser, main


def _commands(parser: argparse.ArgumentParser, path: tuple = ()):
    """(words after ``sandbox``, parser) for the top level and every subcommand below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, path + (name,))


COMMANDS = list(_commands(build_parser()))


def test_the_walk_finds_the_nested_subcommands():
    paths = {p for p, _ in COMMANDS}
    assert {(), ("train",), ("inspect",), ("plot",), ("bench",), ("bench", "train"), ("bench", "sweep"),
            ("bench", "kernels")} <= paths


@pytest.mark.parametrize("path,parser", COMMANDS, ids=[" ".join(p) or "sandbox" for p, _ in COMMANDS])
def test_help_works_and_describes_every_option(path, parser, capsys):
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {' '.join(('sandbox', *path))}")
    assert "``" not in out, "raw reST markup in the help"
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for sub in action._choices_actions:
                assert sub.help, f"sandbox {' '.join(path)} {sub.dest}: no help line"
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help != argparse.SUPPRESS, f"sandbox {' '.join(path)} {name}: no help text"


@pytest.mark.parametrize("argv", [[], ["bench"]], ids=["sandbox", "sandbox bench"])
def test_a_command_without_its_subcommand_prints_the_help(argv, capsys):
    assert main(argv) == 0
    out = capsys.readouterr().out
    parser = dict(COMMANDS)[tuple(argv)]
    names = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert out.startswith("usage:") and all(name in out for name in names)


def test_device_defaults_to_auto_everywhere():
    offered = [(path, a.default) for path, parser in COMMANDS for a in parser._actions
               if "--device" in a.option_strings]
    assert offered, "no command offers --device"
    assert all(default == "auto" for _, default in offered), offered


@pytest.mark.parametrize("override,key", [
    ("model.d_model=abc", "model.d_model: expected an integer, got 'abc'"),
    ("model.gla.conv_size=-1", "model.gla.conv_size: must be >= 0"),
    ("model.mixer=[gla, nope]", "model.mixer[1]: unknown mixer 'nope'"),
    ("train.lrate=0.1", "train.lrate: unknown key"),
    ("model.d_model", "model.d_model: expected KEY=VALUE"),
])
def test_a_bad_set_is_blamed_on_set_not_on_the_file(tmp_path, capsys, override, key):
    """The packaged quickstart is fine; what --set put in is not, and the one-line error says so."""
    from sandbox.cli import quickstart_path
    assert main(["train", "--set", override, "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"sandbox: error: --set: {key}" or err.startswith(f"sandbox: error: --set: {key}"), err
    assert str(quickstart_path()) not in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_an_error_that_set_only_exposed_names_the_file_and_the_overrides(tmp_path, capsys):
    """Thirty pairs do not fit the file's 64 tokens: the key at fault is the file's seq_len, read with --set."""
    from sandbox.cli import quickstart_path
    assert main(["train", "--set", "task.num_kv_pairs=30", "--out", str(tmp_path / "run"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"sandbox: error: {quickstart_path()} with --set task.num_kv_pairs=30: task.seq_len: ")
