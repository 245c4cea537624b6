"""The video families' tables against their own formulas (float64, written here from the stock modules' maths):
LTX-2's video and audio tables (both ``rope_type`` layouts). Extrapolation at twice the grid (PI), DyPE through
NTK at 2x (``theta * s ** (kappa d / (d - 2))`` with ``kappa = 2 sigma ** 2``), what stays stock (the cross-modal
tables, the axes at their training extent)."""

import math

import pytest
import torch

from mmpos.integrations.diffusers import model_extrapolation, position_module, restore, set_pe
from mmpos.integrations.diffusers.families.tiny import CASES, ltx2_inputs, tiny_cosmos, tiny_ltx2


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def run_all(model, inputs):
    """Every output of the forward (LTX-2: video and audio)."""
    with torch.no_grad():
        return model(**inputs, return_dict=False)


# ---- LTX-2 ------------------------------------------------------------------------------------------------------
def ltx2_phases(positions, base, count, theta=10000.0, divide=None):
    """float64 ``[B, S, A, F]`` phases ``w_j / divide[a, j] * (2 g - 1)``, ``g = position / base[a]``,
    ``w_j = pi / 2 * theta ** (j / (F - 1))``."""
    w = math.pi / 2 * theta ** torch.linspace(0, 1, count, dtype=torch.float64)
    g = positions.double().transpose(1, 2) / torch.tensor(base, dtype=torch.float64)  # [B, S, A]
    freqs = w if divide is None else w / divide
    return (2 * g - 1)[..., None] * freqs


def midpoints(coords):
    return coords.double().mean(dim=-1) if coords.ndim == 4 else coords.double()


def ltx2_pairs(cos, num_axes, count):
    """An interleaved table ``[B, S, D]`` -> its per-axis pair values ``[B, S, A, F]`` (padding and repeats dropped)."""
    pad = cos.shape[-1] % (2 * num_axes)
    return cos[..., pad::2].unflatten(-1, (count, num_axes)).transpose(-1, -2).double()


