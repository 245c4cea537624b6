"""A resumed ViT run's ``seconds`` in log.csv go on from the checkpoint's row, not from 0 (issue 46 item 8)."""

import csv

from mmpos.training.tasks.vit import CsvLog


def test_seconds_continue_from_the_last_row_kept_on_resume(tmp_path):
    path = tmp_path / "log.csv"
    log = CsvLog(path, True)
    assert log.seconds_before == 0.0
    for step, seconds in ((1, "10.0"), (2, "20.5"), (3, "31.0"), (4, "42.0")):
        log.write({"step": step, "seconds": seconds})
    resumed = CsvLog(path, True, resumed_step=2)  # rows past the checkpoint are dropped, and so is their time
    assert resumed.seconds_before == 20.5
    with open(path, newline="") as f:
        assert [row["step"] for row in csv.DictReader(f)] == ["1", "2"]
