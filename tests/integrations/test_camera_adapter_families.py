"""Camera adapters (UCPE, PRoPE, Plücker) on every family that declares a camera site, on the families' tiny configs
(``families/tiny.py``, fp32, CPU): identity at zero initialisation, the deltas where the site says (checked against
hooks written here from the layer protocol), restore, save/load, context parallelism refused by name
(LTX-2's 2-process cases: ``test_context_parallel_camera.py``)."""

from types import SimpleNamespace

import pytest
import torch

from mmpos.camera import preset_trajectory
from mmpos.camera.video import video_cameras
from mmpos.integrations.diffusers.camera_adapter import (
    CameraAdapter,
    camera_conditioning,
    camera_families,
    install_camera_adapter,
)
from mmpos.integrations.diffusers.families import get_family
from mmpos.integrations.diffusers.families.tiny import CASES, output
from tests.fixtures.tiny_models import trained_looking

FAMILIES = ["hunyuan_video15", "ltx2", "skyreels_v2", "cosmos", "wan"]
KINDS = ["ucpe", "prope", "plucker"]
ROWS, COLS = 3, 4


def _trajectory():
    return preset_trajectory("orbit", 9, degrees=60)


@pytest.fixture(scope="module", params=FAMILIES)
def family_case(request):
    torch.set_num_threads(1)
    name = request.param
    case = CASES[name]
    model = case.model()
    inputs = case.inputs(ROWS, COLS)
    with torch.no_grad():
        stock = output(model(**inputs)).clone()
    return name, model, inputs, stock


def forward(model, inputs):
    with torch.no_grad():
        return output(model(**inputs))


def adapter_for(model, kind, seed=None):
    adapter = CameraAdapter.for_transformer(model, kind, head_dim=16)
    return adapter if seed is None else trained_looking(adapter, seed)


def processors(model, name):
    return [module.processor for _, module in get_family(name).attention_modules(model)]


def test_the_families_with_a_camera_site():
    assert set(FAMILIES) <= set(camera_families())
    with pytest.raises(ValueError, match="'helios' family .* takes no camera adapter; the families that do: .*ltx2"):
        CameraAdapter.for_transformer(CASES["helios"].model(), "plucker")


@pytest.mark.parametrize("kind", KINDS)
def test_zero_init_is_bit_identical_and_a_trained_adapter_is_not_then_stock_again(family_case, kind):
    name, model, inputs, stock = family_case
    before = processors(model, name)
    with camera_conditioning(model, adapter_for(model, kind), _trajectory()):
        assert processors(model, name) != before  # installed
        assert torch.equal(forward(model, inputs), stock)
    with camera_conditioning(model, adapter_for(model, kind, seed=3), _trajectory()):
        changed = forward(model, inputs)
    with camera_conditioning(model, adapter_for(model, kind, seed=3), _trajectory(), scale=0.0):
        assert torch.equal(forward(model, inputs), stock)
    assert (changed - stock).abs().max() > 1e-3
    assert processors(model, name) == before  # removed: the stock processors back
    assert torch.equal(forward(model, inputs), stock)


def _reference(model, name, adapter, inputs):
    """The adapter applied by plain torch hooks on the family's self-attention modules, from the layer protocol
    (``input_delta`` added to the attention's hidden states, ``residual`` to its video output), with cameras built on
    the grid the tiny inputs were built on: where the site puts the deltas, which tokens get which camera."""
    family = get_family(name)
    frames, rows, cols = 2, ROWS, COLS  # every case's inputs: 2 latent frames of ROWS x COLS tokens
    pixels = family.pixels_per_token
    cameras = video_cameras(_trajectory(), (frames, rows, cols), (rows * pixels, cols * pixels)).cameras
    state = adapter.layers[0].condition(cameras)
    handles, seen = [], {}
    for index, (_, module) in enumerate(family.attention_modules(model)):
        layer = adapter.layers[index]

        def pre(module, args, kwargs, layer=layer, index=index):
            key = "hidden_states" if "hidden_states" in kwargs else None
            x = kwargs[key] if key else args[0]
            seen[index] = x
            delta = layer.input_delta(x, state)
            if delta is None:
                return None
            if key:
                return args, {**kwargs, key: x + delta}
            return (x + delta, *args[1:]), kwargs

        def post(module, args, kwargs, out, layer=layer, index=index):
            residual = layer.residual(seen[index], state)
            if residual is None:
                return None
            if isinstance(out, tuple):  # HunyuanVideo 1.5's joint attention: (video, text)
                return (out[0] + residual, *out[1:])
            return out + residual

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    try:
        return forward(model, inputs)
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("kind", KINDS)
def test_the_deltas_go_where_the_layer_protocol_says(family_case, kind):
    name, model, inputs, stock = family_case
    adapter = adapter_for(model, kind, seed=5)
    expected = _reference(model, name, adapter, inputs)
    assert (expected - stock).abs().max() > 1e-3
    with camera_conditioning(model, adapter, _trajectory()):
        got = forward(model, inputs)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_save_and_load_round_trip(family_case, tmp_path):
    name, model, inputs, _ = family_case
    for kind in KINDS:
        adapter = adapter_for(model, kind, seed=7)
        adapter.save_pretrained(tmp_path / kind)
        loaded = CameraAdapter.from_pretrained(tmp_path / kind)
        assert loaded.config.kind == kind and len(loaded.layers) == len(get_family(name).attention_modules(model))
        with camera_conditioning(model, adapter, _trajectory()):
            saved = forward(model, inputs)
        with camera_conditioning(model, loaded, _trajectory()):
            assert torch.equal(forward(model, inputs), saved)


