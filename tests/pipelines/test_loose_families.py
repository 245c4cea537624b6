"""LooseRoPE on FLUX.2 Klein's edit mode and Qwen-Image-Edit(-Plus) (tiny offline pipelines)."""

import math

import pytest
import torch
from diffusers import (
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Transformer2DModel,
    QwenImageEditPipeline,
)

from mmpos.integrations.diffusers import restore, set_pe
from mmpos.integrations.diffusers.families.qwen import qwen_coords
from mmpos.pipelines.edits.context import EditContext, EditSession
from mmpos.pipelines.edits.loose.pipelines import (
    LooseRoPEKleinPipeline,
    LooseRoPEQwenEditPipeline,
    LooseRoPEQwenEditPlusPipeline,
)
from mmpos.pipelines.edits.loose.rule import LooseConfig, LooseRoPERule, grid_cells
from tests.fixtures.tiny_edit_families import (
    KLEIN_TRANSFORMER,
    klein_prompt_embeds,
    pil_image,
    qwen_prompt_embeds,
    tiny_klein_components,
    tiny_qwen_image_components,
)

YARN = {"type": "yarn", "factor": 2.0, "original_length": 8}


def _paste(size):
    mask = torch.zeros(size, size, dtype=torch.bool)
    mask[size // 4 : 3 * size // 4, size // 4 : 5 * size // 8] = True
    return mask


def _klein_run(pipe, **extra):
    return pipe(
        image=pil_image(64, 64),
        prompt_embeds=klein_prompt_embeds(),
        num_inference_steps=3,
        guidance_scale=1.0,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
        **extra,
    )


def _qwen_run(pipe, image=None, **extra):
    return pipe(
        image=image or pil_image(64, 64),
        height=64,
        width=64,
        **qwen_prompt_embeds(),
        true_cfg_scale=1.0,
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        output_type="pt",
        **extra,
    )


def test_registries_map_families_and_stock_classes_to_subclasses():
    from mmpos.pipelines.edits import get_edit

    loose = get_edit("loose")
    assert issubclass(loose.pipeline_class("Flux2KleinPipeline"), Flux2KleinPipeline)
    assert issubclass(loose.pipeline_class("QwenImageEditPipeline"), QwenImageEditPipeline)
    for stock in ("Flux2KleinPipeline", "QwenImageEditPipeline", "QwenImageEditPlusPipeline"):
        assert loose.pipeline_class(stock).__mro__[2].__name__ == stock


@pytest.mark.parametrize("loose", [{"enabled": False}, {"strength": 0.0}])
def test_klein_loose_off_is_the_stock_pipeline(loose):
    c = tiny_klein_components()
    stock = _klein_run(Flux2KleinPipeline(**c)).images
    out = _klein_run(LooseRoPEKleinPipeline(**c), crop_mask=_paste(64), loose=loose)
    assert torch.equal(out.images, stock)
    on = _klein_run(LooseRoPEKleinPipeline(**c), crop_mask=_paste(64), loose={"step_range": (0, 2)})
    assert not torch.equal(on.images, stock)
    assert on.maps.bins.shape == (16, 16) and bool((on.maps.bins >= 0).any())


def test_klein_keeps_the_stock_call_conventions():
    c = tiny_klein_components()
    pipe = LooseRoPEKleinPipeline(**c)
    images, saliency, mask, maps, verdicts = pipe(
        pil_image(64, 64),
        None,
        prompt_embeds=klein_prompt_embeds(),
        num_inference_steps=2,
        guidance_scale=1.0,
        output_type="np",
        return_dict=False,
        crop_mask=_paste(64),
    )
    assert images.shape == (1, 64, 64, 3) and saliency.shape == mask.shape == (64, 64) and verdicts is None
    with pytest.raises(ValueError, match="exactly one of crop_mask and original"):
        pipe(pil_image(64, 64), prompt_embeds=klein_prompt_embeds(), num_inference_steps=2)


def test_klein_loose_off_under_set_pe_is_the_set_pe_model():
    c = tiny_klein_components()
    set_pe(c["transformer"], "rope_axial", extrapolation=YARN)
    try:
        stock = _klein_run(Flux2KleinPipeline(**c)).images
        off = _klein_run(LooseRoPEKleinPipeline(**c), crop_mask=_paste(64), loose={"enabled": False}).images
        on = _klein_run(LooseRoPEKleinPipeline(**c), crop_mask=_paste(64), loose={"step_range": (0, 2)}).images
    finally:
        restore(c["transformer"])
    assert torch.equal(off, stock)
    assert not torch.equal(on, stock)


# ---- the rule on one FLUX.2 forward: found by coordinates; the logits as the method defines them ------------------
def _flux2_forward(order_seed=None, dtype=torch.float32):
    """One forward's inputs: a 4x4 target (t = 0) and a 4x4 collage (t = 10); with ``order_seed`` the collage
    tokens come first and each image's tokens are shuffled. Returns (kwargs, permutation of the image tokens)."""
    grid = torch.cartesian_prod(torch.arange(1), torch.arange(4), torch.arange(4), torch.arange(1))
    ids = torch.cat([grid, grid + torch.tensor([10, 0, 0, 0])])
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(1, 32, KLEIN_TRANSFORMER["in_channels"], generator=g, dtype=torch.float64).to(dtype)
    order = torch.arange(32)
    if order_seed is not None:
        shuffle = torch.Generator().manual_seed(order_seed)
        order = torch.cat([16 + torch.randperm(16, generator=shuffle), torch.randperm(16, generator=shuffle)])
    text = torch.randn(1, 5, 16, generator=g, dtype=torch.float64).to(dtype)
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(5))
    scheduler = FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(28)
    return (
        scheduler,
        dict(
            hidden_states=hidden[:, order],
            encoder_hidden_states=text,
            img_ids=ids[order][None],
            txt_ids=txt_ids[None],
            timestep=(scheduler.timesteps[:1] / 1000).to(dtype),
            guidance=None,
            return_dict=False,
        ),
        order,
    )


