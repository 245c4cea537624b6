"""PE transplant (PosBridge): layouts, id maps, sigma window, Fill bit-identity, compositing, input errors."""

import pytest
import torch
from diffusers import FluxFillPipeline, FluxPipeline
from diffusers.models.transformers.transformer_flux import FluxPosEmbed

from mmpos.coords import flux_ids
from mmpos.coords.canvas import corner_centered_layout, side_by_side_layout
from mmpos.coords.edits import transplant_ids
from mmpos.pipelines import PosBridgeFillPipeline
from tests.fixtures.tiny_models import components, embeddings, image


def test_native_ids_match_diffusers():
    expected = FluxPipeline._prepare_latent_image_ids(1, 3, 5, "cpu", torch.float32)
    assert torch.equal(flux_ids(3, 5), expected)


def test_layouts_sit_on_the_token_grid_without_overlap():
    for layout in (corner_centered_layout(64, 96, 4, 0.4), side_by_side_layout(64, 96, 2)):
        canvas = torch.zeros(layout.canvas_size, dtype=torch.int64)
        for box in [layout.background, *layout.tiles]:
            assert all(v % 16 == 0 for v in (box.top, box.left, box.height, box.width))
            rows, cols = box.slices
            assert rows.stop <= layout.canvas_size[0] and cols.stop <= layout.canvas_size[1]
            canvas[rows, cols] += 1
        assert canvas.max() == 1
        assert all(v % 16 == 0 for v in layout.canvas_size)
    ccl = corner_centered_layout(64, 96, 1, 0.4)
    assert ccl.canvas_size == (64 + 2 * 32, 96 + 2 * 32) and ccl.background.top == ccl.background.left == 32
    with pytest.raises(ValueError, match="1 to 4"):
        corner_centered_layout(64, 64, 5)


def test_transplant_ids_send_object_tokens_onto_the_target_box():
    grid = (6, 8)
    source = torch.zeros(grid, dtype=torch.bool)
    source[0:2, 0:3] = True
    source[0, 0] = False  # an object mask, not a full box
    target = torch.zeros(grid, dtype=torch.bool)
    target[3:5, 4:7] = True
    ids = transplant_ids(grid, source, target)
    native = flux_ids(*grid)
    moved = source.flatten()
    assert torch.equal(ids[~moved], native[~moved])
    # equal box sizes: integer ids, the token at (r, c) of the source box lands on (r + 3, c + 4)
    assert torch.equal(ids[moved, 1:], native[moved, 1:] + torch.tensor([3.0, 4.0]))
    # so the transplanted RoPE rows are exactly the target tokens' rows
    pos_embed = FluxPosEmbed(10000, [4, 4, 8])
    cos, sin = pos_embed(ids)
    cos_native, _ = pos_embed(native)
    target_rows = (native[moved, 1] + 3).long() * grid[1] + (native[moved, 2] + 4).long()
    assert torch.equal(cos[moved], cos_native[target_rows])
    swapped = transplant_ids(grid, source, target, swap=True)
    assert torch.equal(swapped[target.flatten(), 1:], native[target.flatten(), 1:] - torch.tensor([3.0, 4.0]))


def test_fractional_positions_for_a_scale_change():
    grid = (8, 8)
    source = torch.zeros(grid, dtype=torch.bool)
    source[0:4, 0:4] = True
    target = torch.zeros(grid, dtype=torch.bool)
    target[5:7, 5:7] = True
    moved = transplant_ids(grid, source, target)[source.flatten()]
    # the 4x4 box is shrunk by 2 onto the 2x2 box: token centres span exactly the target box
    assert moved[:, 1].min() == 5 - 0.25 and moved[:, 1].max() == 6 + 0.25
    assert torch.equal(torch.unique(moved[:, 2]), torch.tensor([4.75, 5.25, 5.75, 6.25]))
    last_row = torch.zeros(grid, dtype=torch.bool)
    last_row[7] = True
    stretched = transplant_ids(grid, source, last_row, fit="stretch")[source.flatten()]
    assert torch.allclose(torch.unique(stretched[:, 1]), torch.tensor([7 - 3 / 8, 7 - 1 / 8, 7 + 1 / 8, 7 + 3 / 8]))
    assert transplant_ids(grid, source, target, round_positions=True).frac().abs().max() == 0


@pytest.fixture(scope="module")
def fill_pipes():
    c = components("fill")
    return FluxFillPipeline(**c), PosBridgeFillPipeline(**c)


BACKGROUND = dict(image=image(32, 48), references=[image(40, 24, seed=3)], target_box=(16, 0, 48, 32))
TRANSPLANT = dict(tile_fraction=0.5, mask_dilate_tokens=0)


