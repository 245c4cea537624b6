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


def rows(classes: int) -> dict:
    return {
        "run": [
            dict(
                size=s,
                height=s,
                width=s,
                scale=s / 32,
                aspect=1.0,
                extrapolation="none",
                top1=a,
                top5=None,
                classes=classes,
            )
            for s, a in ((32, 80.0), (64, 40.0))
        ]
    }


def test_results_plot_has_fixed_axes_and_a_chance_line(tmp_path, monkeypatch):
    import mmpos.viz.figure_files as figure_files
    from mmpos.training.vit_eval import plot_results

    figures = []
    monkeypatch.setattr(figure_files, "save_figure", lambda fig, path, dpi=None: figures.append(fig) or path)
    plot_results(rows(4), tmp_path / "results.png")
    ax = figures[0].axes[0]
    assert ax.get_ylim() == (0.0, 100.0)
    chance = [line for line in ax.get_lines() if line.get_label() == "chance (1/4)"]
    assert len(chance) == 1 and set(chance[0].get_ydata()) == {25.0}


def test_top5_is_not_computed_nor_printed_for_five_classes_or_fewer(capsys):
    import torch
    from accelerate import Accelerator

    from mmpos.training.tasks.vit import print_table
    from mmpos.training.vit_eval import evaluate

    images, targets = torch.randn(6, 3, 4, 4), torch.tensor([0, 1, 2, 3, 0, 1])
    for classes, top5 in ((4, None), (8, 100.0)):
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, classes))
        with torch.no_grad():
            model[1].weight.zero_()
            model[1].bias.copy_(-torch.arange(float(classes)))  # ranks class 0, 1, 2, ... first: top-5 holds 0..4
        result = evaluate(model, [(images, targets)], Accelerator(cpu=True))
        assert result["classes"] == classes and result["top5"] == top5
    print_table(rows(4)["run"])
    print_table(rows(8)["run"])
    printed = capsys.readouterr().out.splitlines()
    assert "top-5" not in printed[0] and "top-5 n/a" in printed[2]
