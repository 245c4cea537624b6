"""The command line parses before any heavy import: ``mmpos --help``, every ``mmpos COMMAND ... --help`` and the
argument errors caught while parsing import neither torch nor diffusers, timm, transformers or accelerate
(checked with ``python -X importtime``, which lists every module a process imports; a property, not a timing:
``benchmarks/bench_cli_start.py`` prints the wall-clock times)."""

import subprocess
import sys

import pytest

HEAVY = ("torch", "diffusers", "timm", "transformers", "accelerate")


def _paths():
    from mmpos.pipelines.commands import build_parser, command_paths

    return list(command_paths(build_parser()))


def imported_modules(*argv: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run ``python -X importtime -m mmpos.cli ARGV``; its result and the top-level names of what it imported."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mmpos.cli", *argv], capture_output=True, text=True, timeout=300
    )
    names = {
        line.rpartition("|")[2].strip().split(".")[0]
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    return result, names


def test_list_imports_nothing_heavy_and_list_verbose_only_torch():  # -v is also the checker's negative control
    result, names = imported_modules("list")
    assert result.returncode == 0 and "rope_axial" in result.stdout
    assert not names & set(HEAVY)
    result, names = imported_modules("list", "-v")
    assert result.returncode == 0 and "head_dim (required)" in result.stdout
    assert names & set(HEAVY) == {"torch"}


def test_every_command_path_is_covered():
    paths = _paths()
    assert {
        ("generate", "image"),
        ("generate", "video"),
        ("train", "vit"),
        ("eval", "vit"),
        ("world", "clip"),
        ("edit", "loose"),
        ("viz", "cameras"),
    } <= set(paths) and len(paths) >= 23


@pytest.mark.parametrize("words", _paths(), ids=lambda words: " ".join(words) or "mmpos")
def test_help_imports_no_heavy_module(words):
    result, names = imported_modules(*words, "--help")
    assert result.returncode == 0 and "usage: mmpos" in result.stdout, result.stderr[-2000:]
    assert not names & set(HEAVY), (words, sorted(names & set(HEAVY)))


@pytest.mark.parametrize(
    "argv, named",
    [
        (["generate", "video", "--height", "0"], "--height"),
        (["generate", "--width", "-3"], "--width"),
        (["train", "vit", "--output-dir", "run", "--steps", "zero"], "--steps"),
        (["edit", "transplant", "--background", "b.png"], "--reference"),
        (
            ["world", "render", "--out", "o", "--shape", "blob", "--colour", "red", "--box", "1", "2", "3", "4"],
            "--shape",
        ),
        (["demo", "--count", "0"], "--count"),
    ],
)
def test_argument_errors_are_one_line_before_any_heavy_import(argv, named):
    result, names = imported_modules(*argv)
    message = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert result.returncode == 2 and len(message) == 1 and named in message[0], message
    assert not names & set(HEAVY), sorted(names & set(HEAVY))


def test_a_caption_word_the_world_model_does_not_know_is_refused_before_it_loads(tmp_path, monkeypatch, capsys):
    from mmpos.cli import main
    from mmpos.models.world import image as models

    def no_loading(*args, **kwargs):
        raise AssertionError("the model loaded before the caption was checked")

    monkeypatch.setattr(models, "load_world_pipeline", no_loading)
    with pytest.raises(SystemExit) as exit_info:
        main(["world", "sample", "--caption", "a red dragon", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "['dragon']" in err[0], err
    assert not (tmp_path / "out").exists()
