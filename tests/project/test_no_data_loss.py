"""No command replaces what it was not told to (one line naming --out and --overwrite, exit 2; the user's file
unchanged), and two writers of one new output folder never leave a half or mixed folder: one wins whole, the
other gets a named error (issue 35, "Data loss")."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmpos import _atomic
from mmpos.cli import main

ROOT = Path(__file__).resolve().parents[2]
USERS = b"the user's own file, not an mmpos output"


def users_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(USERS)
    return path


def refused(argv, capsys) -> str:
    """The one-line error of ``mmpos ARGV`` (exit 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err.splitlines()[-1]


def assert_names_out_and_overwrite(line: str, path: Path) -> None:
    assert "--out" in line and "--overwrite" in line and str(path) in line, line


# ------------------------------------------------------------------------------------ refused, file unchanged


def test_world_sample_keeps_the_users_image(tmp_path, capsys):
    mine = users_file(tmp_path / "image_0.png")
    line = refused(
        ["world", "sample", "--caption", "a large red star at center", "--steps", "1", "--out", str(tmp_path)], capsys
    )
    assert_names_out_and_overwrite(line, mine)
    assert mine.read_bytes() == USERS and sorted(p.name for p in tmp_path.iterdir()) == ["image_0.png"]


def test_demo_keeps_the_users_figure(tmp_path, capsys):
    mine = users_file(tmp_path / "rope_axial.png")
    line = refused(["demo", "--no-world", "--size", "5", "--out", str(tmp_path)], capsys)
    assert_names_out_and_overwrite(line, tmp_path)
    assert mine.read_bytes() == USERS and [p.name for p in tmp_path.iterdir()] == ["rope_axial.png"]


def test_viz_cameras_keeps_the_users_figure_and_replaces_it_when_told(tmp_path, capsys):
    from mmpos.camera import preset_trajectory, save_trajectory

    trajectory = save_trajectory(preset_trajectory("orbit", 4), tmp_path / "good.json")
    mine = users_file(tmp_path / "out" / "good_rig.png")
    argv = [
        "viz",
        "cameras",
        str(trajectory),
        "--image-size",
        "18",
        "32",
        "--grid",
        "3",
        "4",
        "--out",
        str(tmp_path / "out"),
    ]
    line = refused(argv, capsys)
    assert_names_out_and_overwrite(line, mine)
    assert mine.read_bytes() == USERS and [p.name for p in mine.parent.iterdir()] == ["good_rig.png"]
    assert main([*argv, "--overwrite"]) == 0
    assert mine.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (mine.parent / "good_rays.png").is_file()


def eval_nvs(out: Path, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "eval_nvs.py"), "--out", str(out), *command],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_eval_nvs_report_keeps_the_users_results_and_replaces_them_when_told(tmp_path):
    out = tmp_path / "nvs"
    made = eval_nvs(out, "data", "--train-scenes", "1", "--test-scenes", "1")
    assert made.returncode == 0, made.stderr[-2000:]
    mine = users_file(out / "results.json")
    done = eval_nvs(out, "report")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert_names_out_and_overwrite(done.stderr.strip().splitlines()[-1], mine)
    assert mine.read_bytes() == USERS
    mine.rename(tmp_path / "moved.json")
    figure = users_file(tmp_path / "figure.png")  # --figure is the user's too
    done = eval_nvs(out, "report", "--figure", str(figure))
    assert done.returncode == 2 and "--figure" in done.stderr and figure.read_bytes() == USERS
    assert not mine.exists()  # refused before the work
    users_file(mine)
    done = eval_nvs(out, "report", "--overwrite")
    assert done.returncode == 0, done.stderr[-2000:]
    assert isinstance(json.loads(mine.read_text()), list)
    assert not [p.name for p in out.iterdir() if ".partial" in p.name]


