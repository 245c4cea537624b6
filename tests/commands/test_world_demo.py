"""The world demo and the editing evaluation end to end on tiny trained checkpoints (reduced steps)."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from mmpos.cli import main
from mmpos.pipelines.report import error_map
from mmpos.pipelines.world.demo import run_world_demo
from mmpos.training.task_configs import WorldImageConfig
from mmpos.training.tasks.world_image import train
from tests.models.test_world_models import SIZE, TINY_TEXT, TINY_TRANSFORMER, TINY_VAE


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_world")
    common = dict(
        image_size=SIZE,
        num_examples=16,
        batch_size=4,
        device="cpu",
        num_samples=1,
        sample_steps=1,
        warmup_steps=1,
        max_steps=1,
    )
    train(WorldImageConfig(**common, task="vae", vae=TINY_VAE), root, progress=False)
    for task in ("t2i", "fill", "kontext"):
        config = WorldImageConfig(
            **common, task=task, vae_path=str(root), transformer=TINY_TRANSFORMER, text_encoder=TINY_TEXT
        )
        train(config, root, progress=False)
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
    grids = {f"world_{s}.png" for s in ("t2i", "transplant", "loose", "band", "extrapolation")}
    diagnostics = {"world_transplant_ids.png", "world_loose_maps.png", "world_band_attention.png"}
    assert grids | diagnostics | {"report.html"} == names
    report = (tmp_path / "report.html").read_text()
    assert all(f"src='{n}'" in report for n in names - {"report.html"})
    for method in ("PE transplant", "LooseRoPE", "band modulation", "Above the training size"):
        assert method in report
    from PIL import Image

    from mmpos.pipelines.world.extrapolation_runs import METHODS

    rows = Image.open(tmp_path / "world_extrapolation.png").height // (3 * SIZE * 3 + 2)  # 3x tiles, zoom 3
    assert rows == 1 + len(METHODS)  # ground truth, then a row per method
    assert report.count("<table>") == 3  # a score table under each editing section, on the shown examples
    for row in (
        "<td>PE transplant</td>",
        "<td>LooseRoPE</td>",
        "<td>band strength 0.0</td>",
        "<td>no sharing</td>",
        "<th>outside_change</th>",
        "<th>identity_iou</th>",
        "<th>layout_copy</th>",
    ):
        assert row in report, row


def test_the_transplant_box_is_outlined_on_its_edge_pixels():
    from mmpos.pipelines.report import with_box

    image = np.zeros((8, 8, 3), dtype=np.uint8)
    boxed = with_box(image, (2, 1, 6, 5))  # left, top, right, bottom (exclusive)
    red = (boxed == (255, 0, 0)).all(-1)
    assert red[1, 2:6].all() and red[4, 2:6].all() and red[1:5, 2].all() and red[1:5, 5].all()
    assert red.sum() == 12 and not image.any()  # the outline only, on a copy


def test_demo_cli_with_missing_checkpoint_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--out", str(tmp_path), "--size", "5", "--checkpoint", str(tmp_path / "none")])
    assert exit_info.value.code == 2 and "mmpos demo: error: no VAE checkpoint at" in capsys.readouterr().err


def test_eval_editing_script_scores_ground_truth_perfectly(tiny_world, tmp_path):
    path = Path(__file__).resolve().parents[2] / "scripts" / "eval_editing.py"
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
    # outside the repainted box, the raw canvas outputs are scored (the composite is exact there by construction)
    assert all(0.0 < row["outside_change"] <= 1.0 for row in results["transplant"][1:])


@pytest.fixture(scope="module")
def pretrained_folders(tmp_path_factory):
    """FLUX-style saved pipelines (tiny, with CLIP/T5 text encoders and tokenizers) for t2i, fill and kontext."""
    from diffusers import FluxFillPipeline, FluxKontextPipeline, FluxPipeline

    from tests.fixtures.tiny_models import components, tiny_text_components

    root = tmp_path_factory.mktemp("pretrained")
    for task, kind, cls in (
        ("t2i", "flux", FluxPipeline),
        ("fill", "fill", FluxFillPipeline),
        ("kontext", "kontext", FluxKontextPipeline),
    ):
        cls(**{**components(kind), **tiny_text_components()}).save_pretrained(root / task)
    return root


def test_world_demo_runs_pretrained_pipelines_on_prompt_strings(pretrained_folders, tmp_path):
    from mmpos.pipelines.world.sources import ModelSource, parse_model_args

    models = parse_model_args([f"{t}={pretrained_folders / t}" for t in ("t2i", "fill", "kontext")])
    source = ModelSource(models=models, image_size=64)
    written = run_world_demo(tmp_path, steps=2, count=1, source=source)
    assert {p.name for p in written} >= {"world_transplant.png", "world_loose.png", "world_band.png", "report.html"}
    assert "world_extrapolation.png" not in {p.name for p in written}  # pretrained t2i: 3x is not run
    report = (tmp_path / "report.html").read_text()
    assert str(pretrained_folders / "fill") in report and "trained on mmpos.world" not in report


def test_model_arguments_and_errors(capsys):
    from mmpos.pipelines.world.sources import HUB_FLUX, parse_model_args

    assert parse_model_args(["flux"]) == HUB_FLUX
    assert parse_model_args(["flux", "fill=my/fill"]) == {**HUB_FLUX, "fill": "my/fill"}
    with pytest.raises(ValueError, match="--model task='video'"):
        parse_model_args(["video=x"])
    with pytest.raises(ValueError, match="expected TASK=PATH_OR_HUB_ID"):
        parse_model_args(["t2i"])
    for args, message in (
        (["--model", "fill"], "expected TASK=PATH_OR_HUB_ID"),
        (["--model", "flux", "--image-size", "500"], "--image-size 500: expected a multiple of 16 pixels"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["demo", "--out", "unused", "--size", "5", *args])
        assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_conditioning_follows_the_model():
    from diffusers import FluxTransformer2DModel

    from mmpos.models.world.image import WorldTextEncoder, conditioning
    from tests.fixtures.tiny_models import components, tiny_text_components
    from tests.pipelines.test_world_editing import tiny_edit_pipeline

    world_t2i, world_fill = tiny_edit_pipeline("band"), tiny_edit_pipeline("transplant")
    kwargs = conditioning(world_t2i, ["a red star"], 3.0)
    assert kwargs["true_cfg_scale"] == 3.0 and kwargs["negative_prompt_embeds"].shape[0] == 1
    assert isinstance(world_t2i.text_encoder, WorldTextEncoder)
    assert set(conditioning(world_fill, ["a red star"], 3.0)) == {"prompt_embeds", "pooled_prompt_embeds"}
    from diffusers import FluxPipeline

    parts = {**components("flux"), **tiny_text_components()}
    config = dict(parts["transformer"].config)
    parts["transformer"] = FluxTransformer2DModel.from_config(config, guidance_embeds=True)
    distilled = FluxPipeline(**parts)
    assert conditioning(distilled, ["a red star"], 3.5) == {"prompt": ["a red star"], "guidance_scale": 3.5}
    assert conditioning(distilled, ["a red star"]) == {"prompt": ["a red star"]}
    with pytest.raises(ValueError, match="no text encoders"):
        conditioning(FluxPipeline(**components("flux")), ["a red star"])
