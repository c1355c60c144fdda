"""Every flag of every ``ansor`` command, and every environment variable we read, given bad values.

The walk is derived from the parsers themselves, so a flag added later is walked too, and a flag whose value
nothing checks fails the walk. Each bad value must give exit status 2 and exactly one ``error:`` line that
names the flag (or variable), never a traceback. Everything runs in this process: bad values are refused
before any work starts, so no case builds or tunes anything.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ansor import arguments
from ansor.cli.commands import COMMANDS
from ansor.cli.main import command_parser, main

ROOT = Path(__file__).resolve().parents[1]


def bad_values(action: argparse.Action, tmp: Path) -> list[str]:
    """Values the action's type (or choices) must refuse: empty, negative, huge, wrong type, and the
    type's own kind of wrong (a missing file, a directory for a file, ...)."""
    kind = action.type
    if action.choices:
        return ["", "no-such-choice"]
    if isinstance(kind, arguments.Number):
        values = ["", "abc", "nan", "inf", "1e400", str(10 ** 30)]
        values.append(str(int(kind.low) - 1) if kind.integer else repr(kind.low - 1))
        values.append(str(int(kind.high) + 1) if kind.integer else repr(kind.high * 2))
        if kind.integer:
            values.append("1.5")
        return values
    if isinstance(kind, arguments.ExistingFile):
        return ["", str(tmp / "missing.json"), str(tmp)]
    if isinstance(kind, arguments.OutputFile):
        return ["", str(tmp), str(tmp / "a-file" / "below-a-file.json")]
    if isinstance(kind, arguments.OutputDir):
        return ["", str(tmp / "a-file")]
    if isinstance(kind, arguments.Text):
        return ["", "   ", "a\x00b"]
    if kind is arguments.ray_address_type:
        return ["", "abc", "host:0", "host:99999", "1.2.3.4", "http://x:1"]
    raise AssertionError(f"{'/'.join(action.option_strings) or action.dest}: no type checks its value")


def base_argv(command: str, tmp: Path) -> list[str]:
    """Valid values for what a command requires, so that only the walked flag is wrong."""
    log = str(tmp / "net-b1.json")
    return {"evaluate": [log], "export": [log, "--out", str(tmp / "out")], "export-kernels": [log, "--out", str(tmp)],
            "train-model": [log, "--out", str(tmp / "m.npz")], "pretrain": [log, "--out-dir", str(tmp / "data")],
            "plot": [log]}.get(command, [])


def cases(tmp: Path) -> list[tuple[str, str, list[str]]]:
    """(command, flag, argv) for every bad value of every flag with a value."""
    found = []
    for command in COMMANDS:
        parser = command_parser(command.NAME, f"ansor {command.NAME}")
        for action in parser._actions:
            if action.nargs == 0 or isinstance(action, argparse._HelpAction):
                continue
            flag = action.option_strings[-1] if action.option_strings else action.metavar or action.dest
            base = base_argv(command.NAME, tmp)
            for value in bad_values(action, tmp):
                if action.option_strings:
                    argv = [command.NAME, *base, f"{flag}={value}"]
                else:  # a positional: the walked value replaces the base's first argument
                    argv = [command.NAME, value, *base[1:]]
                found.append((command.NAME, flag, argv))
    return found


@pytest.fixture()
def walk_dir(tmp_path):
    (tmp_path / "a-file").write_text("not a directory\n")
    (tmp_path / "net-b1.json").write_text("")
    return tmp_path


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_every_flag_of_every_command_refuses_bad_values(walk_dir, capsys, monkeypatch):
    monkeypatch.chdir(walk_dir)
    walked = cases(walk_dir)
    assert len({c for c, _, _ in walked}) == len(COMMANDS) and len(walked) > 300
    for command, flag, argv in walked:
        code = main(argv)
        line = _one_error_line(capsys)
        assert code == 2, (argv, line)
        assert flag in line, (argv, line)
    print(f"{len(walked)} bad flag values tried over {len(COMMANDS)} commands, 0 tracebacks")


def test_a_value_the_types_accept_passes(walk_dir):
    """The walk's types are not refusing everything: good values of each kind are taken as they are."""
    assert arguments.TRIALS("64") == 64 and arguments.MINUTES("0.5") == 0.5 and arguments.SEED("0") == 0
    assert arguments.ExistingFile("a log", "x")(str(walk_dir / "a-file")) == str(walk_dir / "a-file")
    assert arguments.OutputFile("a log", "x")(str(walk_dir / "new" / "log.json"))
    assert arguments.OutputDir("a dir", "x")(str(walk_dir)) == str(walk_dir)
    assert arguments.ray_address_type("127.0.0.1:6379") == "127.0.0.1:6379"
    assert arguments.ray_address_type("ray://head:10001") and arguments.ray_address_type("auto") == "auto"
    assert not math.isfinite(float("inf"))  # the walk's "inf" is a value Number must refuse


BAD_ENVIRONMENT = [("TVM_NUM_THREADS", v) for v in ("", "abc", "0", "-1", "2.5", str(10 ** 8))] + \
                  [("RAY_ADDRESS", v) for v in ("abc", "host:0", "host:99999")] + \
                  [("ANSOR_HOST_LOCK", v) for v in ("/tmp", "/proc/version/lock", "/tmp/no-such-folder/lock")]


@pytest.mark.parametrize("command", [c.NAME for c in COMMANDS])
def test_every_environment_variable_refuses_bad_values(command, walk_dir, capsys, monkeypatch):
    """Each command checks the variables first: one line naming the variable, exit 2, nothing started."""
    monkeypatch.chdir(walk_dir)
    argv = [command, *base_argv(command, walk_dir)]
    assert set(arguments.ENVIRONMENT) == {name for name, _ in BAD_ENVIRONMENT}
    for name, value in BAD_ENVIRONMENT:
        with monkeypatch.context() as env:
            env.setenv(name, value)
            code = main(argv)
            line = _one_error_line(capsys)
            assert code == 2 and name in line, (name, value, line)


def test_an_empty_ray_address_or_lock_path_means_unset(walk_dir, capsys, monkeypatch):
    """As Ray reads RAY_ADDRESS: empty is unset, so the command goes on to its own checks."""
    monkeypatch.setenv("RAY_ADDRESS", "")
    monkeypatch.setenv("ANSOR_HOST_LOCK", "")
    assert main(["tune-op", "--wkl", "no-such-workload"]) == 2
    assert "no-such-workload" in _one_error_line(capsys)


@pytest.mark.slow
def test_ansor_command_and_python_dash_m_and_the_scripts_agree(tmp_path):
    """The console script, ``python -m ansor`` and the old script name run the same parser."""
    env = {k: v for k, v in os.environ.items() if k not in arguments.ENVIRONMENT}
    ansor = Path(sys.executable).with_name("ansor")
    runs = [[sys.executable, "-m", "ansor", "tune-op", "--n-trials", "0"],
            [sys.executable, str(ROOT / "scripts" / "tune_test.py"), "--n-trials", "0"]]
    if ansor.exists():
        runs.append([str(ansor), "tune-op", "--n-trials", "0"])
    for cmd in runs:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip() == "error: --n-trials must be an integer from 1 to 10000000, got '0' " \
                                      "(example: --n-trials 64)", proc.stderr
    listed = subprocess.run([sys.executable, "-m", "ansor", "--help"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and all(c.NAME in listed.stdout for c in COMMANDS)
