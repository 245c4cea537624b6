"""``keep_pipelines_loaded`` (what ``mmpos app`` runs its jobs under): a re-run with another strength loads no model
and writes the same files as a fresh process would; a pipeline a run left changed is loaded again."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from mmpos.pipelines import kept_pipelines, loading
from mmpos.pipelines.commands import main

pytestmark = pytest.mark.usefixtures("one_thread")
FAST = [
    "--set",
    "sampler.num_inference_steps=2",
    "--set",
    "figure.sweep=[0.0]",
    "--target",
    "a large blue square at center",
]


@pytest.fixture
def loads(monkeypatch) -> list:
    """One entry per pipeline actually loaded from its folder."""
    counted: list = []
    real = kept_pipelines.kept_pipeline

    def counting(cls, path, dtype, device, load):
        return real(cls, path, dtype, device, lambda: counted.append(path) or load())

    monkeypatch.setattr(loading, "kept_pipeline", counting)
    return counted


def _band(out, strength) -> np.ndarray:
    assert (
        main(["edit", "band", "--model", "world", *FAST, "--set", f"band.strength={strength}", "--out", str(out)]) == 0
    )
    return np.asarray(Image.open(out / "edited_0.png"))


def test_a_slider_rerun_loads_no_model_and_writes_what_a_fresh_run_writes(tmp_path, loads):
    fresh = {s: _band(tmp_path / f"fresh-{s}", s) for s in (0.5, 1.0)}
    assert len(loads) == 2  # not keeping: every command loads its pipeline
    store: dict = {}
    with kept_pipelines.keep_pipelines_loaded(store):
        kept = [(s, _band(tmp_path / f"kept-{i}", s)) for i, s in enumerate((0.5, 1.0, 0.5))]
    assert len(loads) == 3  # keeping: the first run loads, the re-runs reuse it
    for strength, image in kept:
        assert np.array_equal(image, fresh[strength]), strength
    assert np.abs(fresh[1.0].astype(float) - fresh[0.5]).mean() > 0.5  # the strength does change the edit


def test_a_pipeline_left_changed_is_loaded_again(tmp_path, loads):
    from mmpos.integrations.diffusers import set_pe

    store: dict = {}
    with kept_pipelines.keep_pipelines_loaded(store):
        first = _band(tmp_path / "first", 1.0)
        ((pipe, _),) = store.values()
        set_pe(pipe.transformer, "rope_axial")  # what an interrupted run could leave behind
        again = _band(tmp_path / "again", 1.0)
    assert len(loads) == 2 and np.array_equal(first, again)
