"""Families whose pipeline builds the rotary tables (``forward(image_rotary_emb=...)``, :mod:`~mmpos.integrations.
diffusers.families.rotary_input`): CogVideoX 1.0 / 1.5 and ConsisID. The tables the transformer receives with
``set_pe`` at twice the grid, against the pipelines' ``get_3d_rotary_pos_embed`` re-implemented here in float64
with the extrapolated frequencies; hand-made tables refused by name. Also Cosmos 3 Omni's interleaved MRoPE over
its packed sequence (a position module, reached with these), and the modules beside a transformer that set_pe
does not follow (ControlNets, LTX-2's connectors)."""

import math

import pytest
import torch

from mmpos.integrations.diffusers import model_extrapolation, position_module, restore, set_pe
from mmpos.integrations.diffusers.families.tiny import (
    CASES,
    COGVIDEOX_CONFIG,
    CONSISID_CONFIG,
    FLUX_CONFIG,
    QWEN_CONFIG,
    cogvideox_inputs,
    consisid_inputs,
    pipeline_rotary_emb,
)

THETA = 10000.0


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def received_tables(model, inputs):
    """The ``image_rotary_emb`` the transformer's forward runs with (after set_pe's hook replaced it)."""
    seen = []
    handle = model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["image_rotary_emb"]), with_kwargs=True)
    with torch.no_grad():
        model(**inputs, return_dict=False)
    handle.remove()
    return seen[0]


def crop_region(rows, cols, base_h, base_w):
    """``get_resize_crop_region_for_grid`` (the CogVideoX pipelines'), written from its definition."""
    if rows / cols > base_h / base_w:
        height, width = base_h, round(base_h / rows * cols)
    else:
        width, height = base_w, round(base_w / cols * rows)
    top, left = round((base_h - height) / 2), round((base_w - width) / 2)
    return (top, left), (top + height, left + width)


