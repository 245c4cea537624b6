"""The families of issue 43's second round (Bria, FIBO, FIBO 2, Ovis-Image, HunyuanImage 2.1, Motif-Video, FramePack,
NucleusMoE-Image, Kandinsky 5, Kandinsky 6 SR, ERNIE-Image, PRX, GLM-Image, Ideogram 4, AnyFlow, JoyImage Edit and
Edit Plus) at twice their
tiny case's grid with ``"pi"``: the seam's tables against each family's own table formula with the image axes'
frequencies halved (the stock module at halved image positions or scale, where it takes them; float64 math
otherwise). Text and other non-image tokens keep the stock tables. Plus what the suite's rows cannot state: the
refusals by name (ERNIE-Image's phase tables, HunyuanImage's 3D-rope config), FramePack's and JoyImage Edit Plus' one
spectrum per forward, and JoyImage's rope methods shadowed and given back.
"""

import math

import pytest
import torch

from mmpos.integrations.diffusers import model_extrapolation, position_module, set_pe
from mmpos.integrations.diffusers.families import get_family
from mmpos.integrations.diffusers.families.tiny import CASES, HUNYUAN_IMAGE_CONFIG


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def ladder64(dim, theta):
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def calls_of(module, model, inputs):
    """``(args, kwargs, output)`` of every call of ``module`` during one forward of ``model``."""
    calls = []
    handle = module.register_forward_hook(lambda m, a, kw, o: calls.append((a, kw, o)), with_kwargs=True)
    with torch.no_grad():
        model(**inputs, return_dict=False)
    handle.remove()
    return calls


def pi_at_twice_the_grid(family):
    """``(stock module, seam calls, seam, model, inputs)``: ``"pi"`` installed for the case's grid, one forward at
    twice it (sigma 1)."""
    case = CASES[family]
    model = case.model()
    stock = getattr(model, get_family(family).position_attr)
    rows, cols = case.grid
    inputs = case.inputs(2 * rows, 2 * cols, sigma=1.0)
    set_pe(model, "native", extrapolation=model_extrapolation(model, "pi", case.grid))
    seam = position_module(model)
    return stock, calls_of(seam, model, inputs), seam, model, inputs


def close(a, b, atol=1e-5):
    a, b = (torch.view_as_real(t) if t.is_complex() else t for t in (a, b))
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a.double(), b.double(), atol=atol), (a.double() - b.double()).abs().max()


def repeated_cos_sin(phases):
    """``[S, P]`` float64 phases -> ``(cos, sin)`` ``[S, 2P]``, each pair's value repeated."""
    return phases.cos().repeat_interleave(2, -1), phases.sin().repeat_interleave(2, -1)


def grid_phases(sizes, axes_dims, theta, scales):
    """float64 phases ``[prod(sizes), sum(d) / 2]`` of the ``meshgrid`` of ``arange(n)`` per axis, axis ``a``'s
    ladder divided by ``scales[a]``; ``sizes`` may give an axis' positions as a tensor instead of a count."""
    axes = [n.double() if isinstance(n, torch.Tensor) else torch.arange(n, dtype=torch.float64) for n in sizes]
    pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(axes))
    return torch.cat([pos[:, [a]] * ladder64(d, theta) / s for a, (d, s) in enumerate(zip(axes_dims, scales))], -1)


@pytest.mark.parametrize("family", ["bria", "bria_fibo", "ovis_image"])
def test_flux_ids_families_halve_the_image_positions(family):
    """FLUX.1-style ids ``cat(txt_ids, img_ids)``: the stock module at the image rows' halved row and column ids; the
    text rows (zeros) are the stock rows."""
    stock, calls, seam, _, _ = pi_at_twice_the_grid(family)
    ((args, _, (cos, sin)),) = calls
    (ids,) = args
    text = seam.text_tokens
    halved = ids.clone().float()
    halved[text:, 1:] /= 2
    expected_cos, expected_sin = stock(halved)
    close(cos, expected_cos), close(sin, expected_sin)
    stock_cos, _ = stock(ids)
    assert torch.equal(cos[:text], stock_cos[:text])


