"""The world demo and the editing evaluation end to end on tiny trained checkpoints (reduced steps)."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from mmpos.cli import main
from mmpos.world.demo import error_map, run_world_demo
from mmpos.world.training import train
from test_world_models import SIZE, TINY_TEXT, TINY_TRANSFORMER, TINY_VAE


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_world")
    common = dict(image_size=SIZE, num_examples=16, batch_size=4, device="cpu", num_samples=1, sample_steps=1,
                  warmup_steps=1, max_steps=1)
    train(dict(common, task="vae", vae=TINY_VAE), root, progress=False)
    for task in ("t2i", "fill", "kontext"):
        train(dict(common, task=task, vae_path=str(root), transformer=TINY_TRANSFORMER, text_encoder=TINY_TEXT),
              root, progress=False)
    return root


def test_error_map_is_black_where_exact():
    a = np.zeros((1, 4, 4, 3), dtype=np.uint8)
    b = a.copy()
    b[0, 1, 2] = 200
    heat = error_map(a, b)
    assert heat[0, 1, 2, 0] == 255 and heat[0].sum() == heat[0, 1, 2].sum()


def test_world_demo_end_to_end(tiny_world, tmp_path):
    written = run_world_demo(tmp_path, tiny_world, steps=2, count=2)
    names = {p.name for p in written}
    grids = {f"world_{s}.png" for s in ("t2i", "transplant", "loose", "band")}
    diagnostics = {"world_transplant_ids.png", "world_loose_maps.png", "world_band_attention.png"}
    assert grids | diagnostics | {"report.html"} == names
    report = (tmp_path / "report.html").read_text()
    assert all(f"src='{n}'" in report for n in names - {"report.html"})
    for method in ("PE transplant", "LooseRoPE", "band modulation"):
        assert method in report


def test_demo_cli_with_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no VAE checkpoint at"):
        main(["demo", "--out", str(tmp_path), "--size", "5", "--checkpoint", str(tmp_path / "none")])


def test_eval_editing_script_scores_ground_truth_perfectly(tiny_world, tmp_path):
    path = Path(__file__).resolve().parents[1] / "scripts" / "eval_editing.py"
    spec = importlib.util.spec_from_file_location("eval_editing", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "eval.json"
    assert module.main(["--checkpoint", str(tiny_world), "--count", "1", "--steps", "1", "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    truth = {task: rows[0] for task, rows in results.items()}
    assert truth["transplant"]["mask_iou"] == 1.0 and truth["transplant"]["outside_change"] == 0.0
    assert truth["harmonise"]["identity_iou"] == 1.0 and truth["harmonise"]["margin_error"] == 0.0
    assert truth["style"]["layout_copy"] < 1.0 == results["style"][1]["layout_copy"]
    methods = {task: [row["method"] for row in rows] for task, rows in results.items()}
    assert "PE transplant tau=0.85" in methods["transplant"] and "LooseRoPE strength 1.0" in methods["harmonise"]
    assert "band s_hf=0" in methods["style"]
    # a disabled edit leaves the plain baseline: unedited pixels outside the repainted box stay exact
    assert all(row["outside_change"] == 0.0 for row in results["transplant"])
