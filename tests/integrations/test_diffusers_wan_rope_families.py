"""The families of Wan's rope (``families/wan.py``: Wan, Wan VACE, Wan Animate, ChronoEdit, SANA-Video; SkyReels-V2's
rope is Wan's too): at twice the training grid, YaRN, NTK and DyPE give the Wan table formula (fp64 ``cos / sin`` of
position x frequency, each pair's value twice, axes ``(t, row, col)`` time slowest) at the preset's frequencies on
the image axes, the stock time channels bit for bit; ChronoEdit's two-frame time positions; what the suite cannot
see. Frequencies: NTK's closed form, transformers' YaRN, DyPE's vision-YaRN policy at sigma 1 (``mmpos.spectrum``,
matched to the DyPE authors' code in ``tests/encodings``)."""

import pytest
import torch

from mmpos.integrations.diffusers import model_extrapolation, position_module, set_pe
from mmpos.integrations.diffusers.families import family_for_pipeline, get_family
from mmpos.integrations.diffusers.families.tiny import CASES
from mmpos.spectrum.schedule import ExtrapolationSchedule

WAN_ROPE = ["wan", "wan_vace", "wan_animate", "chronoedit", "sana_video", "skyreels_v2"]
THETA = 10000.0


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def tables_of(module, model, inputs):
    """The ``(cos, sin)`` ``[1, L, 1, D]`` that ``module`` (the model's position module) returned in one forward."""
    outs = []
    handle = module.register_forward_hook(lambda m, a, o: outs.append(o))
    with torch.no_grad():
        model(**inputs, return_dict=False)
    handle.remove()
    (out,) = outs
    return out


def ladder(dim):
    return THETA ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def transformers_yarn(dim, factor, original):
    """transformers' YaRN frequencies and attention scaling for one axis of ``dim`` channels."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    parameters = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original}
    config = LlamaConfig(
        hidden_size=2 * dim,
        num_attention_heads=2,
        head_dim=dim,
        max_position_embeddings=int(original * factor),
        rope_parameters={**parameters, "rope_theta": THETA},
    )
    rotary = LlamaRotaryEmbedding(config)
    return rotary.inv_freq.double(), float(rotary.attention_scaling)


def image_axis_frequencies(preset, dim, trained, extent):
    """One image axis' ``(inv_freq [dim / 2] float64, magnitude)`` under ``preset`` at ``extent`` tokens, sigma 1."""
    scale = extent / trained
    if preset == "ntk":  # theta' = theta * s^(d / (d - 2))
        return (THETA * scale ** (dim / (dim - 2))) ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim), 1.0
    if preset == "yarn":
        return transformers_yarn(dim, scale, trained)
    policy = ExtrapolationSchedule("vision_yarn", float(trained), dynamic=True).policy(float(extent), 1.0)
    inv_freq, magnitude = policy.frequencies(dim, THETA)
    return inv_freq.double(), float(magnitude)


def wan_formula(times, rows, cols, axes, frequencies):
    """fp64 ``(cos, sin)`` ``[L, D]``: per axis ``m cos(p w)``, ``m sin(p w)`` each pair's value twice, (t, row, col)
    with time slowest."""
    grid = torch.cartesian_prod(times.double(), torch.arange(rows).double(), torch.arange(cols).double())
    cos, sin = [], []
    for axis, (inv_freq, magnitude) in enumerate(frequencies):
        phase = grid[:, axis, None] * inv_freq[None]
        cos.append((magnitude * phase.cos()).repeat_interleave(2, dim=1))
        sin.append((magnitude * phase.sin()).repeat_interleave(2, dim=1))
    return torch.cat(cos, -1), torch.cat(sin, -1)


def latent_grid(model, inputs):
    frames, height, width = inputs["hidden_states"].shape[2:]
    p_t, p_h, p_w = model.config.patch_size
    return frames // p_t, height // p_h, width // p_w


def time_positions(family, frames):
    if family == "chronoedit" and frames == 2:  # ChronoEdit's rope: the image and its edit at 0 and skip - 1
        return torch.tensor([0.0, 7.0])  # temporal_skip_len 8 (the default), rope_max_seq_len 32
    return torch.arange(frames).double()