def test_cameras_on_another_grid_are_refused_by_name(family_case):
    name, model, inputs, _ = family_case
    frames, rows, cols = get_family(name).latent_grid(model, (), inputs)
    assert (frames, rows, cols) == (2, ROWS, COLS)  # the grid the tiny inputs were built on
    cameras = video_cameras(_trajectory(), (frames + 1, rows, cols), (rows * 16, cols * 16))
    with camera_conditioning(model, adapter_for(model, "plucker"), cameras):
        with pytest.raises(ValueError, match=f"this forward has {frames} x {rows} x {cols}"):
            forward(model, inputs)


def test_ltx2_cameras_act_on_the_video_self_attention_only():
    model = CASES["ltx2"].model()
    audio = [block.audio_attn1.processor for block in model.transformer_blocks]
    video = [block.attn1.processor for block in model.transformer_blocks]
    with camera_conditioning(model, adapter_for(model, "ucpe"), _trajectory()):
        assert [block.audio_attn1.processor for block in model.transformer_blocks] == audio
        assert all(block.attn1.processor is not p for block, p in zip(model.transformer_blocks, video))


@pytest.mark.parametrize("name", ["hunyuan_video15", "skyreels_v2", "cosmos"])
def test_context_parallelism_stays_refused_by_name(name):
    """These classes have no ``_cp_plan`` in diffusers 0.42.1: a camera adapter on a model made context parallel (a
    caller's plan) is refused, naming the family and the class without a plan."""
    model = CASES[name].model()
    assert getattr(type(model), "_cp_plan", None) is None
    model._parallel_config = SimpleNamespace(context_parallel_config=object(), tensor_parallel_config=None)
    adapter = adapter_for(model, "plucker")
    with pytest.raises(RuntimeError, match=f"family '{name}'.* context parallelism .* is refused") as error:
        install_camera_adapter(model, adapter.conditioning(_trajectory()))
    assert f"({type(model).__name__} has no _cp_plan in diffusers 0.42.1: the plan is the caller's)" in str(error.value)


def test_ltx2_under_a_plan_that_leaves_cross_attn_rope_whole_is_refused_by_name():
    """LTX-2 under diffusers' own plan (no split hook on ``cross_attn_rope``): refused, pointing at
    ``ltx2_context_parallel_plan`` (the 2-process cases: ``test_context_parallel_camera.py``)."""
    model = CASES["ltx2"].model()
    model._parallel_config = SimpleNamespace(context_parallel_config=object(), tensor_parallel_config=None)
    adapter = adapter_for(model, "plucker")
    with pytest.raises(RuntimeError, match="the plan leaves cross_attn_rope whole.*ltx2_context_parallel_plan"):
        install_camera_adapter(model, adapter.conditioning(_trajectory()))


def test_the_family_table_says_which_families_take_which_kinds():
    from mmpos.integrations.diffusers.families import camera_row

    for name in camera_families():
        assert camera_row(get_family(name)).startswith("plucker, prope, ucpe")
    for name in ("wan", "ltx2"):  # ucpe / prope are refused there
        assert camera_row(get_family(name)).endswith("(context parallel: plucker)")
    for name in ("hunyuan_video15", "skyreels_v2", "cosmos"):
        assert camera_row(get_family(name)) == "plucker, prope, ucpe"
    assert camera_row(get_family("hunyuan_video")) == camera_row(get_family("helios")) == "-"