def positions_fp64(config, frames, rows, cols):
    """The per-axis positions of ``get_3d_rotary_pos_embed`` as the CogVideoX / ConsisID pipelines call it."""
    p, p_t = config["patch_size"], config.get("patch_size_t")
    if p_t is not None:  # 1.5: grid_type="slice"
        time = -(-frames // p_t)
        return [torch.arange(n, dtype=torch.float64) for n in (time, rows, cols)]
    (top, left), (bottom, right) = crop_region(rows, cols, config["sample_height"] // p, config["sample_width"] // p)
    return [
        torch.linspace(0, frames * (frames - 1) / frames, frames, dtype=torch.float64),
        torch.linspace(top, bottom * (rows - 1) / rows, rows, dtype=torch.float64),
        torch.linspace(left, right * (cols - 1) / cols, cols, dtype=torch.float64),
    ]


def tables_fp64(positions, inv_freqs):
    """``(cos, sin)`` ``[T H W, D]``: per axis ``cos(p w)`` / ``sin(p w)``, each pair's value twice, over the grid."""
    counts = [len(p) for p in positions]
    out = []
    for fn in (torch.cos, torch.sin):
        axes = []
        for axis, (pos, inv) in enumerate(zip(positions, inv_freqs)):
            values = fn(pos[:, None] * inv[None, :]).repeat_interleave(2, dim=1)
            shape = [1, 1, 1, values.shape[-1]]
            shape[axis] = counts[axis]
            axes.append(values.reshape(shape).expand(*counts, -1))
        out.append(torch.cat(axes, dim=-1).reshape(math.prod(counts), -1))
    return out


def ladder(dim):
    return THETA ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def dims(config):
    d = config["attention_head_dim"]
    return d // 4, d // 8 * 3, d // 8 * 3


def test_cogvideox_1_5_pi_at_twice_the_grid_divides_rows_and_cols_by_two():
    """1.5's integer positions at 8 x 8 tokens over a 4 x 4 training grid: rows and columns at half the frequency,
    time (2 latent-frame tokens, its training extent) stock."""
    model = CASES["cogvideox"].model()
    set_pe(model, "native", extrapolation=model_extrapolation(model, "pi", (4, 4)))
    inputs = cogvideox_inputs(8, 8)
    cos, sin = received_tables(model, inputs)
    t, h, w = dims(COGVIDEOX_CONFIG)
    expected = tables_fp64(positions_fp64(COGVIDEOX_CONFIG, 4, 8, 8), [ladder(t), ladder(h) / 2, ladder(w) / 2])
    assert cos.dtype == torch.float32 and cos.shape == expected[0].shape
    torch.testing.assert_close(cos.double(), expected[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(sin.double(), expected[1], rtol=0, atol=2e-6)
    stock_cos, _ = inputs["image_rotary_emb"]
    assert torch.equal(cos[:, :t], stock_cos[:, :t])  # time: the stock columns bit for bit
    assert (cos - stock_cos).abs().max() > 0.5


@pytest.mark.parametrize("sigma", [1.0, 0.5])
def test_cogvideox_1_5_dype_ntk_at_twice_the_grid_follows_sigma(sigma):
    """DyPE through NTK: ``theta * s ** (kappa d / (d - 2))``, ``kappa = 2 sigma ** 2``, on rows and columns."""
    model = CASES["cogvideox"].model()
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype_ntk", (4, 4)))
    cos, sin = received_tables(model, cogvideox_inputs(8, 8, sigma=sigma))
    t, h, w = dims(COGVIDEOX_CONFIG)
    kappa = 2.0 * sigma**2

    def ntk(d):
        return (THETA * 2.0 ** (kappa * d / (d - 2))) ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)

    expected = tables_fp64(positions_fp64(COGVIDEOX_CONFIG, 4, 8, 8), [ladder(t), ntk(h), ntk(w)])
    torch.testing.assert_close(cos.double(), expected[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(sin.double(), expected[1], rtol=0, atol=2e-6)


COGVIDEOX_1_0 = {k: v for k, v in CONSISID_CONFIG.items() if k not in ("is_train_face",)}


def _cogvideox_1_0():
    from diffusers import CogVideoXTransformer3DModel

    torch.manual_seed(0)
    return CogVideoXTransformer3DModel(**COGVIDEOX_1_0).eval()


def _cogvideox_1_0_inputs(rows, cols, frames):
    inputs = cogvideox_inputs(rows, cols, frames=frames)
    inputs["image_rotary_emb"] = pipeline_rotary_emb("CogVideoXPipeline", COGVIDEOX_1_0, frames, rows, cols)
    return inputs


@pytest.mark.parametrize("name", ["cogvideox", "consisid"])
def test_1_0_riflex_on_time_and_ntk_on_the_base_fitted_rows(name):
    """CogVideoX 1.0 / ConsisID at 8 frames and 8 x 8 tokens over 2 frames and the 4 x 4 base grid: rows and columns
    are fitted into the base grid by the pipeline (positions ``0, 0.5, ..., 3.5``: extent 4.5, NTK at 4.5 / 4);
    RIFLEx sets time pair ``k`` to ``0.9 * 2 pi / 8``."""
    model = _cogvideox_1_0() if name == "cogvideox" else CASES["consisid"].model()
    inputs = _cogvideox_1_0_inputs(8, 8, 8) if name == "cogvideox" else consisid_inputs(8, 8, frames=8)
    stock = model(**inputs, return_dict=False)[0]
    riflex = {"type": "riflex", "k": 2, "target_length": 8}
    set_pe(model, "native", extrapolation=model_extrapolation(model, "ntk", (4, 4), time=riflex))
    cos, sin = received_tables(model, inputs)
    positions = positions_fp64(CONSISID_CONFIG, 8, 8, 8)
    assert positions[1][-1] == 3.5  # the pipeline's built-in interpolation into the base grid
    t, h, w = dims(CONSISID_CONFIG)
    time = ladder(t)
    time[1] = 0.9 * 2 * math.pi / 8
    s = 4.5 / 4

    def ntk(d):
        return (THETA * s ** (d / (d - 2))) ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)

    expected = tables_fp64(positions, [time, ntk(h), ntk(w)])
    torch.testing.assert_close(cos.double(), expected[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(sin.double(), expected[1], rtol=0, atol=2e-6)
    with torch.no_grad():
        assert (model(**inputs, return_dict=False)[0] - stock).abs().max() > 1e-4
    restore(model)
    with torch.no_grad():
        assert torch.equal(model(**inputs, return_dict=False)[0], stock)


def test_the_seam_rebuilds_the_pipelines_tables_bit_for_bit():
    """With the training spectrum, the seam's own formula gives the pipeline's tables exactly (1.0 and 1.5 builders,
    grids inside and past the base grid), not only the passed tables handed back."""
    from mmpos.integrations.diffusers.families.base import STOCK

    for config, model, pipeline in [
        (COGVIDEOX_CONFIG, CASES["cogvideox"].model(), "CogVideoXPipeline"),
        (COGVIDEOX_1_0, _cogvideox_1_0(), "CogVideoXImageToVideoPipeline"),
        (CONSISID_CONFIG, CASES["consisid"].model(), "ConsisIDPipeline"),
    ]:
        set_pe(model, "native")
        seam, spec = position_module(model), position_module(model).family.rotary_input
        for frames, rows, cols in [(4, 4, 4), (6, 8, 4), (2, 3, 7)]:
            grid = (frames, rows, cols)
            positions, counts = spec.positions(model.config, grid, torch.device("cpu"))
            ours = spec.build(seam, positions, counts, [STOCK] * 3, None)
            theirs = pipeline_rotary_emb(pipeline, config, frames, rows, cols)
            assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True)), (pipeline, grid)


def test_a_hand_made_table_is_refused_by_name():
    """A RIFLEx patch by hand (a changed time column) or another grid's tables: refused, nothing silently replaced."""
    model = CASES["cogvideox"].model()
    set_pe(model, "native")
    inputs = cogvideox_inputs(4, 4)
    cos, sin = inputs["image_rotary_emb"]
    patched = dict(inputs, image_rotary_emb=(cos.clone(), sin.clone()))
    patched["image_rotary_emb"][0][:, 0:2] = 1.0
    with pytest.raises(ValueError, match=r"image_rotary_emb differs by up to .* get_3d_rotary_pos_embed .*\(4, 4, 4\)"):
        received_tables(model, patched)
    other = dict(inputs, image_rotary_emb=cogvideox_inputs(4, 2)["image_rotary_emb"])
    with pytest.raises(ValueError, match=r"image_rotary_emb has shapes"):
        received_tables(model, other)
    assert received_tables(model, dict(inputs, image_rotary_emb=None)) is None  # no rope: runs as stock


def test_set_pe_adds_the_seam_and_restore_removes_it():
    model = CASES["cogvideox"].model()
    keys = sorted(model.state_dict())
    set_pe(model, "native")
    assert type(position_module(model)).__name__ == "RotaryInputSeam" and sorted(model.state_dict()) == keys
    restore(model)
    assert not hasattr(model, "mmpos_rotary_input") and not model._forward_pre_hooks


# ---- HunyuanDiT ---------------------------------------------------------------------------------------------------
def hunyuandit_positions_fp64(rows, cols, base=4):
    """``HunyuanDiTPipeline``'s positions (square base region, ``linspace(start, stop (n - 1) / n, n)``), written
    from its definition: ``(col, row)`` per token, row-major."""
    (top, left), (bottom, right) = crop_region(rows, cols, base, base)
    row = torch.linspace(top, bottom * (rows - 1) / rows, rows, dtype=torch.float64)
    col = torch.linspace(left, right * (cols - 1) / cols, cols, dtype=torch.float64)
    return col.repeat(rows), row.repeat_interleave(cols)


@pytest.mark.parametrize("rows, cols", [(8, 8), (8, 4)])
def test_hunyuandit_ntk_in_base_units_at_twice_the_rows(rows, cols):
    """Twice the rows of the 4 x 4 base: rows at ``0, 0.5, ..., 3.5`` (extent 4.5: NTK at 4.5 / 4 on the last
    ``D / 2`` channels); columns: the same at 8 x 8, at 8 x 4 fitted to ``1, 1.25, ..., 2.25`` (extent 2.25: stock)."""
    from mmpos.integrations.diffusers.families.tiny import HUNYUANDIT_CONFIG, hunyuandit_inputs

    model = CASES["hunyuandit"].model()
    set_pe(model, "native", extrapolation=model_extrapolation(model, "ntk", (4, 4)))
    inputs = hunyuandit_inputs(rows, cols)
    cos, sin = received_tables(model, inputs)
    col, row = hunyuandit_positions_fp64(rows, cols)
    d = HUNYUANDIT_CONFIG["attention_head_dim"] // 2
    col_extent = float(col.max() - col.min() + 1)
    assert row.max() == 3.5 and col_extent == (4.5 if cols == 8 else 2.25)

    def inv_freq(extent):
        s = max(extent / 4, 1.0)
        return (THETA * s ** (d / (d - 2))) ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)

    phases = [col[:, None] * inv_freq(col_extent)[None], row[:, None] * inv_freq(4.5)[None]]
    for got, fn in ((cos, torch.cos), (sin, torch.sin)):
        expected = torch.cat([fn(p).repeat_interleave(2, dim=1) for p in phases], dim=1)
        torch.testing.assert_close(got.double(), expected, rtol=0, atol=2e-6)
    stock_cos, _ = inputs["image_rotary_emb"]
    assert (cos[:, d:] - stock_cos[:, d:]).abs().max() > 1e-3  # the rows' channels changed
    assert torch.equal(cos[:, :d], stock_cos[:, :d]) == (cols == 4)  # the columns: stock where inside the base


def test_modules_beside_the_transformer_with_rotary_tables_are_refused_by_name():
    """set_pe follows no ControlNet: FLUX.1's, Qwen-Image's and HunyuanDiT's carry their own rotary tables (FLUX.1,
    Qwen-Image: their own position module; HunyuanDiT: the pipeline's tables), so set_pe on them is refused, naming
    the class, instead of changing the transformer's spectrum and not the ControlNet's. LTX-2's text connectors (a
    1D rope over the caption tokens, which keep the training spectrum in every family) likewise."""
    from diffusers import FluxControlNetModel, HunyuanDiT2DControlNetModel, QwenImageControlNetModel
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors

    torch.manual_seed(0)
    controlnets = [
        FluxControlNetModel(**FLUX_CONFIG),  # the tiny transformers' configs
        QwenImageControlNetModel(**QWEN_CONFIG),
        HunyuanDiT2DControlNetModel(
            sample_size=16,
            patch_size=16,
            in_channels=4,
            transformer_num_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            cross_attention_dim=8,
            cross_attention_dim_t5=8,
            pooled_projection_dim=4,
            hidden_size=32,
            text_len=4,
            text_len_t5=4,
        ),
        LTX2TextConnectors(
            caption_channels=16,
            text_proj_in_factor=2,
            video_connector_num_attention_heads=2,
            video_connector_attention_head_dim=8,
            video_connector_num_layers=1,
            video_connector_num_learnable_registers=4,
            audio_connector_num_attention_heads=2,
            audio_connector_attention_head_dim=8,
            audio_connector_num_layers=1,
            audio_connector_num_learnable_registers=4,
            video_hidden_dim=16,
            audio_hidden_dim=16,
        ),
    ]
    for controlnet in controlnets:
        with pytest.raises(TypeError, match=f"got {type(controlnet).__name__}"):
            set_pe(controlnet, "native")


def test_tables_passed_positionally_are_replaced_too():
    """CogVideoX's ``forward(hidden_states, encoder_hidden_states, timestep, timestep_cond, ofs, image_rotary_emb)``
    with everything positional: the same output as by keyword (PI at twice the grid, different from stock)."""
    model = CASES["cogvideox"].model()
    inputs = cogvideox_inputs(8, 8)
    order = ("hidden_states", "encoder_hidden_states", "timestep")
    positional = tuple(inputs[k] for k in order) + (None, None, inputs["image_rotary_emb"])
    with torch.no_grad():
        stock = model(*positional, return_dict=False)[0]
        set_pe(model, "native", extrapolation=model_extrapolation(model, "pi", (4, 4)))
        by_keyword = model(**inputs, return_dict=False)[0]
        assert torch.equal(model(*positional, return_dict=False)[0], by_keyword)
    assert (by_keyword - stock).abs().max() > 1e-4


# ---- Allegro ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["pi", "ntk"])
def test_allegro_at_twice_the_grid_scales_rows_and_cols_in_its_coordinate_units(preset):
    """8 x 8 tokens over a 4 x 4 training grid: positions ``i / 2`` (interpolation_scale 2.0), so the extent is 4
    units over the training 2: PI divides the row and column ladders by 2, NTK sets ``theta * 2 ** (d / (d - 2))``;
    the time table (2 frames, its training extent) and the integer positions stay the caller's."""
    from mmpos.integrations.diffusers.families.tiny import ALLEGRO_CONFIG, allegro_inputs

    model = CASES["allegro"].model()
    set_pe(model, "native", extrapolation=model_extrapolation(model, preset, (4, 4)))
    inputs = allegro_inputs(8, 8)
    (t_table, h_table, w_table), ids = received_tables(model, inputs)
    d = ALLEGRO_CONFIG["attention_head_dim"] // 3
    pos = torch.arange(8, dtype=torch.float64) / 2.0
    if preset == "pi":
        inv = ladder(d) / 2
    else:
        inv = (THETA * 2.0 ** (d / (d - 2))) ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
    phases = pos[:, None] * inv[None]
    for cos, sin in (h_table, w_table):
        torch.testing.assert_close(cos.double(), torch.cat([phases.cos()] * 2, dim=-1), rtol=0, atol=2e-6)
        torch.testing.assert_close(sin.double(), torch.cat([phases.sin()] * 2, dim=-1), rtol=0, atol=2e-6)
    stock_tables, stock_ids = inputs["image_rotary_emb"]
    assert all(torch.equal(a, b) for a, b in zip(t_table, stock_tables[0]))  # time: stock bit for bit
    assert all(a is b for a, b in zip(ids, stock_ids, strict=True))  # the integer positions: passed through
    assert (h_table[0] - stock_tables[1][0]).abs().max() > 0.01


def test_allegro_rebuilds_the_pipelines_tables_bit_for_bit():
    from mmpos.integrations.diffusers.families.base import STOCK
    from mmpos.integrations.diffusers.families.tiny import ALLEGRO_CONFIG, allegro_rotary_emb

    model = CASES["allegro"].model()
    set_pe(model, "native")
    seam, spec = position_module(model), position_module(model).family.rotary_input
    for grid in [(2, 4, 4), (3, 8, 5)]:
        stock = allegro_rotary_emb(ALLEGRO_CONFIG, *grid)
        positions, counts = spec.positions(model.config, grid, torch.device("cpu"))
        tables, _ = spec.build(seam, positions, counts, [STOCK] * 3, stock)
        assert all(torch.equal(a, b) for ours, theirs in zip(tables, stock[0]) for a, b in zip(ours, theirs)), grid


# ---- Cosmos 3 Omni (a position module over a packed sequence; here with the other late-reached families) ------
def test_cosmos3_pi_at_twice_the_grid_on_the_vision_tokens_only():
    """Interleaved MRoPE (pair ``j``: ``h`` if ``j % 3 == 1``, ``w`` if ``j % 3 == 2``, ``t`` otherwise, sections
    (4, 4, 4)) in float64 from the pipeline's position ids: PI at 8 x 8 over 4 x 4 halves the ``h`` and ``w`` pairs of
    the vision tokens; the text tokens and the ``t`` pairs keep the training ladder."""
    from mmpos.integrations.diffusers.families.tiny import COSMOS3_CONFIG, cosmos3_inputs

    model = CASES["cosmos3"].model()
    set_pe(model, "native", extrapolation=model_extrapolation(model, "pi", (4, 4)))
    inputs = cosmos3_inputs(8, 8)
    seen = []
    handle = position_module(model).register_forward_hook(lambda m, a, out: seen.append(out))
    with torch.no_grad():
        model(**inputs, return_dict=False)
    handle.remove()
    cos, sin = (t[0].double() for t in seen[0])  # [N, head_dim]
    d = COSMOS3_CONFIG["head_dim"]
    inv = model.config.rope_theta ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)
    j = torch.arange(d // 2)
    axis = torch.where((j % 3 == 1) & (j < 12), 1, torch.where((j % 3 == 2) & (j < 12), 2, 0))
    pos = inputs["position_ids"].double().T  # [N, 3]
    vision = torch.zeros(pos.shape[0], dtype=torch.bool)
    vision[inputs["vision_sequence_indexes"]] = True
    scale = torch.where(vision[:, None] & (axis[None] > 0), 0.5, 1.0)
    phases = pos[:, axis] * inv[None] * scale
    # atol: float32 phases of the text and time ids past 15000 (the modality margin) round at about 1e-3
    torch.testing.assert_close(cos, torch.cat([phases.cos()] * 2, dim=-1), rtol=0, atol=5e-3)
    torch.testing.assert_close(sin, torch.cat([phases.sin()] * 2, dim=-1), rtol=0, atol=5e-3)
    halved = (phases - pos[:, axis] * inv[None]).abs()
    assert halved[vision].max() > 0.5 and halved[~vision].max() == 0


def test_easyanimate_riflex_on_time_and_ntk_on_the_base_fitted_rows():
    """EasyAnimate's own rope module (CogVideoX 1.0's builder, base 60/15 x 90/15 = 4 x 6): at 8 frames and 8 x 12
    tokens rows sit at ``0, 0.5, ..., 3.5`` and columns at ``0, 0.5, ..., 5.5`` (extents 4.5 and 6.5: NTK at 4.5 / 4
    and 6.5 / 6); RIFLEx sets time pair ``k = 2`` to ``0.9 * 2 pi / 8``."""
    from mmpos.integrations.diffusers.families.tiny import easyanimate_inputs

    model = CASES["easyanimate"].model()
    riflex = {"type": "riflex", "k": 2, "target_length": 8}
    set_pe(model, "native", extrapolation=model_extrapolation(model, "ntk", (4, 6), time=riflex))
    seen = []
    handle = position_module(model).register_forward_hook(lambda m, a, out: seen.append(out))
    with torch.no_grad():
        model(**easyanimate_inputs(8, 12, frames=8), return_dict=False)
    handle.remove()
    cos, sin = seen[0]
    config = {"patch_size": 15, "sample_height": 60, "sample_width": 90}
    positions = positions_fp64(config, 8, 8, 12)
    assert positions[1][-1] == 3.5 and positions[2][-1] == 5.5
    t, h, w = dims({"attention_head_dim": 16})
    time = ladder(t)
    time[1] = 0.9 * 2 * math.pi / 8

    def ntk(d, s):
        return (THETA * s ** (d / (d - 2))) ** -(torch.arange(0, d, 2, dtype=torch.float64) / d)

    expected = tables_fp64(positions, [time, ntk(h, 4.5 / 4), ntk(w, 6.5 / 6)])
    torch.testing.assert_close(cos.double(), expected[0], rtol=0, atol=2e-6)
    torch.testing.assert_close(sin.double(), expected[1], rtol=0, atol=2e-6)


# ---- Lumina-Next ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("t", [0.5, 1.0])  # the pipeline's PI branch (t < scaling_watershed) and its NTK branch
def test_lumina_next_pi_takes_the_place_of_the_pipelines_scaling(t):
    """At 8 x 8 tokens over the 4 x 4 training grid the pipeline passes its PI (or NTK) table at ``s = 2``; with
    ``set_pe(..., "pi")`` the model reads ``polar(1, p w / 2)`` on the plain ladder (float64 here), pairs alternating
    row and column, whichever branch the pipeline took."""
    from mmpos.integrations.diffusers.families.tiny import lumina_next_inputs, lumina_next_rotary_emb

    model = CASES["lumina_next"].model()
    set_pe(model, "native", extrapolation=model_extrapolation(model, "pi", (4, 4)))
    inputs = dict(lumina_next_inputs(8, 8, sigma=1.0 - t), image_rotary_emb=lumina_next_rotary_emb(8, 8, t))
    table = received_tables(model, inputs)[:8, :8]
    d = 8  # channels per axis
    inv = ladder(d) / 2
    pos = torch.arange(8, dtype=torch.float64)
    rows = (pos[:, None] * inv[None])[:, None, :].expand(8, 8, -1)
    cols = (pos[:, None] * inv[None])[None, :, :].expand(8, 8, -1)
    phases = torch.stack([rows, cols], dim=-1).flatten(2)  # [r0 c0 r1 c1 ...]
    torch.testing.assert_close(
        table.to(torch.complex128), torch.polar(torch.ones_like(phases), phases), rtol=0, atol=2e-6
    )
    pipelines = inputs["image_rotary_emb"][:8, :8]
    assert ((table - pipelines).abs().max() < 1e-5) == (t < 1.0)  # the pipeline's own PI branch: the same table


def test_lumina_next_refuses_a_table_of_another_size():
    """The pipeline's table for 4 x 4 tokens handed to a forward at 8 x 8 (another scale): refused by name."""
    from mmpos.integrations.diffusers.families.tiny import lumina_next_inputs, lumina_next_rotary_emb

    model = CASES["lumina_next"].model()
    set_pe(model, "native")
    inputs = dict(lumina_next_inputs(8, 8), image_rotary_emb=lumina_next_rotary_emb(4, 4, 0.5))
    with pytest.raises(ValueError, match=r"image_rotary_emb differs by up to .*get_2d_rotary_pos_embed_lumina"):
        received_tables(model, inputs)


def test_the_hook_registry_installs_and_removes_the_added_seam():
    """``apply_pe`` (diffusers' hook registry) with another theta changes the output; removing the hook takes the
    added seam and its pre-forward hook off: the stock output bit for bit."""
    from diffusers.hooks import HookRegistry

    from mmpos.integrations.diffusers.hooks import PEConfig, apply_pe

    model = CASES["cogvideox"].model()
    inputs = cogvideox_inputs(8, 8)
    with torch.no_grad():
        stock = model(**inputs, return_dict=False)[0]
        apply_pe(model, PEConfig("native", options={"theta": 500.0}))
        assert (model(**inputs, return_dict=False)[0] - stock).abs().max() > 1e-3
        HookRegistry.check_if_exists_or_initialize(model).remove_hook("mmpos_pe")
        assert torch.equal(model(**inputs, return_dict=False)[0], stock)
    assert not hasattr(model, "mmpos_rotary_input") and not model._forward_pre_hooks
