"""What the suite cannot see in the latent-grid families (HunyuanVideo 1.0 / 1.5, SkyReels-V2, CogView4): the time
axis' own policy, grids beyond SkyReels' precomputed buffers, per-frame timesteps, the tables following a dtype
cast, CogView4's normalised positions and its schedule scale from token counts. References in float64 math."""

import math

import pytest
import torch

from mmpos.integrations.diffusers import model_extrapolation, position_module, set_pe
from mmpos.integrations.diffusers.families.tiny import CASES, COGVIEW4_CONFIG, SKYREELS_V2_CONFIG


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def ladder64(dim, theta):
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def repeated(phases):
    """``[S, d / 2]`` phases -> ``(cos, sin)`` ``[S, d]`` with each pair's value repeated."""
    return phases.cos().repeat_interleave(2, -1), phases.sin().repeat_interleave(2, -1)


@pytest.mark.parametrize("family", ["hunyuan_video15", "hunyuan_video", "skyreels_v2"])
def test_riflex_on_the_time_axis_changes_only_the_time_channels(family):
    case = CASES[family]
    model = case.model()
    latents = case.inputs(*case.grid)["hidden_states"]
    stock = model.rope(latents)
    time = {"type": "riflex", "k": 1, "target_length": 4}
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype", case.grid, time=time))
    cos, sin = position_module(model)(latents)
    t_dim = position_module(model).axes_dims[0]
    frames = latents.shape[2]
    rows_per_frame = cos.reshape(frames, -1, cos.shape[-1])
    theta = 10000.0 if family == "skyreels_v2" else 256.0
    t = torch.arange(frames, dtype=torch.float64)[:, None]
    riflex = 0.9 * 2 * math.pi / 4  # RIFLEx: pair k = 1 completes 0.9 periods over target_length frames
    expected_cos, _ = repeated(torch.cat([t * riflex, t * ladder64(t_dim, theta)[1:]], dim=1))
    got = rows_per_frame[..., :t_dim].double()
    assert torch.allclose(got, expected_cos[:, None].expand_as(got), atol=1e-6)
    # image channels: the training grid, so the schedule leaves them stock bit for bit
    stock_cos = stock[0].reshape(cos.shape)
    assert torch.equal(cos[..., t_dim:], stock_cos[..., t_dim:])
    assert not torch.equal(cos[..., :t_dim], stock_cos[..., :t_dim])


def test_skyreels_grid_beyond_the_precomputed_buffers_just_works():
    case = CASES["skyreels_v2"]
    model = case.model()
    limit = SKYREELS_V2_CONFIG["rope_max_seq_len"]
    latents = torch.zeros(1, 4, 1, 2, 2 * (limit + 8))  # 1 x 1 x (limit + 8) tokens: past the buffers' rows
    with pytest.raises(RuntimeError):
        model.rope(latents)  # the stock module slices its buffers and cannot reshape
    set_pe(model, "native")
    cos, sin = position_module(model)(latents)
    t_dim, h_dim, w_dim = position_module(model).axes_dims
    cols = torch.arange(limit + 8, dtype=torch.float64)
    expected_cos, expected_sin = repeated(cols[:, None] * ladder64(w_dim, 10000.0))
    assert cos.shape == (1, limit + 8, 1, t_dim + h_dim + w_dim) and cos.dtype == torch.float32
    assert torch.allclose(cos[0, :, 0, -w_dim:].double(), expected_cos, atol=1e-6)
    assert torch.allclose(sin[0, :, 0, -w_dim:].double(), expected_sin, atol=1e-6)


def test_skyreels_tables_follow_a_cast_after_set_pe():
    """The stock buffers follow ``model.to(dtype)``; so must the seam's tables (a probe buffer carries the dtype)."""
    case = CASES["skyreels_v2"]
    stock_model = case.model().to(torch.bfloat16)
    latents = case.inputs(*case.grid)["hidden_states"].bfloat16()
    stock = stock_model.rope(latents)
    model = case.model()
    set_pe(model, "native")
    model.to(torch.bfloat16)
    ours = position_module(model)(latents)
    assert ours[0].dtype == torch.bfloat16
    assert torch.equal(ours[0], stock[0]) and torch.equal(ours[1], stock[1])


def test_skyreels_diffusion_forcing_reads_sigma_from_the_noisiest_frame():
    case = CASES["skyreels_v2"]
    model = case.model()
    inputs = case.inputs(*case.grid)
    inputs.update(timestep=torch.tensor([[0.0, 700.0]]), enable_diffusion_forcing=True)  # first frame clean
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype", case.grid))
    with torch.no_grad():
        model(**inputs, return_dict=False)
    assert position_module(model).encodings[0].step.sigma == pytest.approx(0.7)


def cogview4_reference(rows, cols, extent, inv_freq_rows, inv_freq_cols):
    """float64 ``(cos, sin)`` of rows at ``floor(i * extent / rows)`` (cols alike), half layout ``[h w h w]``."""
    pos_r = torch.floor(torch.arange(rows, dtype=torch.float64) * extent / rows)
    pos_c = torch.floor(torch.arange(cols, dtype=torch.float64) * extent / cols)
    ph_r = (pos_r[:, None] * inv_freq_rows)[:, None].expand(rows, cols, -1)
    ph_c = (pos_c[:, None] * inv_freq_cols)[None].expand(rows, cols, -1)
    phases = torch.cat([ph_r, ph_c], -1).reshape(rows * cols, -1)
    phases = torch.cat([phases, phases], -1)
    return phases.cos(), phases.sin()


@pytest.mark.parametrize("rows, cols", [(4, 4), (6, 5), (8, 8)])
def test_cogview4_native_positions_are_normalised_to_the_fixed_extent(rows, cols):
    case = CASES["cogview4"]
    model = case.model()
    set_pe(model, "native")
    cos, sin = position_module(model)(torch.zeros(1, 4, 2 * rows, 2 * cols))
    extent, dim = COGVIEW4_CONFIG["rope_axes_dim"][0], COGVIEW4_CONFIG["attention_head_dim"] // 2
    expected = cogview4_reference(rows, cols, extent, ladder64(dim, 10000.0), ladder64(dim, 10000.0))
    assert cos.device.type == "cpu" and cos.dtype == torch.float32
    assert torch.allclose(cos.double(), expected[0], atol=1e-6) and torch.allclose(sin.double(), expected[1], atol=1e-6)


def test_cogview4_schedule_scale_comes_from_token_counts():
    """At twice the trained token counts, "pi" divides the frequencies by 2 (the token-count ratio) on top of the
    stock normalised positions; read from the positions' extent (16 at every size) the ratio would be 4."""
    case = CASES["cogview4"]
    model = case.model()
    rows, cols = (2 * n for n in case.grid)
    set_pe(model, "native", extrapolation=model_extrapolation(model, "pi", case.grid))
    cos, sin = position_module(model)(torch.zeros(1, 4, 2 * rows, 2 * cols))
    extent, dim = COGVIEW4_CONFIG["rope_axes_dim"][0], COGVIEW4_CONFIG["attention_head_dim"] // 2
    halved = ladder64(dim, 10000.0) / 2
    expected = cogview4_reference(rows, cols, extent, halved, halved)
    assert torch.allclose(cos.double(), expected[0], atol=1e-6) and torch.allclose(sin.double(), expected[1], atol=1e-6)
