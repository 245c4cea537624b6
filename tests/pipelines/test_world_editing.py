"""The mmpos editing pipelines on world models (tiny random configs): canvases match the transplant pipeline's,
boxes agree across conventions, and a disabled edit is the stock diffusers pipeline, pixel for pixel."""

import numpy as np
import pytest
import torch

from mmpos.models.world.image import build_pipeline, build_text_encoder, build_transformer, build_vae
from mmpos.models.world.samples import generate
from mmpos.pipelines.edits.band.demo import run_band
from mmpos.pipelines.edits.loose.demo import loose_for_steps, run_loose
from mmpos.pipelines.edits.transplant.canvas import TransplantConfig
from mmpos.pipelines.edits.transplant.demo import run_transplant
from mmpos.pipelines.edits.transplant.pipeline_fill import box_to_mask
from mmpos.pipelines.loading import pipeline_class
from mmpos.pipelines.world.sources import ModelSource
from mmpos.pipelines.world.sources import load_world_edit as load_edit_pipeline
from mmpos.world.canvas import WORLD_TRANSPLANT, fill_canvas_example, insertion_canvas, scene_part
from mmpos.world.edit_pairs import harmonise_pair, style_set, transplant_pair
from tests.models.test_world_models import SIZE, TINY_TEXT, TINY_TRANSFORMER, TINY_VAE

TASK_OF = {"transplant": "fill", "loose": "kontext", "band": "t2i"}