def test_a_file_writer_not_told_to_replace_keeps_a_file_that_appeared_meanwhile(tmp_path):
    path = tmp_path / "image_0.png"
    with pytest.raises(_atomic.OutputTakenError, match="--overwrite"):
        with _atomic.written_atomically(path, replace=False) as temporary:
            temporary.write_bytes(b"ours")
            users_file(path)  # another process's file, written while this one worked
    assert path.read_bytes() == USERS and [p.name for p in tmp_path.iterdir()] == ["image_0.png"]


def test_two_file_writers_of_one_name_use_two_temporary_names(tmp_path):
    path = tmp_path / "state.pt"
    with _atomic.written_atomically(path) as first, _atomic.written_atomically(path) as second:
        assert first != second and first.suffix == second.suffix == ".pt"
        first.write_text("first")
        second.write_text("second")
    assert path.read_text() == "first" and [p.name for p in tmp_path.iterdir()] == ["state.pt"]


# ------------------------------------------------------------------------- two writers of one new folder


def test_a_second_writer_of_an_output_folder_gets_a_named_error_and_the_first_wins_whole(tmp_path):
    out = tmp_path / "new"
    with _atomic.output_folder_written(out, overwrite=False) as folder:
        (folder / "part").write_text("first")
        for overwrite in (False, True):
            with pytest.raises(_atomic.ConcurrentWriteError, match="another process is writing it"):
                with _atomic.output_folder_written(out, overwrite) as second:
                    (second / "part").write_text("second")
        (folder / "rest").write_text("first")
    assert {p.name: p.read_text() for p in out.iterdir()} == {"part": "first", "rest": "first"}
    assert [p.name for p in tmp_path.iterdir()] == ["new"]  # no lock, no partial folder left
    with pytest.raises(_atomic.OutputTakenError, match="--overwrite"):  # finished: a later writer is refused
        with _atomic.output_folder_written(out, overwrite=False):
            pass


def test_world_dataset_second_writer_during_the_first_gets_a_named_error(tmp_path, monkeypatch, capsys):
    from mmpos.world import data

    out, real = tmp_path / "data", data._write_examples
    errors = []

    def examples_with_a_second_writer(*args, **kwargs):
        written = real(*args, **kwargs)
        if not errors:  # only the first writer starts a second one
            errors.append("started")
            errors[0] = refused(["world", "dataset", "--count", "2", "--seed", "9", "--out", str(out)], capsys)
        return written

    monkeypatch.setattr(data, "_write_examples", examples_with_a_second_writer)
    assert main(["world", "dataset", "--count", "3", "--out", str(out)]) == 0
    assert len(errors) == 1 and "another process is writing it" in errors[0] and str(out) in errors[0]
    lines = (out / "metadata.jsonl").read_text().splitlines()
    assert len(lines) == 3 and len(list(out.glob("*/*.png"))) == 3
    assert all((out / json.loads(line)["file_name"]).is_file() for line in lines)


def test_two_world_dataset_processes_into_one_new_folder(tmp_path):
    out = tmp_path / "data"
    command = [
        sys.executable,
        "-m",
        "mmpos.cli",
        "world",
        "dataset",
        "--count",
        "40",
        "--size",
        "32",
        "--out",
        str(out),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    runs = [
        subprocess.Popen(
            [*command, "--seed", str(seed)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for seed in (0, 1)
    ]
    results = [(run.wait(timeout=300), run.stderr.read()) for run in runs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert "Traceback" not in loser
    assert "another process is writing it" in loser or "--overwrite" in loser, loser  # during, or after the first
    winner = [seed for (code, _), seed in zip(results, (0, 1)) if code == 0][0]
    from mmpos.world.data import write_image_folder

    reference = tmp_path / "reference"
    write_image_folder(reference, 40, winner, image_size=32)  # the winner's dataset, written alone
    assert (out / "metadata.jsonl").read_text() == (reference / "metadata.jsonl").read_text()
    pngs = sorted(p.relative_to(out) for p in out.glob("*/*.png"))
    assert len(pngs) == 40 and pngs == sorted(p.relative_to(reference) for p in reference.glob("*/*.png"))
    assert all((out / p).read_bytes() == (reference / p).read_bytes() for p in pngs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "reference"]  # no lock, no partial folder