def _run_rule(model, scheduler, kwargs, config, record=None):
    saliency = torch.linspace(0, 1, 16 * 16).reshape(16, 16)
    rule = LooseRoPERule(config, saliency, _paste(16))
    if record is not None:
        rule = record(rule)
    with torch.no_grad(), EditSession(model, EditContext(rules={0: rule, 1: rule}), scheduler):
        return model(**kwargs)[0]


def _tiny_flux2(dtype=torch.float32):
    torch.manual_seed(0)
    return Flux2Transformer2DModel(**KLEIN_TRANSFORMER).eval().to(dtype)


def test_paste_and_collage_tokens_found_by_coordinates_not_sequence_order():
    model = _tiny_flux2()
    config = LooseConfig(saliency_blur=0, mask_dilation=0)
    scheduler, plain, _ = _flux2_forward()
    _, shuffled, order = _flux2_forward(order_seed=3)
    with torch.no_grad():
        stock = model(**plain)[0]
    edited = _run_rule(model, scheduler, plain, config)
    edited_shuffled = _run_rule(model, scheduler, shuffled, config)
    unshuffled = torch.empty_like(edited_shuffled)
    unshuffled[:, order] = edited_shuffled
    change = (edited - stock).abs().max()
    assert change > 1e-3  # the rule is on
    torch.testing.assert_close(unshuffled, edited, rtol=0, atol=float(change) * 1e-3)


