"""PE transplant on FLUX.2 Klein inpainting and Qwen-Image inpainting (tiny offline pipelines)."""

import numpy as np
import pytest
import torch
from diffusers import Flux2KleinInpaintPipeline, QwenImageInpaintPipeline

from mmpos.integrations.diffusers import restore, set_pe
from mmpos.pipelines.edits.context import EditContext
from mmpos.pipelines.edits.families import edit_attention
from mmpos.pipelines.edits.families.flux2 import flux2_canvas_ids
from mmpos.pipelines.edits.transplant.pipeline_inpaint import (
    PosBridgeKleinInpaintPipeline,
    PosBridgeQwenInpaintPipeline,
)
from mmpos.pipelines.edits.transplant.positions import TransplantPositions
from mmpos.pipelines.images import mask_to_tokens
from tests.fixtures.tiny_edit_families import (
    klein_prompt_embeds,
    qwen_prompt_embeds,
    tiny_klein_components,
    tiny_qwen_image_components,
)

YARN = {"type": "yarn", "factor": 2.0, "original_length": 8}


def _inputs(size, box, seed=3):
    g = torch.Generator().manual_seed(seed)
    background = torch.rand(1, 3, size, size, generator=g)
    reference = torch.rand(1, 3, size // 2, size // 2, generator=g)
    ref_mask = torch.zeros(size // 2, size // 2, dtype=torch.bool)
    ref_mask[2:-4, 4:-2] = True
    return dict(image=background, references=[reference], reference_masks=[ref_mask], target_box=box)


def _klein(**kwargs):
    c = tiny_klein_components()
    return c, PosBridgeKleinInpaintPipeline(**c)


def _klein_args(transplant=None, **extra):
    return dict(
        prompt_embeds=klein_prompt_embeds(),
        num_inference_steps=3,
        guidance_scale=1.0,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
        transplant=transplant,
        **_inputs(32, (8, 8, 24, 20)),
        **extra,
    )


def _qwen_args(transplant=None, **extra):
    return dict(
        **qwen_prompt_embeds(),
        true_cfg_scale=1.0,
        num_inference_steps=3,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
        transplant=transplant,
        **_inputs(64, (16, 16, 48, 40)),
        **extra,
    )


def _stock_on_canvas(stock, out, args, **extra):
    """The stock pipeline on the transplant pipeline's own canvas and mask."""
    drop = ("transplant", "references", "reference_masks", "target_box", "image")
    kwargs = {k: v for k, v in args.items() if k not in drop}
    kwargs["generator"] = torch.Generator().manual_seed(0)
    mask = out.canvas.inpaint_mask[None, None].float()
    return stock(image=out.canvas.image, mask_image=mask, strength=1.0, **kwargs, **extra).images


def test_registry_maps_families_to_subclasses_of_the_stock_pipelines():
    from mmpos.pipelines.edits import get_edit

    transplant = get_edit("transplant")
    assert issubclass(transplant.pipeline_class("Flux2KleinInpaintPipeline"), Flux2KleinInpaintPipeline)
    assert issubclass(transplant.pipeline_class("QwenImageInpaintPipeline"), QwenImageInpaintPipeline)


@pytest.mark.parametrize("transplant", [{"enabled": False}, {"tau": 2.0}])
def test_klein_transplant_off_is_the_stock_pipeline_on_the_canvas(transplant):
    c, pipe = _klein()
    args = _klein_args(transplant)
    out = pipe(**args)
    expected = _stock_on_canvas(Flux2KleinInpaintPipeline(**c), out, args)
    assert torch.equal(out.canvas_images, expected)
    rows, cols = out.canvas.layout.background.slices
    outside = ~out.canvas.inpaint_mask[rows, cols]
    assert torch.equal(out.images[..., outside], out.canvas.image[..., rows, cols][..., outside].to(out.images.dtype))


def _placement_fp64(out, token_pixels):
    """Expected canvas ids ``[N, 2]`` (row, col) in fp64 from the canvas geometry: the object's token box mapped
    onto the target's token box (uniform scale, centred), token centres at ``i + 1/2``."""
    grid = out.canvas.layout.grid
    source = mask_to_tokens(out.canvas.object_masks[0], grid, 0.5).numpy()
    target = mask_to_tokens(out.canvas.inpaint_mask, grid, 0.0).numpy()

    def bounds(m):
        r, c = np.nonzero(m)
        return r.min(), c.min(), r.max() + 1, c.max() + 1

    (st, sl, sb, sr), (tt, tl, tb, tr) = bounds(source), bounds(target)
    scale = min((tb - tt) / (sb - st), (tr - tl) / (sr - sl))
    rows, cols = np.meshgrid(np.arange(grid[0], dtype=np.float64), np.arange(grid[1], dtype=np.float64), indexing="ij")
    new_r = (tt + tb) / 2 + scale * (rows + 0.5 - (st + sb) / 2) - 0.5
    new_c = (tl + tr) / 2 + scale * (cols + 0.5 - (sl + sr) / 2) - 0.5
    expected = np.stack([np.where(source, new_r, rows), np.where(source, new_c, cols)], -1).reshape(-1, 2)
    return torch.from_numpy(expected), torch.from_numpy(source.reshape(-1))


def test_klein_reference_ids_equal_the_canvas_placement_fp64():
    c, pipe = _klein()
    seen = []
    handle = pipe.transformer.pos_embed.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    try:
        out = pipe(**_klein_args({"tau": 0.0}))
    finally:
        handle.remove()
    image_ids = [ids for ids in seen if ids.shape[0] > 5]  # the text ids have the prompt's 5 rows
    assert len(image_ids) == 3  # one forward per step, all in the window (tau = 0)
    expected, source = _placement_fp64(out, pipe.token_pixels)
    n = expected.shape[0]
    for ids in image_ids:
        canvas = ids[:n]
        assert torch.equal(canvas[:, 1:3], expected.float())  # fp64 placement, rounded once to the ids' fp32
        assert bool((canvas[:, [0, 3]] == 0).all())
        assert torch.equal(
            ids[n:], pipe._prepare_image_ids([torch.zeros(1, 1, *out.canvas.layout.grid)], 1)[0].to(ids.dtype)
        )  # the condition copy (t = 10) keeps its native ids
    assert bool(source.any()) and torch.equal(out.ids[:, 1:3], expected.float())


def test_klein_canvas_tokens_found_by_coordinates_not_sequence_order():
    grid = (4, 6)
    ids = torch.stack(
        torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(6.0), torch.zeros(1), indexing="ij"), -1
    ).reshape(-1, 4)
    moved = ids[:, :3].clone()
    moved[5, 1:3] = torch.tensor([2.25, 3.5])
    moved[7, 1:3] = torch.tensor([0.5, 1.0])
    condition = ids.clone()
    condition[:, 0] = 10
    rewrite = TransplantPositions(moved, grid, tau=0.5)
    order = torch.randperm(48, generator=torch.Generator().manual_seed(0))
    native = torch.cat([ids, condition])[order][None]  # canvas and condition tokens interleaved, shuffled
    kwargs = rewrite(EditContext(sigma=0.9, adapter=edit_attention("flux2")), dict(img_ids=native))
    expected = torch.cat([flux2_canvas_ids(moved), condition])[order][None]
    assert torch.equal(kwargs["img_ids"], expected)
    below = dict(img_ids=native)
    assert rewrite(EditContext(sigma=0.4, adapter=edit_attention("flux2")), below) is below  # below tau: untouched


def test_klein_edit_off_under_set_pe_is_the_set_pe_model():
    c, pipe = _klein()
    set_pe(pipe.transformer, "rope_axial", extrapolation=YARN)
    try:
        args = _klein_args({"enabled": False})
        out = pipe(**args)
        expected = _stock_on_canvas(Flux2KleinInpaintPipeline(**c), out, args)
        on = pipe(**_klein_args({"tau": 0.0})).canvas_images
    finally:
        restore(pipe.transformer)
    assert torch.equal(out.canvas_images, expected)
    assert not torch.equal(on, expected)


def test_klein_rejects_arguments_the_canvas_sets():
    _, pipe = _klein()
    with pytest.raises(ValueError, match="height is set by the transplant pipeline"):
        pipe(**_klein_args(), height=32)


# ---- Qwen-Image -----------------------------------------------------------------------------------------------
def _qwen():
    c = tiny_qwen_image_components(text_encoder=False)
    return c, PosBridgeQwenInpaintPipeline(**c)


@pytest.mark.parametrize("transplant", [{"enabled": False}, {"tau": 2.0}])
def test_qwen_transplant_off_is_the_stock_pipeline_on_the_canvas(transplant):
    c, pipe = _qwen()
    args = _qwen_args(transplant)
    out = pipe(**args)
    rows, cols = out.canvas.layout.canvas_size
    expected = _stock_on_canvas(QwenImageInpaintPipeline(**c), out, args, height=rows, width=cols)
    assert torch.equal(out.canvas_images, expected)


class _BlockSpy:
    """Records the image rotary table the first block receives."""

    def __init__(self, block):
        self.tables = []
        self.handle = block.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        self.tables.append(kwargs["image_rotary_emb"][0].clone())


def _exact_qwen_table(module, coords):
    """``exp(i * coord * inv_freq)`` in fp64 from the module's theta and axes (the math)."""
    axis = torch.cat([torch.full((d // 2,), i) for i, d in enumerate(module.axes_dim)])
    inv = torch.cat([1.0 / module.theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d) for d in module.axes_dim])
    phase = coords.double()[:, axis] * inv
    return torch.polar(torch.ones_like(phase), phase)


def test_qwen_reference_rows_are_the_table_at_the_canvas_placement():
    c, pipe = _qwen()
    spy = _BlockSpy(pipe.transformer.transformer_blocks[0])
    try:
        out = pipe(**_qwen_args({"tau": 0.0}))
        stock_rows = _BlockSpy(pipe.transformer.transformer_blocks[0])
        pipe(**_qwen_args({"enabled": False}))
        stock_rows.handle.remove()
    finally:
        spy.handle.remove()
    grid = out.canvas.layout.grid
    expected, source = _placement_fp64(out, pipe.token_pixels)
    centred = expected - torch.tensor([grid[0] - grid[0] // 2, grid[1] - grid[1] // 2], dtype=torch.float64)
    assert torch.equal(out.ids[:, 1:].double(), centred.float().double())
    exact = _exact_qwen_table(
        pipe.transformer.pos_embed, torch.cat([torch.zeros(len(centred), 1, dtype=torch.float64), centred], 1)
    )
    for table, stock in zip(spy.tables, stock_rows.tables):
        assert torch.equal(table[~source], stock[~source])  # untouched rows: the stock table, bit for bit
        assert not torch.equal(table[source], stock[source])
        torch.testing.assert_close(table[source].to(torch.complex128), exact[source], rtol=0, atol=2e-6)


def test_qwen_edit_off_under_set_pe_is_the_set_pe_model():
    c, pipe = _qwen()
    set_pe(pipe.transformer, "native", extrapolation={"type": "ntk", "factor": 2.0})
    try:
        args = _qwen_args({"enabled": False})
        out = pipe(**args)
        rows, cols = out.canvas.layout.canvas_size
        expected = _stock_on_canvas(QwenImageInpaintPipeline(**c), out, args, height=rows, width=cols)
        on = pipe(**_qwen_args({"tau": 0.0})).canvas_images
    finally:
        restore(pipe.transformer)
    assert torch.equal(out.canvas_images, expected)
    assert not torch.equal(on, expected)


def test_qwen_hook_finds_canvas_rows_by_coordinates():
    grid = (4, 4)
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0), indexing="ij"), -1).reshape(
        -1, 3
    )
    moved_ids = ids.clone()
    moved_ids[3, 1:] = torch.tensor([1.5, 2.0])
    rewrite = TransplantPositions(moved_ids, grid, tau=0.0)
    context = EditContext(sigma=1.0, adapter=edit_attention("qwen"))
    pipe_module = tiny_qwen_image_components(text_encoder=False)["transformer"].pos_embed
    image, text = pipe_module([(1, 4, 4)], max_txt_seq_len=3, device="cpu")
    new_image, new_text = rewrite.on_positions(
        context, pipe_module, ([(1, 4, 4)],), {"max_txt_seq_len": 3}, (image, text)
    )
    changed = (new_image != image).any(-1)
    assert changed.nonzero().flatten().tolist() == [3] and torch.equal(new_text, text)
    exact = _exact_qwen_table(pipe_module, torch.tensor([[0.0, 1.5 - 2, 2.0 - 2]]))
    torch.testing.assert_close(new_image[3:4].to(torch.complex128), exact, rtol=0, atol=1e-6)


def test_klein_transplant_with_a_batch_rewrites_the_shared_ids():
    c, pipe = _klein()
    out = pipe(**_klein_args({"tau": 0.0}, num_images_per_prompt=2))
    single = pipe(**_klein_args({"tau": 0.0}))
    assert out.canvas_images.shape[0] == 2
    assert torch.equal(out.ids, single.ids)