@pytest.mark.parametrize("preset", ["yarn", "ntk", "dype"])
@pytest.mark.parametrize("family", WAN_ROPE)
def test_extrapolation_at_twice_the_grid_is_the_wan_formula(family, preset):
    case = CASES[family]
    model = case.model()
    rows, cols = (2 * n for n in case.grid)
    inputs = case.inputs(rows, cols, sigma=1.0)
    stock_cos, stock_sin = tables_of(model.rope, model, inputs)
    set_pe(model, "native", extrapolation=model_extrapolation(model, preset, case.grid))
    cos, sin = tables_of(position_module(model), model, inputs)
    axes = get_family(family).native_axes_dims(model)
    frames, grid_rows, grid_cols = latent_grid(model, inputs)
    assert (grid_rows, grid_cols) == (rows, cols)
    frequencies = [(ladder(axes[0]), 1.0)] + [
        image_axis_frequencies(preset, dim, trained, extent)
        for dim, trained, extent in zip(axes[1:], case.grid, (rows, cols))
    ]
    expected_cos, expected_sin = wan_formula(time_positions(family, frames), rows, cols, axes, frequencies)
    assert cos.shape == stock_cos.shape == (1, frames * rows * cols, 1, sum(axes))
    assert torch.allclose(cos[0, :, 0].double(), expected_cos, atol=2e-6, rtol=0)
    assert torch.allclose(sin[0, :, 0].double(), expected_sin, atol=2e-6, rtol=0)
    time = slice(0, axes[0])
    assert torch.equal(cos[..., time], stock_cos[..., time]) and torch.equal(sin[..., time], stock_sin[..., time])
    assert (cos[..., axes[0] :] - stock_cos[..., axes[0] :]).abs().max() > 1e-3  # the image axes scaled


@pytest.mark.parametrize("frames", [1, 2, 3])
def test_chronoedit_native_time_positions_are_the_stock_ones(frames):
    """Two latent frames (the image and its edit) sit at times 0 and ``temporal_skip_len - 1``; any other count at
    0, 1, 2, ...: the seam gives the stock tables bit for bit."""
    case = CASES["chronoedit"]
    model = case.model()
    inputs = case.inputs(*case.grid, frames=frames)
    stock = tables_of(model.rope, model, inputs)
    set_pe(model, "native")
    ours = tables_of(position_module(model), model, inputs)
    assert torch.equal(ours[0], stock[0]) and torch.equal(ours[1], stock[1])
    axes = get_family("chronoedit").native_axes_dims(model)
    rows, cols = case.grid
    expected, _ = wan_formula(time_positions("chronoedit", frames), rows, cols, axes, [(ladder(d), 1.0) for d in axes])
    assert torch.allclose(ours[0][0, :, 0].double(), expected, atol=1e-6, rtol=0)


def test_chronoedit_head_dims_whose_stock_tables_mix_axes_are_refused():
    """ChronoEdit's rope builds ``2 * (head_dim // 6)`` channels per image axis and splits ``head_dim // 3``: with
    ``head_dim = 10`` that is 2 and 3, so the stock tables mix axes; refused by name."""
    from mmpos.integrations.diffusers.families.tiny import tiny_chronoedit

    model = tiny_chronoedit(attention_head_dim=10).eval()
    with pytest.raises(ValueError, match="attention_head_dim=10"):
        set_pe(model, "native")


@pytest.mark.parametrize("family", ["wan", "wan_vace", "wan_animate", "chronoedit"])
def test_tier_two_processors_cover_every_self_attention_layer(family):
    """Every attention module the rope reaches (VACE: its control blocks too) runs an mmpos processor."""
    model = CASES[family].model()
    set_pe(model, "rope_axial")
    rotated = {name.rsplit(".processor", 1)[0] for name, p in model.attn_processors.items() if "PE" in type(p).__name__}
    expected = {name for name, module in model.named_modules() if name.endswith("attn1")}
    assert rotated == expected and (family != "wan_vace" or any(n.startswith("vace_blocks") for n in rotated))


@pytest.mark.parametrize(
    "pipeline, family",
    [
        ("WanVideoToVideoPipeline", "wan"),
        ("LucyEditPipeline", "wan"),
        ("WanVACEPipeline", "wan_vace"),
        ("WanAnimatePipeline", "wan_animate"),
        ("ChronoEditPipeline", "chronoedit"),
        ("SanaVideoPipeline", "sana_video"),
        ("SanaImageToVideoPipeline", "sana_video"),
    ],
)
def test_pipelines_resolve_to_the_family_of_their_transformer(pipeline, family):
    import inspect

    import diffusers

    annotation = str(inspect.signature(getattr(diffusers, pipeline).__init__).parameters["transformer"].annotation)
    assert family_for_pipeline(pipeline).name == family
    assert any(cls.__name__ in annotation for cls in get_family(family).model_classes())


@pytest.mark.parametrize("head_dim", [128, 64, 12])
def test_wan_rope_channels_per_axis_are_the_stock_modules(head_dim):
    """``h = w = 2 * (head_dim // 6)``, the rest on time (Wan 2.1's 128: (44, 42, 42)), read from the config as
    ``WanRotaryPosEmbed`` splits them."""
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    from mmpos.integrations.diffusers.families.wan import wan_axes_dims

    stock = WanRotaryPosEmbed(head_dim, (1, 2, 2), 8)
    model = type("Model", (), {"config": type("Config", (), {"attention_head_dim": head_dim})})()
    assert wan_axes_dims(model) == (stock.t_dim, stock.h_dim, stock.w_dim)