def _rotate_exact(x, ids, axes_dims=(4, 4, 4, 4), theta=2000.0):
    """FLUX.2's rotation in fp64 from the math: pair ``j`` of axis ``a`` by ``ids[:, a] * theta**(-2j / d_a)``,
    interleaved pairs, ``x [B, S, H, D]``."""
    inv = torch.cat([theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d) for d in axes_dims])
    axis = torch.cat([torch.full((d // 2,), i) for i, d in enumerate(axes_dims)])
    phase = ids.double()[:, axis] * inv
    cis = torch.polar(torch.ones_like(phase), phase)[None, :, None, :]
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(pairs * cis).flatten(-2)


def test_flux2_rule_output_is_the_loosened_logit_mix():
    """The rule's attention (fp32; FLUX.2's position module gives fp32 tables) equals the method's definition
    computed in fp64 on the same q, k, v: for each binned query, logits to the collage's tokens from positions
    shrunk toward the target's centre (times ``a_i`` on the paste), all other logits standard."""
    model = _tiny_flux2()
    config = LooseConfig(saliency_blur=0, mask_dilation=0)
    scheduler, kwargs, _ = _flux2_forward()
    seen = []

    class Record:
        def __init__(self, rule):
            self.rule = rule

        def __getattr__(self, name):
            return getattr(self.rule, name)

        def attend_call(self, call, context):
            raw = self.rule.attend_call(type(call)(**{**call.__dict__, "finish": lambda out, dtype: out}), context)
            seen.append((call, raw, self.rule.maps))
            return self.rule.attend_call(call, context)

    _run_rule(model, scheduler, kwargs, config, Record)
    call, raw, maps = seen[0]
    text = 5
    ids = torch.cat([kwargs["txt_ids"][0], kwargs["img_ids"][0]]).double()
    q, k, v = call.query, call.key, call.value
    logits = torch.einsum("bqhd,bkhd->bhqk", _rotate_exact(q, ids), _rotate_exact(k, ids))
    shrink, factor = config.factors_at(0)
    bins = maps.bins.flatten()
    paste = maps.context_region.flatten()
    collage = torch.arange(text + 16, text + 32)
    for b in range(config.num_bins):
        queries = text + torch.nonzero(bins == b).flatten()
        if not queries.numel():
            continue
        loose = ids.clone()
        loose[text:, 1:3] = 1.5 + shrink[b] * (loose[text:, 1:3] - 1.5)  # the 4x4 target's centre (1.5, 1.5)
        scaled = _rotate_exact(k, loose)[:, collage] * torch.where(paste, factor[b], 1.0)[None, :, None, None]
        mixed = torch.einsum("bqhd,bkhd->bhqk", _rotate_exact(q, loose)[:, queries], scaled)
        logits[:, :, queries[:, None], collage[None, :]] = mixed
    expected = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(logits / math.sqrt(q.shape[-1]), dim=-1), v.double())
    assert int((bins >= 0).sum()) > 0
    torch.testing.assert_close(raw.double(), expected, rtol=0, atol=2e-5)
    assert (raw.double() - expected).abs().max() < 1e-2 * (raw.double() - standard_attention(q, k, v, ids)).abs().max()


def standard_attention(q, k, v, ids):
    logits = torch.einsum("bqhd,bkhd->bhqk", _rotate_exact(q, ids), _rotate_exact(k, ids)) / math.sqrt(q.shape[-1])
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(logits, dim=-1), v.double())


def test_grid_cells_read_the_cell_of_each_token():
    coords = torch.tensor([[0.0, 1, 0], [0, 0, 1], [0, 1, 1], [0, 0, 0]])
    cells, grid = grid_cells(coords)
    assert grid == (2, 2) and cells.tolist() == [2, 1, 3, 0]
    with pytest.raises(ValueError, match="do not fill"):
        grid_cells(coords[:3])


# ---- Qwen-Image-Edit(-Plus) --------------------------------------------------------------------------------------
def test_qwen_edit_loose_off_is_the_stock_pipeline():
    c = tiny_qwen_image_components(text_encoder=False)
    stock = _qwen_run(QwenImageEditPipeline(processor=None, **c)).images
    off = _qwen_run(LooseRoPEQwenEditPipeline(processor=None, **c), crop_mask=_paste(64), loose={"enabled": False})
    on = _qwen_run(LooseRoPEQwenEditPipeline(processor=None, **c), crop_mask=_paste(64), loose={"step_range": (0, 2)})
    assert torch.equal(off.images, stock)
    assert not torch.equal(on.images, stock)


def test_qwen_edit_loose_off_under_set_pe_is_the_set_pe_model():
    c = tiny_qwen_image_components(text_encoder=False)
    set_pe(c["transformer"], "native", extrapolation={"type": "ntk", "factor": 2.0})
    try:
        stock = _qwen_run(QwenImageEditPipeline(processor=None, **c)).images
        off = _qwen_run(
            LooseRoPEQwenEditPipeline(processor=None, **c), crop_mask=_paste(64), loose={"enabled": False}
        ).images
        on = _qwen_run(
            LooseRoPEQwenEditPipeline(processor=None, **c), crop_mask=_paste(64), loose={"step_range": (0, 2)}
        ).images
    finally:
        restore(c["transformer"])
    assert torch.equal(off, stock)
    assert not torch.equal(on, stock)


def test_qwen_edit_plus_collage_is_the_first_condition_image_by_frame_index():
    """With two condition images of different sizes, the collage's tokens are those at frame index 1 (read from
    the coordinates of ``img_shapes``), whichever image is the larger one."""
    c = tiny_qwen_image_components(text_encoder=False)
    pipe = LooseRoPEQwenEditPlusPipeline(processor=None, **c)
    layouts = []
    original = LooseRoPERule._layout

    def spy(self, context):
        out = original(self, context)
        layouts.append((out, context.inputs["img_shapes"]))
        return out

    LooseRoPERule._layout = spy
    try:
        for images in ([pil_image(64, 64), pil_image(32, 64, seed=4)], [pil_image(32, 64), pil_image(64, 64, seed=4)]):
            layouts.clear()
            out = _qwen_run(
                pipe,
                image=images,
                crop_mask=_paste(64) if images[0].size == (64, 64) else _paste(64)[:32],
                loose={"step_range": (0, 1)},
            )
            (_, _, _, collage, _), shapes = layouts[0]
            coords = qwen_coords(shapes, 1)[0]
            assert torch.equal(collage, torch.nonzero(coords[:, 0] == 1).flatten())
            assert out.maps.context_region.shape == shapes[0][1][1:]
    finally:
        LooseRoPERule._layout = original
