"""Ctrl-C while a command loads its model ends ``mmpos`` with one line and exit code 130, no traceback: a real
SIGINT, sent by the process to itself from inside the (patched) loader, as a terminal's Ctrl-C would arrive."""

import subprocess
import sys

import pytest

from mmpos.training.scaffold.interrupt import EXIT_CODE

RUN = """
import os, signal, sys, time
import {module} as target

def loading(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(60)  # the KeyboardInterrupt arrives here
    raise AssertionError("SIGINT did not interrupt the load")

target.{name} = loading
from mmpos.cli import main
sys.exit(main(sys.argv[1:]))
"""

CASES = {  # command: (argv after the command words, the loader patched)
    "generate": (["--model", "world", "--prompt", "a red cube"], "mmpos.pipelines.loading.load_pipeline"),
    "generate video": (
        ["--model", "tiny", "--frames", "5", "--steps", "1"],
        "mmpos.pipelines.commands.generate.video._pipeline",
    ),
}


@pytest.mark.parametrize("command", CASES)
def test_ctrl_c_while_loading_prints_one_line_and_exits_130(command, tmp_path):
    argv, loader = CASES[command]
    module, _, name = loader.rpartition(".")
    result = subprocess.run(
        [sys.executable, "-c", RUN.format(module=module, name=name), *command.split(), "--out", str(tmp_path / "o")]
        + argv,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == EXIT_CODE == 130, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.strip().splitlines() == [f"mmpos {command.split()[0]}: interrupted"]
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())  # nothing written


def test_main_returns_130_for_an_interrupted_command_and_the_code_of_any_other(monkeypatch):
    """The command tree's main is where it is caught: a command that raises it returns 130, one that returns
    normally keeps its own code (the negative control of the case above)."""
    from mmpos.pipelines import commands

    def interrupted(args):
        raise KeyboardInterrupt

    parser = commands.build_parser()
    args = parser.parse_args(["list"])
    monkeypatch.setattr(args, "func", interrupted, raising=False)
    monkeypatch.setattr(commands, "build_parser", lambda: _Fixed(args))
    assert commands.main(["list"]) == EXIT_CODE
    args.func = lambda args: 0
    assert commands.main(["list"]) == 0


class _Fixed:
    def __init__(self, args):
        self.args = args

    def parse_args(self, argv):
        return self.args