@pytest.mark.parametrize("family", ["hunyuan_image", "motif_video"])
def test_latent_grid_families_halve_the_image_frequencies(family):
    _, calls, seam, _, inputs = pi_at_twice_the_grid(family)
    ((_, _, (cos, sin)),) = calls
    latents = inputs["hidden_states"]
    if family == "hunyuan_image":
        sizes, scales = latents.shape[2:], (2, 2)
    else:
        sizes, scales = (latents.shape[2], latents.shape[3] // 2, latents.shape[4] // 2), (1, 2, 2)
    expected = repeated_cos_sin(grid_phases(sizes, seam.axes_dims, seam.theta, scales))
    close(cos, expected[0]), close(sin, expected[1])


def test_framepack_every_token_group_gets_one_spectrum():
    """The four rope calls (latents, clean, 2x, 4x history) at their frame indices, rows and columns halved, time on
    its stock ladder; the time extent spans every frame index of the forward (here a static policy: none)."""
    _, calls, seam, _, inputs = pi_at_twice_the_grid("hunyuan_video_framepack")
    assert len(calls) == 4
    rows, cols = (n // 2 for n in inputs["hidden_states"].shape[3:])
    for args, kwargs, (cos, sin) in calls:
        frames = kwargs["frame_indices"]
        expected = repeated_cos_sin(grid_phases((frames, rows, cols), seam.axes_dims, seam.theta, (1, 2, 2)))
        close(cos, expected[0]), close(sin, expected[1])


def test_framepack_time_extent_spans_every_frame_index():
    """RIFLEx on time with the target length of the whole forward: every call's time channels turn alike."""
    case = CASES["hunyuan_video_framepack"]
    model = case.model()
    inputs = case.inputs(*case.grid, sigma=1.0)
    time = {"type": "riflex", "k": 1, "target_length": 4}
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype", case.grid, time=time))
    calls = calls_of(position_module(model), model, inputs)
    t_dim = position_module(model).axes_dims[0]
    riflex = 0.9 * 2 * math.pi / 4  # pair k = 1: 0.9 periods over target_length frames
    for _, kwargs, (cos, _) in calls:
        t = kwargs["frame_indices"].double()[:, None]
        expected = torch.cat([t * riflex, t * ladder64(t_dim, 256.0)[1:]], 1).cos().repeat_interleave(2, -1)
        got = cos.reshape(t.shape[0], -1, cos.shape[-1])[..., :t_dim].double()
        assert torch.allclose(got, expected[:, None].expand_as(got), atol=1e-6)


def test_nucleusmoe_image_rows_halved_text_stock():
    stock, calls, seam, _, inputs = pi_at_twice_the_grid("nucleusmoe_image")
    ((args, kwargs, (image, text)),) = calls
    frames, rows, cols = inputs["img_shapes"][0][0]
    r = torch.arange(rows, dtype=torch.float64) - (rows - rows // 2)
    c = torch.arange(cols, dtype=torch.float64) - (cols - cols // 2)
    phases = grid_phases((torch.zeros(1), r, c), seam.axes_dims, seam.theta, (1, 2, 2))
    close(image, torch.polar(torch.ones_like(phases), phases))
    stock_image, stock_text = stock(*args, **kwargs)
    assert torch.equal(text, stock_text)
    assert not torch.equal(image, stock_image)


@pytest.mark.parametrize("family", ["kandinsky5", "kandinsky6_sr"])
def test_kandinsky_tables_are_the_stock_module_at_twice_the_scale_factor(family):
    """Kandinsky divides its angles by ``scale_factor``: halving the image frequencies is the stock module with the
    rows' and columns' factor doubled."""
    stock, calls, _, _, _ = pi_at_twice_the_grid(family)
    ((args, kwargs, table),) = calls
    *lead, pos, scale = args
    doubled = (scale[0], 2 * scale[1], 2 * scale[2])
    close(table, stock(*lead, pos, doubled))


def test_ernie_image_phases_halved_on_the_image_rows():
    stock, calls, seam, _, _ = pi_at_twice_the_grid("ernie_image")
    ((args, _, phases),) = calls
    (ids,) = args
    text = seam.text_tokens
    halved = ids.clone()
    halved[:, :-text, 1:] /= 2
    close(phases, stock(halved))
    assert torch.equal(phases[:, -text:], stock(ids)[:, -text:])


def test_ernie_image_refuses_a_magnitude_by_name():
    case = CASES["ernie_image"]
    model = case.model()
    rows, cols = case.grid
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype", case.grid))  # vision YaRN: magnitude
    with pytest.raises(ValueError, match="phases, which cannot carry a magnitude"), torch.no_grad():
        model(**case.inputs(2 * rows, 2 * cols, sigma=1.0))


def test_prx_is_the_stock_module_at_halved_ids():
    stock, calls, _, _, _ = pi_at_twice_the_grid("prx")
    ((args, _, table),) = calls
    (ids,) = args
    close(table, stock(ids / 2))


def test_glm_image_half_layout_halved():
    _, calls, seam, _, inputs = pi_at_twice_the_grid("glm_image")
    ((_, _, (cos, sin)),) = calls
    rows, cols = (n // 2 for n in inputs["hidden_states"].shape[2:])
    ladders = [ladder64(d, seam.theta) / 2 for d in seam.axes_dims]
    ph_r = (torch.arange(rows, dtype=torch.float64)[:, None] * ladders[0])[:, None].expand(rows, cols, -1)
    ph_c = (torch.arange(cols, dtype=torch.float64)[:, None] * ladders[1])[None].expand(rows, cols, -1)
    phases = torch.cat([ph_r, ph_c], -1).reshape(rows * cols, -1)
    phases = torch.cat([phases, phases], -1)
    assert cos.device.type == "cpu"
    close(cos, phases.cos()), close(sin, phases.sin())


def test_ideogram4_image_tokens_halved_on_their_interleaved_pairs():
    """MRoPE-I: the image tokens' h and w pairs (``j % 3 == 1, 2`` within the sections) turn at half the rate, their t
    pairs and every text token's pairs are the stock ones: the stock module at halved image h and w positions."""
    stock, calls, _, _, inputs = pi_at_twice_the_grid("ideogram4")
    ((args, _, (cos, sin)),) = calls
    (position_ids,) = args
    halved = position_ids.double().clone()
    image = inputs["indicator"] == 2
    halved[..., 1:][image] /= 2
    expected_cos, expected_sin = stock(halved.float())
    close(cos, expected_cos, atol=2e-3), close(sin, expected_sin, atol=2e-3)  # float32 phases near 65536 rad
    stock_cos, _ = stock(position_ids)
    assert torch.equal(cos[~image], stock_cos[~image])


def test_bria_fibo2_image_planes_halved_gist_stock():
    stock, calls, seam, _, _ = pi_at_twice_the_grid("bria_fibo2")
    image_call, gist_call = calls
    ids = image_call[0][0]
    phases = torch.cat(
        [ids[:, [a]].double() * ladder64(d, seam.theta) / s for a, (d, s) in enumerate(zip(seam.axes_dims, (1, 2, 2)))],
        -1,
    )
    close(image_call[2], torch.polar(torch.ones_like(phases), phases))
    gist_ids = gist_call[0][0]
    assert torch.equal(gist_call[2], stock(gist_ids))


def test_anyflow_grid_halved():
    _, calls, seam, _, inputs = pi_at_twice_the_grid("anyflow")
    ((_, kwargs, tables),) = calls
    frames, rows, cols = inputs["hidden_states"].shape[1], *(n // 2 for n in inputs["hidden_states"].shape[3:])
    phases = grid_phases((frames, rows, cols), seam.axes_dims, seam.theta, (1, 2, 2))
    assert tables["query"] is tables["key"]
    close(tables["query"][0, 0], torch.polar(torch.ones_like(phases), phases))


def test_hunyuan_image_refuses_the_3d_rope_config_by_name():
    from diffusers import HunyuanImageTransformer2DModel

    config = dict(HUNYUAN_IMAGE_CONFIG, patch_size=(1, 1, 1), rope_axes_dim=(4, 6, 6))
    model = HunyuanImageTransformer2DModel(**config)
    with pytest.raises(TypeError, match="rope_axes_dim"):
        set_pe(model, "native")


def test_joyimage_visual_grid_halved_text_stock():
    """The reference item is the next time step; the mrope text after the largest visual index keeps the stock
    tables (the stock method)."""
    _, calls, seam, model, inputs = pi_at_twice_the_grid("joyimage")
    ((args, kwargs, (vis, txt)),) = calls
    items, rows, cols = inputs["hidden_states"].shape[1], *(n // 2 for n in inputs["hidden_states"].shape[4:])
    expected = repeated_cos_sin(grid_phases((items, rows, cols), seam.axes_dims, seam.theta, (1, 2, 2)))
    close(vis[0], expected[0]), close(vis[1], expected[1])
    stock = type(model).get_rotary_pos_embed(model, **kwargs)
    assert torch.equal(txt[0], stock[1][0]) and torch.equal(txt[1], stock[1][1])


@pytest.mark.parametrize("family", ["joyimage", "joyimage_edit_plus"])
def test_joyimage_rope_methods_are_shadowed_and_given_back(family):
    case = CASES[family]
    model = case.model()
    name = get_family(family).position_attr
    set_pe(model, "native")
    assert name in vars(model) and name not in dict(model.named_modules())  # not a submodule: stock checkpoint
    from mmpos.integrations.diffusers import restore

    restore(model)
    assert name not in vars(model) and getattr(model, name).__func__ is getattr(type(model), name)


def test_joyimage_edit_plus_references_get_the_edited_images_spectrum():
    """A reference component at ``t = 1`` of another size: the same halved row and column frequencies as the edited
    image's (the spectrum of the forward, from the edited image's grid), at its own positions."""
    case = CASES["joyimage_edit_plus"]
    model = case.model()
    rows, cols = (2 * n for n in case.grid)
    inputs = case.inputs(rows, cols, sigma=1.0)
    reference = (3, 5)
    inputs["hidden_states"] = torch.cat([inputs["hidden_states"], torch.randn(1, 15, 4, 1, 2, 2)], dim=1)
    inputs["shape_list"] = [[(1, rows, cols), (1, *reference)]]
    set_pe(model, "native", extrapolation=model_extrapolation(model, "pi", case.grid))
    seam = position_module(model)
    calls = calls_of(seam, model, inputs)
    assert len(calls) == 2
    for (args, _, (cos, sin)), (t, r, c) in zip(calls, [(0, rows, cols), (1, *reference)]):
        expected = repeated_cos_sin(
            grid_phases((torch.tensor([float(t)]), r, c), seam.axes_dims, seam.theta, (1, 2, 2))
        )
        close(cos, expected[0]), close(sin, expected[1])