@pytest.mark.parametrize("rope_type", ["interleaved", "split"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ltx2_native_is_stock_on_video_and_audio(rope_type, dtype):
    torch.manual_seed(0)
    model = tiny_ltx2(rope_type=rope_type).eval().to(dtype)
    inputs = {
        k: v.to(dtype) if torch.is_tensor(v) and k.endswith("states") else v for k, v in ltx2_inputs(4, 4).items()
    }
    stock = run_all(model, inputs)
    set_pe(model, "native")
    assert type(model.audio_rope).__name__ == "LTX2AudioSeam"
    for ours, expected in zip(run_all(model, inputs), stock, strict=True):
        assert torch.equal(ours, expected)
    restore(model)
    assert type(model.audio_rope).__name__ == "LTX2AudioVideoRotaryPosEmbed"
    for ours, expected in zip(run_all(model, inputs), stock, strict=True):
        assert torch.equal(ours, expected)


def _ltx2_video_coords(model, rows, cols, frames=2):
    return model.rope.stock[0].prepare_video_coords(1, frames, rows, cols, torch.device("cpu"), fps=24.0)


def test_ltx2_position_interpolation_at_twice_the_grid_divides_rows_and_cols():
    model = CASES["ltx2"].model()
    set_pe(model, "native", extrapolation=model_extrapolation(model, "pi", (4, 4)))
    coords = _ltx2_video_coords(model, 8, 8)
    cos, _ = position_module(model)(coords)
    count = model.rope.axes_dims[0] // 2
    divide = torch.tensor([1.0, 2.0, 2.0], dtype=torch.float64)[:, None]  # time at its training extent: stock
    expected = ltx2_phases(midpoints(coords), (20.0, 2048.0, 2048.0), count, divide=divide).cos()
    got = ltx2_pairs(cos, 3, count)
    assert torch.allclose(got, expected, atol=2e-3)
    stock = ltx2_pairs(model.rope.stock[0](coords)[0], 3, count)
    assert torch.equal(got[:, :, 0], stock[:, :, 0])  # the time axis: stock bit for bit
    assert (got[:, :, 1:] - stock[:, :, 1:]).abs().max() > 0.1


@pytest.mark.parametrize("sigma", [1.0, 0.5])
def test_ltx2_dype_ntk_at_twice_the_grid_follows_sigma(sigma):
    """NTK at ``s ** kappa`` on the plain ladder of ``2 F`` channels, ``theta ** (F / (F - 1))``: stock frequency ``w_j``
    is divided by ``s ** (kappa (F - 1 - j) / (F - 1))`` (the lowest by ``s ** kappa``, the highest kept)."""
    model = CASES["ltx2"].model()
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype_ntk", (4, 4)))
    inputs = ltx2_inputs(8, 8, sigma=sigma)
    with torch.no_grad():
        model(**inputs, return_dict=False)  # the pre-forward hook sets the step's sigma
    coords = _ltx2_video_coords(model, 8, 8)
    cos, sin = position_module(model)(coords)
    count = model.rope.axes_dims[0] // 2
    kappa = 2.0 * sigma**2
    j = torch.arange(count, dtype=torch.float64)
    divide = torch.stack(
        [torch.ones(count, dtype=torch.float64)] + [2.0 ** (kappa * (count - 1 - j) / (count - 1))] * 2
    )
    expected = ltx2_phases(midpoints(coords), (20.0, 2048.0, 2048.0), count, divide=divide)
    assert torch.allclose(ltx2_pairs(cos, 3, count), expected.cos(), atol=2e-3)
    assert torch.allclose(ltx2_pairs(sin, 3, count), expected.sin(), atol=2e-3)


def test_ltx2_audio_axis_extrapolates_its_own_table_only():
    """An extrapolation entry on the family's fourth axis (audio) changes the audio table (PI at 12 tokens over 6);
    the video table and the cross-modal tables stay stock."""
    case = CASES["ltx2"]
    model = case.model()
    inputs = ltx2_inputs(*case.grid, audio_frames=12)
    stock = run_all(model, inputs)
    set_pe(
        model, "native", extrapolation=[None, None, None, {"type": "schedule", "method": "pi", "original_length": 6}]
    )
    audio_stock = model.audio_rope.stock[0]
    coords = audio_stock.prepare_audio_coords(1, 12, torch.device("cpu"))
    cos, _ = model.audio_rope(coords)
    count = model.rope.axes_dims[3] // 2
    expected = ltx2_phases(midpoints(coords), (20.0,), count, divide=torch.full((1, count), 2.0, dtype=torch.float64))
    assert torch.allclose(ltx2_pairs(cos, 1, count), expected.cos(), atol=2e-3)
    video_coords = _ltx2_video_coords(model, *case.grid)
    assert torch.equal(position_module(model)(video_coords)[0], model.rope.stock[0](video_coords)[0])
    assert type(model.cross_attn_rope).__name__ == "LTX2AudioVideoRotaryPosEmbed"  # stock: cross-modal time scale
    changed = run_all(model, inputs)
    assert all((a - b).abs().max() > 1e-6 for a, b in zip(changed, stock))


def test_ltx2_split_layout_extrapolates_per_head():
    """``rope_type="split"``: ``[B, heads, S, dim / (2 heads)]``, the padding pairs first; PI at 2x on the split table
    equals the interleaved table's pairs (the same phases in another layout)."""
    tables = {}
    for rope_type in ("interleaved", "split"):
        torch.manual_seed(0)
        model = tiny_ltx2(rope_type=rope_type).eval()
        set_pe(model, "native", extrapolation=model_extrapolation(model, "pi", (4, 4)))
        tables[rope_type] = position_module(model)(_ltx2_video_coords(model, 8, 8))
    count = 5
    cos_split = tables["split"][0]  # [1, 2, S, 8]: 1 padding pair, then 15 pairs (5 frequencies x 3 axes)
    assert cos_split.shape == (1, 2, 128, 8)
    pairs = cos_split.transpose(1, 2).flatten(2)[..., 1:]
    assert torch.equal(pairs, tables["interleaved"][0][..., 2::2])
    assert torch.equal(cos_split.transpose(1, 2).flatten(2)[..., :1], torch.ones(1, 128, 1))
    assert ltx2_pairs(tables["interleaved"][0], 3, count).shape == (1, 128, 3, count)


# ---- MiniMax H3 -------------------------------------------------------------------------------------------------
def half_table(pos, inv_freqs):
    """float64 ``(cos, sin)`` ``[S, 6F]``: per axis ``pos[:, a] * inv_freqs[a]``, ``cat(t, h, w)`` twice."""
    phases = torch.cat([pos[:, a : a + 1].double() * inv for a, inv in enumerate(inv_freqs)], dim=-1)
    phases = torch.cat([phases, phases], dim=-1)
    return phases.cos(), phases.sin()


@pytest.mark.parametrize("sigma", [1.0, 0.5])
def test_minimax_h3_dype_ntk_on_the_video_rows_only(sigma):
    """At twice the grid (8 distinct row and column positions over the trained 4, the same normalised span), DyPE-NTK
    gives the video rows ``theta * 2 ** (kappa d / (d - 2))`` on rows and columns (``kappa = 2 sigma ** 2``); text and
    audio rows keep the stock table bit for bit."""
    case = CASES["minimax_h3"]
    model = case.model()
    inputs = case.inputs(8, 8, sigma=sigma)
    stock_table = model.rope(inputs["position_ids"])
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype_ntk", case.grid))
    with torch.no_grad():
        model(**inputs, return_dict=False)
    assert position_module(model).encodings[0].step.sigma == pytest.approx(sigma)
    cos, sin = position_module(model)(inputs["position_ids"])
    d = 2 * model.config.rope_freq_dim
    plain = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ntk = (10000.0 * 2.0 ** (2 * sigma**2 * d / (d - 2))) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    expected_cos, expected_sin = half_table(inputs["position_ids"], [plain, ntk, ntk])
    video = inputs["token_tags"] == 0
    assert torch.allclose(cos[video].double(), expected_cos[video], atol=1e-5)
    assert torch.allclose(sin[video].double(), expected_sin[video], atol=1e-5)
    assert (cos[video] - stock_table[0][video]).abs().max() > 0.01
    assert torch.equal(cos[~video], stock_table[0][~video]) and torch.equal(sin[~video], stock_table[1][~video])


def test_minimax_h3_position_interpolation_at_twice_the_grid():
    case = CASES["minimax_h3"]
    model = case.model()
    position_ids = case.inputs(8, 8)["position_ids"]
    set_pe(model, "native", extrapolation=model_extrapolation(model, "pi", case.grid))
    with torch.no_grad():
        model(**case.inputs(8, 8), return_dict=False)  # records the video rows
    cos, _ = position_module(model)(position_ids)
    d = 2 * model.config.rope_freq_dim
    plain = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    expected_cos, _ = half_table(position_ids, [plain, plain / 2, plain / 2])
    video = case.inputs(8, 8)["token_tags"] == 0
    assert torch.allclose(cos[video].double(), expected_cos[video], atol=1e-5)


def test_minimax_h3_reads_sigma_from_one_minus_the_noisiest_timestep():
    """``timestep`` holds the sequence's distinct values ``1 - sigma``, sorted: conditioning rows pinned near clean
    (0.95) do not hide the target's sigma (0.7)."""
    case = CASES["minimax_h3"]
    model = case.model()
    inputs = case.inputs(*case.grid)
    inputs.update(timestep=torch.tensor([0.3, 0.95]))
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype", case.grid))
    with torch.no_grad():
        model(**inputs, return_dict=False)
    assert position_module(model).encodings[0].step.sigma == pytest.approx(0.7)


# ---- Helios -----------------------------------------------------------------------------------------------------
def helios_table(frame_indices, height, width, inv_freqs):
    """float64 ``[B, 2 sum(d), T, H, W]``: per axis ``inv[d] * grid`` with pairs repeated, ``[cos t y x, sin t y x]``."""
    t = frame_indices.double()[:, :, None, None].expand(-1, -1, height, width)
    y = torch.arange(height, dtype=torch.float64)[None, None, :, None].expand_as(t)
    x = torch.arange(width, dtype=torch.float64)[None, None, None, :].expand_as(t)
    phases = [
        torch.einsum("d,bthw->bdthw", inv, grid).repeat_interleave(2, dim=1) for inv, grid in zip(inv_freqs, (t, y, x))
    ]
    return torch.cat([p.cos() for p in phases] + [p.sin() for p in phases], dim=1)


def ladder64(dim, theta=10000.0):
    return theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


@pytest.mark.parametrize("sigma", [1.0, 0.5])
def test_helios_dype_ntk_gives_the_chunk_and_every_history_table_one_spectrum(sigma):
    """DyPE-NTK at twice the trained grid: rows and columns at ``theta * 2 ** (kappa d / (d - 2))``, ``kappa = 2 sigma
    ** 2``, on the chunk's table and on the short / mid / long history tables alike (time at its trained span)."""
    case = CASES["helios"]
    model = case.model()
    rows, cols = (2 * n for n in case.grid)
    inputs = case.inputs(rows, cols, sigma=sigma)
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype_ntk", case.grid))
    with torch.no_grad():
        model(**inputs, return_dict=False)  # sets the step's sigma and the forward's extents
    seam = position_module(model)
    assert seam.encodings[0].step.extents == [9.0, rows, cols]  # 4 + 2 + 1 history frames and 2 chunk frames
    d = 4
    ntk = (10000.0 * 2.0 ** (2 * sigma**2 * d / (d - 2))) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    stock = model.rope.stock[0]
    for name in ("indices_hidden_states", "indices_latents_history_short", "indices_latents_history_long"):
        table = seam(inputs[name], rows, cols, torch.device("cpu"))
        expected = helios_table(inputs[name], rows, cols, [ladder64(d), ntk, ntk])
        assert torch.allclose(table.double(), expected, atol=1e-5), name
        assert (table - stock(inputs[name], rows, cols, torch.device("cpu"))).abs().max() > 1e-3


def test_helios_time_policy_spans_the_history_window():
    """NTK on time at factor 2 (``model_extrapolation(..., time=...)``): the time channels of every table follow
    ``theta * 2 ** (d / (d - 2))``, rows and columns (at their trained size) stay stock bit for bit."""
    case = CASES["helios"]
    model = case.model()
    inputs = case.inputs(*case.grid)
    set_pe(
        model, "native", extrapolation=model_extrapolation(model, "none", case.grid, time={"type": "ntk", "factor": 2})
    )
    seam = position_module(model)
    stock = model.rope.stock[0]
    d = 4
    ntk = (10000.0 * 2.0 ** (d / (d - 2))) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rows, cols = case.grid
    for name in ("indices_hidden_states", "indices_latents_history_mid"):
        table = seam(inputs[name], rows, cols, torch.device("cpu"))
        expected = helios_table(inputs[name], rows, cols, [ntk, ladder64(d), ladder64(d)])
        assert torch.allclose(table.double(), expected, atol=1e-5)
        spatial = [*range(4, 12), *range(16, 24)]  # cos y x, sin y x
        assert torch.equal(table[:, spatial], stock(inputs[name], rows, cols, torch.device("cpu"))[:, spatial])


# ---- Cosmos / Anima ---------------------------------------------------------------------------------------------
def run(model, inputs):
    return run_all(model, inputs)[0]


def cosmos_table(sizes, inv_freqs, time_scale=1.0):
    """float64 ``(cos, sin)`` ``[T H W, sum(d)]``: ``cat([t, h, w] * 2)`` of ``outer(position, inv)`` per axis."""
    grids = torch.meshgrid(*[torch.arange(n, dtype=torch.float64) for n in sizes], indexing="ij")
    grids = [grids[0] * time_scale, grids[1], grids[2]]
    phases = torch.cat([g.reshape(-1, 1) * inv for g, inv in zip(grids, inv_freqs)], dim=-1)
    phases = torch.cat([phases, phases], dim=-1)
    return phases.cos(), phases.sin()


def test_cosmos_fps_modulation_off_is_the_reference_convention():
    """diffusers#14768: ``fps_modulation="off"`` ignores ``fps`` (time positions are frame indices), so the model with
    ``fps=16`` computes what the stock model computes without ``fps``; the default keeps the stock modulation."""
    case = CASES["cosmos"]
    model = case.model()
    inputs = case.inputs(*case.grid)
    modulated = run(model, inputs)
    unmodulated = run(model, {**inputs, "fps": None})
    assert (modulated - unmodulated).abs().max() > 1e-4  # 16 fps: the time phases turn 1.5x faster
    set_pe(model, "native", fps_modulation="off")
    assert torch.equal(run(model, inputs), unmodulated)
    set_pe(model, "native")
    assert position_module(model).fps_modulation == "stock"
    assert torch.equal(run(model, inputs), modulated)


def test_cosmos_refuses_an_unknown_fps_modulation_by_name():
    model = CASES["cosmos"].model()
    with pytest.raises(ValueError, match=r"fps_modulation='reference'; expected one of \['stock', 'off'\]"):
        set_pe(model, "native", fps_modulation="reference")
    with pytest.raises(TypeError, match=r"its own \['fps_modulation'\]"):
        set_pe(model, "native", fps_scale=1.0)
    flux = CASES["flux"].model()
    with pytest.raises(TypeError, match="spectrum options"):
        set_pe(flux, "native", fps_modulation="off")


@pytest.mark.parametrize("sigma", [1.0, 0.5])
def test_cosmos_dype_ntk_on_top_of_the_built_in_ntk(sigma):
    """Anima's rows and columns are already NTK-scaled (``theta_a = 10000 * 4 ** (d / (d - 2))``); DyPE-NTK at twice
    the grid scales that base again by ``2 ** (kappa d / (d - 2))``; time (16 fps: positions ``1.5 t``) stays stock."""
    case = CASES["cosmos"]
    model = case.model()
    rows, cols = (2 * n for n in case.grid)
    inputs = case.inputs(rows, cols, sigma=sigma)
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype_ntk", case.grid))
    with torch.no_grad():
        model(**inputs, return_dict=False)
    cos, sin = position_module(model)(inputs["hidden_states"], fps=16)
    d = 8
    steps = torch.arange(0, d, 2, dtype=torch.float64) / d
    built_in = 10000.0 * 4.0 ** (d / (d - 2))
    dype = (built_in * 2.0 ** (2 * sigma**2 * d / (d - 2))) ** -steps
    expected_cos, expected_sin = cosmos_table((2, rows, cols), [10000.0**-steps, dype, dype], time_scale=24 / 16)
    assert torch.allclose(cos.double(), expected_cos, atol=1e-5) and torch.allclose(
        sin.double(), expected_sin, atol=1e-5
    )
    stock_cos, _ = model.rope.stock[0](inputs["hidden_states"], fps=16)
    assert (cos - stock_cos).abs().max() > 1e-3


def test_cosmos_grid_past_max_size_runs_as_a_stock_model_with_a_larger_max_size():
    """The stock module slices ``arange(max(max_size) / patch)`` positions (16 here): a 20-token-wide grid fails; the
    seam gives what a stock model with a larger ``max_size`` gives."""
    case = CASES["cosmos"]
    model = case.model()
    inputs = case.inputs(4, 20)
    with pytest.raises(RuntimeError):
        run(model, inputs)
    reference = tiny_cosmos(max_size=(4, 64, 64)).eval()
    reference.load_state_dict(model.state_dict())
    set_pe(model, "native")
    assert torch.equal(run(model, inputs), run(reference, inputs))


def test_cosmos_1_0_with_its_learnable_embedding_is_stock():
    """Cosmos 1.0's config (``rope_scale=(2, 1, 1)``, the learnable absolute embedding kept stock)."""
    torch.manual_seed(0)
    model = tiny_cosmos(rope_scale=(2.0, 1.0, 1.0), extra_pos_embed_type="learnable").eval()
    inputs = CASES["cosmos"].inputs(4, 4, fps=30)
    stock = run(model, inputs)
    set_pe(model, "native")
    assert torch.equal(run(model, inputs), stock)