def tiny_edit_pipeline(method, seed=0):
    torch.manual_seed(seed)
    task = TASK_OF[method]
    transformer = build_transformer(task, **TINY_TRANSFORMER)
    pipe = build_pipeline(
        task,
        build_vae(**TINY_VAE),
        transformer,
        build_text_encoder(transformer, **TINY_TEXT),
        pipeline_class=pipeline_class(method),
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def stock(pipe, task):
    plain = build_pipeline(task, pipe.vae, pipe.transformer, pipe.text_encoder)
    plain.set_progress_bar_config(disable=True)
    return plain


def as_uint8(image: torch.Tensor) -> np.ndarray:
    return (image[0].permute(1, 2, 0) * 255).round().byte().numpy()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_insertion_canvas_is_the_transplant_pipelines_canvas(seed):
    pair = transplant_pair(seed, SIZE)
    pipe = tiny_edit_pipeline("transplant")
    canvas = pipe.prepare_canvas(
        TransplantConfig(**WORLD_TRANSPLANT),
        pair.background.image,
        None,
        [pair.reference.image],
        [pair.reference.masks[0]],
        pair.box,
    )
    example = insertion_canvas(pair)
    assert np.array_equal(example.mask, canvas.inpaint_mask.numpy())
    unchanged = ~example.mask
    assert np.array_equal(example.image[unchanged], as_uint8(canvas.image)[unchanged])
    assert np.array_equal(scene_part(example.image), pair.target.image)
    assert (scene_part(example.mask) | ~pair.mask).all() and not example.mask[:, :SIZE].any()


def pipeline_insertion_canvas(pair):
    """The insertion canvas as the world built it before it stopped importing the pipelines: the transplant
    pipeline's own ``compose_canvas``, with the target scene in place of the background."""
    from mmpos.pipelines.edits.transplant.canvas import compose_canvas
    from mmpos.world.canvas import TOKEN_PIXELS
    from mmpos.world.images import to_chw, to_uint8

    size = pair.background.image.shape[:2]
    canvas = compose_canvas(
        TransplantConfig(**WORLD_TRANSPLANT),
        to_chw(pair.background.image)[None],
        box_to_mask(pair.box, size),
        [to_chw(pair.reference.image)[None]],
        [torch.from_numpy(pair.reference.masks[0])],
        TOKEN_PIXELS,
    )
    rows, cols = canvas.layout.background.slices
    image = canvas.image.clone()
    image[..., rows, cols] = to_chw(pair.target.image)
    return to_uint8(image)[0], canvas.inpaint_mask.numpy()


@pytest.mark.parametrize("size", [SIZE, 64])
def test_the_worlds_insertion_canvas_is_the_pipelines_compose_canvas_bit_for_bit(size):
    from mmpos.world.canvas import FILL_VALUE, MASK_DILATE_TOKENS

    assert (FILL_VALUE, MASK_DILATE_TOKENS) == (TransplantConfig().fill_value, TransplantConfig().mask_dilate_tokens)
    for seed in range(24):
        pair = transplant_pair(seed, size)
        image, mask = pipeline_insertion_canvas(pair)
        example = insertion_canvas(pair)
        assert np.array_equal(example.image, image) and np.array_equal(example.mask, mask), seed


def test_fill_canvas_examples_mix_insertion_and_plain_inpainting():
    examples = [fill_canvas_example(seed, SIZE) for seed in range(12)]
    assert {e.inserted for e in examples} == {True, False}
    for e in examples:
        assert e.image.shape == (SIZE, 2 * SIZE, 3) and e.mask[:, SIZE:].any() and not e.mask[:, :SIZE].any()
        tile_is_plain = bool((e.image[:, :SIZE] == 128).all())
        assert tile_is_plain != e.inserted


@pytest.mark.parametrize("seed", range(5))
def test_world_and_pipeline_boxes_agree(seed):
    pair = transplant_pair(seed, SIZE)  # box (x0, y0, x1, y1): the inserted object lies inside it
    region = box_to_mask(pair.box, (SIZE, SIZE)).numpy()
    assert pair.mask.any() and (region | ~pair.mask).all()
    x0, y0, x1, y1 = pair.box
    assert region.sum() == (x1 - x0) * (y1 - y0)


def test_box_outside_the_image_names_the_order():
    with pytest.raises(ValueError, match=r"target_box=\(0, 0, 40, 8\) \(left, top, right, bottom\)"):
        box_to_mask((0, 0, 40, 8), (32, 32))
    with pytest.raises(ValueError, match="expected 4 numbers"):
        box_to_mask((0, 0, 8), (32, 32))


def test_transplant_changes_nothing_outside_the_repainted_region():
    pairs = [transplant_pair(seed, SIZE) for seed in (3, 4)]
    run = run_transplant(tiny_edit_pipeline("transplant"), pairs, steps=2)  # default: the world's canvas layout
    assert run.outputs.shape == run.raw.shape == (2, SIZE, SIZE, 3)
    assert run.last.ids.shape == (SIZE // 4 * SIZE // 2, 3)  # 4-pixel tokens on the S x 2S canvas
    for output, raw, pair in zip(run.outputs, run.raw, pairs):
        outside = ~scene_part(insertion_canvas(pair).mask)
        assert np.array_equal(output[outside], pair.background.image[outside])
        assert np.array_equal(output[~outside], raw[~outside])  # inside: the model's own pixels


def test_loose_at_strength_zero_is_stock_kontext():
    pair = harmonise_pair(7, SIZE)
    pipe = tiny_edit_pipeline("loose")
    loose = run_loose(pipe, [pair], steps=3, loose=loose_for_steps(3, strength=0.0), guidance=3.0)
    plain = generate(
        stock(pipe, "kontext"),
        "kontext",
        [{"image": pair.target.image, "context": pair.collage, "caption": pair.instruction}],
        steps=3,
    )
    assert np.array_equal(loose.outputs, plain)
    edited = run_loose(pipe, [pair], steps=3, loose=loose_for_steps(3), guidance=3.0)
    assert not np.array_equal(edited.outputs, plain) and (edited.last.maps.bins >= 0).any()


def test_band_disabled_is_stock_flux_and_enabled_differs():
    sets = [style_set(5, 2, SIZE)]
    pipe = tiny_edit_pipeline("band")
    disabled = run_band(pipe, sets, steps=2, band={"enabled": False}, guidance=3.0)
    captions = [sets[0].reference.spec.caption()] + sets[0].prompts
    plain = generate(
        stock(pipe, "t2i"), "t2i", [{"image": sets[0].reference.image, "caption": c} for c in captions], steps=2
    )
    assert np.array_equal(disabled.outputs, plain[1:])
    shared = run_band(pipe, sets, steps=2, band={"strength": 1.0}, guidance=3.0)
    assert shared.outputs.shape == disabled.outputs.shape and not np.array_equal(shared.outputs, disabled.outputs)


def test_loose_schedule_is_rescaled_to_the_step_count():
    from mmpos.pipelines import LooseConfig

    defaults = LooseConfig()
    assert loose_for_steps(28)["cutoffs"] == defaults.cutoffs and loose_for_steps(28)["step_range"] == (0, 22)
    assert loose_for_steps(14) == {"cutoffs": (5, 9), "step_range": (0, 11)}
    assert loose_for_steps(14, strength=0.5)["strength"] == 0.5


def test_model_source_loads_each_model_once(tmp_path, monkeypatch):
    import mmpos.pipelines.world.sources as sources

    pipe = tiny_edit_pipeline("band")
    loads = []

    def fake_load(task, root, device, dtype, pipeline_class=None):
        loads.append(task)
        return pipeline_class(**pipe.components)

    monkeypatch.setattr(sources, "load_world_pipeline", fake_load)
    source = ModelSource(tmp_path)
    generate_pipe, band_pipe = source.pipeline("generate"), source.pipeline("band")
    assert loads == ["t2i"] and type(band_pipe).__name__ == "BandModulationFluxPipeline"
    assert band_pipe.transformer is generate_pipe.transformer and band_pipe.vae is generate_pipe.vae


def test_edit_pipeline_errors(tmp_path):
    with pytest.raises(ValueError, match="method='paint'"):
        ModelSource(tmp_path).pipeline("paint")
    with pytest.raises(TypeError, match="expected a subclass of FluxFillPipeline"):
        build_pipeline("fill", None, None, None, pipeline_class=pipeline_class("loose"))
    with pytest.raises(FileNotFoundError, match="no VAE checkpoint"):
        load_edit_pipeline("band", tmp_path)