def _edit(pipe, **kwargs):
    args = {**BACKGROUND, **kwargs}
    return pipe(
        num_inference_steps=3, generator=torch.Generator().manual_seed(0), output_type="pt", **args, **embeddings(1)
    )


def test_disabled_transplant_is_bit_identical_to_stock_fill(fill_pipes):
    stock, posbridge = fill_pipes
    out = _edit(posbridge, transplant={**TRANSPLANT, "enabled": False})
    canvas = out.canvas
    assert canvas.image.shape[-2:] == (64, 80)
    expected = stock(
        image=canvas.image,
        mask_image=canvas.inpaint_mask[None, None].float(),
        height=64,
        width=80,
        num_inference_steps=3,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
        **embeddings(1),
    ).images
    assert torch.equal(out.canvas_images, expected)
    same = _edit(posbridge, transplant={**TRANSPLANT, "tau": 1.01})  # empty window
    assert torch.equal(same.canvas_images, expected)
    edited = _edit(posbridge, transplant=TRANSPLANT)
    assert not torch.allclose(edited.canvas_images, expected)


def test_ids_are_transplanted_above_tau_and_native_below(fill_pipes):
    _, posbridge = fill_pipes
    seen = []
    hook = posbridge.transformer.pos_embed.register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))
    sigmas = []
    hook2 = posbridge.transformer.register_forward_pre_hook(
        lambda m, a, kw: sigmas.append(float(kw["timestep"][0])), with_kwargs=True
    )
    try:
        out = _edit(posbridge, transplant={**TRANSPLANT, "tau": 0.6})
    finally:
        hook.remove(), hook2.remove()
    text_len = embeddings(1)["prompt_embeds"].shape[1]
    assert len(seen) == 3 and sigmas[0] > 0.6 > sigmas[-1]
    for sigma, ids in zip(sigmas, seen):
        expected = out.ids if sigma >= 0.6 else out.native_ids
        assert torch.equal(ids[text_len:], expected)
    assert not torch.equal(out.ids, out.native_ids)
    # reference-object tokens (in the top-left tile) moved inside the target box (background rows 1..2, cols 2..3)
    moved = (out.ids != out.native_ids).any(1)
    assert moved.any()
    rows, cols = out.ids[moved, 1], out.ids[moved, 2]
    assert rows.min() >= 1 - 0.5 and rows.max() <= 2 + 0.5 and cols.min() >= 2 - 0.5 and cols.max() <= 3 + 0.5


def test_nothing_outside_the_mask_changes_after_compositing(fill_pipes):
    _, posbridge = fill_pipes
    mask = torch.zeros(32, 48, dtype=torch.bool)
    mask[4:20, 20:40] = True
    out = _edit(posbridge, target_box=None, mask_image=mask, transplant={**TRANSPLANT, "mask_dilate_tokens": 1})
    result, background = out.images[0], BACKGROUND["image"][0]
    region = out.canvas.inpaint_mask[16:48, 16:64]
    assert torch.equal(region, torch.nn.functional.max_pool2d(mask[None, None].float(), 33, 1, 16)[0, 0] > 0)
    assert torch.equal(result[:, ~region], background[:, ~region])
    assert not torch.equal(result[:, region], background[:, region])


def test_transplant_input_errors(fill_pipes):
    _, posbridge = fill_pipes
    with pytest.raises(ValueError, match="expected the image size 32x48"):
        _edit(posbridge, target_box=None, mask_image=torch.ones(32, 32))
    with pytest.raises(ValueError, match="empty"):
        _edit(posbridge, target_box=None, mask_image=torch.zeros(32, 48))
    with pytest.raises(ValueError, match=r"\(left, top, right, bottom\) must lie inside the 32x48 \(HxW\) image"):
        _edit(posbridge, target_box=(40, 0, 64, 16))
    with pytest.raises(ValueError, match="16-pixel token grid"):
        _edit(posbridge, image=image(30, 48))
    with pytest.raises(ValueError, match="reference_masks\\[0\\] is 10x10; expected the image size 40x24"):
        _edit(posbridge, reference_masks=[torch.ones(10, 10)])
    with pytest.raises(ValueError, match="exactly one"):
        _edit(posbridge, mask_image=torch.ones(32, 48))
    with pytest.raises(ValueError, match="layout"):
        _edit(posbridge, transplant={"layout": "grid"})
    with pytest.raises(ValueError, match="set by the transplant pipeline"):
        _edit(posbridge, height=32)


