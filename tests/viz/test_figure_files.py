"""Figures are written under a temporary name and renamed into place."""

import pytest

from mmpos.viz.figure_files import pyplot, save_figure


def test_save_figure_writes_a_png_and_leaves_nothing_else(tmp_path):
    fig = pyplot().figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    path = save_figure(fig, tmp_path / "new" / "plot.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["plot.png"]


def test_a_failed_save_keeps_the_previous_file(tmp_path):
    path = tmp_path / "plot.nosuchformat"
    path.write_text("previous")
    with pytest.raises(ValueError):
        save_figure(pyplot().figure(), path)
    assert path.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["plot.nosuchformat"]


def test_written_atomically_renames_on_success_and_cleans_up_on_error(tmp_path):
    from mmpos._atomic import written_atomically

    path = tmp_path / "sub" / "config.yaml"
    with written_atomically(path) as temporary:
        temporary.write_text("a: 1\n")
        assert not path.exists()  # nothing under the final name while writing
    assert path.read_text() == "a: 1\n"
    with pytest.raises(RuntimeError):
        with written_atomically(path) as temporary:
            temporary.write_text("half")
            raise RuntimeError("crash")
    assert path.read_text() == "a: 1\n" and [p.name for p in path.parent.iterdir()] == ["config.yaml"]
