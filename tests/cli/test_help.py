"""Every command and every option says what it does and what it defaults to, and the defaults are true."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.cli import _parser, main
from reconciler.settings import Settings


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser, str | None]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, sub, helps.get(name)


def options() -> Iterator[tuple[str, argparse.Action]]:
    root = _parser()
    for action in root._actions:
        yield "flink-reconciler", action
    for name, sub, _ in subcommands(root):
        for action in sub._actions:
            yield name, action


def label(command: str, action: argparse.Action) -> str:
    return f"{command} {'/'.join(action.option_strings) or action.dest}"


def shown(value: object) -> str:
    """A Settings default the way the help text spells it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}s"
    if value == "":
        return "the repository root"
    return str(value)


def test_every_command_has_help() -> None:
    commands = list(subcommands(_parser()))
    assert {name for name, _, _ in commands} >= {"validate", "plan", "apply", "status", "history", "run",
                                                 "render", "schema"}
    missing = [name for name, _, text in commands if not text]
    assert not missing, f"commands without help: {missing}"


def test_every_option_has_one_line_help_with_its_default() -> None:
    problems = []
    for command, action in options():
        if isinstance(action, argparse._SubParsersAction):
            continue  # its commands: test_every_command_has_help
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            if not action.help:
                problems.append(f"{label(command, action)}: no help")
            continue
        text = action.help or ""
        if not text.strip():
            problems.append(f"{label(command, action)}: no help")
        elif "\n" in text:
            problems.append(f"{label(command, action)}: help is more than one line")
        elif not action.required and "(default" not in text:
            problems.append(f"{label(command, action)}: help does not say the default")
    assert not problems, "\n".join(problems)


def test_defaults_in_help_are_the_real_defaults() -> None:
    """Settings-backed flags default to None (so env and config can fill them): the help must quote Settings."""
    checked = 0
    for command, action in options():
        text = (action.help or "") % {"default": action.default}
        if action.dest in Settings.model_fields:
            want = shown(Settings.model_fields[action.dest].default)
            said = text.partition("(default: ")[2]
            assert want in said, f"{label(command, action)}: {text!r} does not say {want!r}"
            checked += 1
        elif action.default not in (None, False, argparse.SUPPRESS) and action.option_strings:
            assert f"(default: {action.default}" in text, f"{label(command, action)}: {text!r}"
    assert checked > 20


@pytest.mark.parametrize("command", ["validate", "plan", "apply", "status", "history", "run", "render", "schema"])
def test_help_of_every_command_renders(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: flink-reconciler {command}")


def test_help_of_run_documents_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for flag, default in [("--poll-interval DURATION", "15s"), ("--drift-interval DURATION", "60s"),
                          ("--listen-port PORT", "8080"), ("--status-sink", "notes"), ("--runtime", "local"),
                          ("--branch BRANCH", "main"), ("--max-parallel N", "4"), ("--state-dir", ".state")]:
        assert flag in out
        assert f"(default: {default})" in out
    assert "docs/daemon.md" in out


def test_the_read_only_ui_offers_no_flag_that_only_acting_commands_use(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["ui", "--help"])
    out = capsys.readouterr().out
    assert "--dry-run" not in out and "--max-parallel" not in out
    assert "--insecure-ui" in out and "--state-dir" in out


def test_readme_cli_section_shows_the_real_top_level_help(capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # the width the README's copy was taken at
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    commands = [line for line in out.splitlines() if line.startswith("    ")]
    assert commands and all(line in readme for line in commands), "README's `--help` output is stale"