def test_transplant_and_loose_on_a_4_pixel_token_grid():
    """A VAE with scale factor 2 (mmpos.world's models): tokens are 4x4 pixels, layouts and masks follow."""
    from mmpos.pipelines import LooseRoPEKontextPipeline

    pipe = PosBridgeFillPipeline(**components("fill", vae_levels=2))
    assert pipe.token_pixels == 4
    out = pipe(
        image=image(16, 24),
        target_box=(8, 4, 20, 12),
        references=image(10, 10, seed=3),
        transplant={"tau": 0.5},
        num_inference_steps=2,
        output_type="pt",
        **embeddings(1),
    )
    assert out.canvas.layout.canvas_size == (16 + 2 * 8, 24 + 2 * 8) and out.images.shape[-2:] == (16, 24)
    assert (out.ids != out.native_ids).any()
    with pytest.raises(ValueError, match="4-pixel token grid"):
        pipe(image=image(18, 24), target_box=(8, 4, 20, 12), references=image(10, 10), **embeddings(1))
    loose = LooseRoPEKontextPipeline(**components("kontext", vae_levels=2))
    mask = torch.zeros(16, 16, dtype=torch.bool)
    mask[4:12, 4:12] = True
    result = loose(
        image=image(16, 16),
        crop_mask=mask,
        loose={"step_range": (0, 1), "mask_dilation": 0},
        num_inference_steps=2,
        _auto_resize=False,
        output_type="latent",
        **embeddings(1),
    )
    assert result.maps.bins.shape == (4, 4) and (result.maps.bins >= 0).sum() == 4


def test_each_view_is_mapped_by_its_own_box():
    grid = (8, 8)
    first, second, target = (torch.zeros(grid, dtype=torch.bool) for _ in range(3))
    first[0:2, 0:2] = True
    second[6:8, 0:2] = True
    target[3:5, 5:7] = True
    ids = transplant_ids(grid, [first, second], target)
    for view in (first, second):
        moved = ids[view.flatten(), 1:]
        assert torch.equal(moved, flux_ids(*grid)[target.flatten(), 1:])  # both land exactly on the target tokens


def test_fill_argument_order_and_return_conventions(fill_pipes):
    """FluxFillPipeline's positional order (prompt, prompt_2, image, mask_image, ...), a BaseOutput, a tuple with
    return_dict=False, output_type="latent"; the extras are keyword-only."""
    from diffusers.utils import BaseOutput

    stock, posbridge = fill_pipes
    common = dict(
        references=BACKGROUND["references"],
        target_box=BACKGROUND["target_box"],
        transplant={**TRANSPLANT, "enabled": False},
        num_inference_steps=2,
        **embeddings(1),
    )
    run = lambda *args, **kwargs: posbridge(
        *args,
        generator=torch.Generator().manual_seed(0),  # noqa: E731
        **{**common, **kwargs},
    )
    output = run(None, None, BACKGROUND["image"], output_type="pt")
    assert isinstance(output, BaseOutput) and output.images.shape == (1, 3, 32, 48)
    as_tuple = run(None, None, BACKGROUND["image"], output_type="pt", return_dict=False)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == 5
    assert torch.equal(as_tuple[0], output.images) and torch.equal(as_tuple[1], output.canvas_images)
    latent = run(image=BACKGROUND["image"], output_type="latent")
    canvas = output.canvas
    expected = stock(
        image=canvas.image,
        mask_image=canvas.inpaint_mask[None, None].float(),
        height=64,
        width=80,
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        output_type="latent",
        **embeddings(1),
    ).images
    assert latent.canvas_images is None and torch.equal(latent.images, expected)
    with pytest.raises(TypeError):
        posbridge(
            None,
            None,
            BACKGROUND["image"],
            None,
            None,
            None,
            None,
            1.0,
            2,
            None,
            30.0,
            1,
            None,
            None,
            None,
            None,
            "pt",
            True,
            None,
            None,
            ["latents"],
            512,
            BACKGROUND["references"],
        )  # references: keyword
    with pytest.raises(ValueError, match="output_type"):
        run(image=BACKGROUND["image"], output_type="tensor")


def test_prompt_is_the_first_positional_argument_as_in_fill():
    """``pipe("a photo", image=...)`` as with FluxFillPipeline (tiny text encoders built offline)."""
    from tests.fixtures.tiny_models import tiny_text_components

    parts = {**components("fill"), **tiny_text_components()}
    posbridge, stock = PosBridgeFillPipeline(**parts), FluxFillPipeline(**parts)
    out = posbridge(
        "the object on the background",
        image=BACKGROUND["image"],
        target_box=BACKGROUND["target_box"],
        references=BACKGROUND["references"],
        transplant={**TRANSPLANT, "enabled": False},
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
    )
    canvas = out.canvas
    expected = stock(
        "the object on the background",
        image=canvas.image,
        height=64,
        width=80,
        mask_image=canvas.inpaint_mask[None, None].float(),
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
    ).images
    assert torch.equal(out.canvas_images, expected)
