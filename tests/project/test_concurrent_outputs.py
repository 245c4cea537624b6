"""Two ``mmpos`` processes writing one ``--out`` never both run (issue 41, "Data loss"): the command tree claims a
named ``--out`` for the whole command (:func:`mmpos._atomic.claim_output`, a lock beside it), so the second is
refused at once with one line naming it (exit 2), and the output holds the first one's files only. An unnamed
output takes the next free folder that no other process holds."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmpos import _atomic
from mmpos.cli import main

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def mmpos(*argv: str, cwd: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "mmpos.cli", *argv]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=cwd)


def finished(run: subprocess.Popen) -> tuple[int, str]:
    _, err = run.communicate(timeout=300)
    return run.returncode, err


def test_two_world_clip_processes_into_one_folder(tmp_path):
    """The case of the issue: ``--seed 0`` and ``--seed 1`` into ``c`` at once; before, both exited 0 and the folder
    held a mix. Now one exits 0 and its clip is whole, the other is refused by name (while the first writes, or
    after: its files exist), exit 2."""
    runs = [mmpos("world", "clip", "--seed", str(seed), "--frames", "3", "--out", "c", cwd=tmp_path) for seed in (0, 1)]
    results = [finished(run) for run in runs]
    assert sorted(code for code, _ in results) == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert len(loser.strip().splitlines()) == 1 and "Traceback" not in loser, loser
    assert "another process is writing it" in loser or "--overwrite" in loser, loser
    winner = next(seed for (code, _), seed in zip(results, (0, 1)) if code == 0)
    assert main(["world", "clip", "--seed", str(winner), "--frames", "3", "--out", str(tmp_path / "alone")]) == 0
    names = sorted(p.name for p in (tmp_path / "alone").iterdir())
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == names
    frames = [n for n in names if n.startswith("frame_")]
    assert len(frames) == 3
    assert all((tmp_path / "c" / n).read_bytes() == (tmp_path / "alone" / n).read_bytes() for n in frames)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alone", "c"]  # no lock left behind


WRITERS = {  # every mmpos command that writes a named --out: its arguments (the output is OUT)
    "world clip": ["world", "clip", "--frames", "3", "--out", "OUT"],
    "world render": ["world", "render", "--shape", "square", "--colour", "red", "--box", "1", "1", "9", "9", "--out", "OUT"],
    "world edits": ["world", "edits", "--kind", "style", "--count", "1", "--out", "OUT"],
    "world dataset": ["world", "dataset", "--count", "2", "--out", "OUT"],
    "world sample": ["world", "sample", "--caption", "a large red star at center", "--steps", "1", "--out", "OUT"],
    "viz cameras": ["viz", "cameras", "orbit", "--out", "OUT"],
    "demo": ["demo", "--no-world", "--size", "5", "--out", "OUT"],
}  # fmt: skip


@pytest.mark.parametrize("command", list(WRITERS))
def test_a_second_writer_while_the_first_writes_is_refused_by_name(tmp_path, command):
    """This process plays the first writer (it holds the claim an ``mmpos`` run holds); the real second one is
    refused before any work, one line naming the folder, and writes nothing."""
    out = tmp_path / "out"
    with _atomic.claimed_outputs():
        _atomic.claim_output(out)
        code, err = finished(mmpos(*[str(out) if a == "OUT" else a for a in WRITERS[command]], cwd=tmp_path))
    assert code == 2, err
    assert err.strip().splitlines() == [err.strip()] and "Traceback" not in err
    assert f"--out {out}: another process is writing it now" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, the claim's lock gone with it


def test_an_unnamed_output_skips_a_folder_another_process_holds(tmp_path):
    from mmpos.pipelines.commands._options import fresh_folder

    outputs = tmp_path / "outputs"
    outputs.mkdir()
    with _atomic.output_lock(outputs / "demo"):  # another writer holds outputs/demo (empty so far)
        with _atomic.claimed_outputs():
            assert fresh_folder(outputs / "demo") == outputs / "demo-2"
            assert (outputs / ".demo-2.lock").is_file()  # held by this command until it ends
        assert sorted(p.name for p in outputs.iterdir()) == [".demo.lock"]
    assert sorted(p.name for p in outputs.iterdir()) == []


SCRIPTS = {  # the report writers outside the command tree: arguments, and what the script claims
    "eval_nvs.py": (["--out", "OUT", "report"], "OUT/results.json"),
    "eval_camera_following.py": (["--out", "OUT"], "OUT"),
    "eval_extrapolation.py": (["--out", "OUT"], "OUT"),
}


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_a_second_report_while_the_first_writes_is_refused_by_name(tmp_path, script):
    argv, claimed = SCRIPTS[script]
    out = tmp_path / "out"
    command = [sys.executable, str(ROOT / "scripts" / script), *[str(out) if a == "OUT" else a for a in argv]]
    with _atomic.claimed_outputs():
        _atomic.claim_output(Path(claimed.replace("OUT", str(out))))
        run = subprocess.run(command, capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=300)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and "another process is writing it now" in run.stderr, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
