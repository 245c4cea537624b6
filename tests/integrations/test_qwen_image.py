"""``set_pe`` on diffusers' ``QwenImageTransformer2DModel`` (tiny config of diffusers' own tests, no downloads):
``"native"`` is the stock model bit for bit, DyPE/NTK/YaRN presets act above the training grid only, and the scale
comes from the images' extent (not the text positions that follow them)."""

import pytest
import torch
from diffusers import QwenImageTransformer2DModel

import mmpos
from mmpos.integrations.diffusers import model_extrapolation, position_module, restore, set_pe
from mmpos.integrations.diffusers.families.qwen import qwen_coords
from mmpos.integrations.diffusers.tiny_pipelines import QWEN_TRANSFORMER as CONFIG

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_qwen():
    torch.manual_seed(0)
    return QwenImageTransformer2DModel(**CONFIG).eval()


def inputs(shapes, sigma=0.5, text=7):
    gen = torch.Generator().manual_seed(1)
    tokens = sum(f * h * w for f, h, w in shapes)
    return dict(
        hidden_states=torch.randn(1, tokens, 16, generator=gen),
        encoder_hidden_states=torch.randn(1, text, 16, generator=gen),
        encoder_hidden_states_mask=torch.ones(1, text),
        timestep=torch.tensor([sigma]),
        img_shapes=[shapes],
    )


def run(model, kwargs):
    with torch.no_grad():
        return model(**kwargs).sample


def test_coordinates_are_the_stock_centred_grid_then_text():
    image, text = qwen_coords([[(1, 3, 4)]], 2)
    assert image[:, 1].unique().tolist() == [-2.0, -1.0, 0.0] and image[:, 2].unique().tolist() == [-2, -1, 0, 1]
    assert text.tolist() == [[2.0] * 3, [3.0] * 3]  # after max(h // 2, w // 2) = 2


@pytest.mark.parametrize("shapes", [[(1, 4, 4)], [(1, 5, 7)], [(1, 4, 6), (1, 2, 3)]])
def test_native_and_dype_at_the_training_grid_are_stock_bit_for_bit(shapes):
    model = tiny_qwen()
    stock = run(model, inputs(shapes))
    set_pe(model, "native")
    assert torch.equal(run(model, inputs(shapes)), stock)
    _, height, width = shapes[0]
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype", (height, width)))
    for sigma in (1.0, 0.3):
        assert torch.equal(run(model, inputs(shapes, sigma)), run(tiny_qwen(), inputs(shapes, sigma)))
    restore(model)
    assert torch.equal(run(model, inputs(shapes)), stock)


def test_presets_act_above_the_training_grid_with_the_images_scale():
    model = tiny_qwen()
    stock = run(model, inputs([(1, 4, 6)]))
    set_pe(model, "native", extrapolation=model_extrapolation(model, "ntk", (2, 2)))
    assert (run(model, inputs([(1, 4, 6)])) - stock).abs().max() > 1e-4
    expected = mmpos.create_pe(
        "rope_axial",
        head_dim=16,
        axes_dims=(8, 4, 4),
        extrapolation=[None, {"type": "ntk", "factor": 2.0}, {"type": "ntk", "factor": 3.0}],
    )  # 4 x 6 over 2 x 2, text ignored
    encoding = model.pos_embed.encodings[0]
    assert encoding.step.extents == [1.0, 4.0, 6.0]  # the seam's last: the images' extents (text first)
    assert torch.equal(encoding.spectrum_at(torch.zeros(1, 3)).inv_freq, expected.spectrum.inv_freq)
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype", (2, 2)))
    for sigma in (1.0, 1.0, 0.5):
        run(model, inputs([(1, 4, 6)], sigma))
    assert position_module(model).table_builds == 2 + 1  # image tables per distinct sigma, one text table
    assert model.pos_embed.encodings[0].step.sigma == 0.5


@pytest.mark.parametrize("preset", ["dype", "yarn", "ntk"])
def test_text_tokens_keep_the_training_spectrum_above_the_training_grid(preset):
    """As the DyPE authors' Qwen-Image code (text frequencies from the plain ladder, no YaRN magnitude): only the
    image tables follow the schedule."""
    model = tiny_qwen()
    shapes = [(1, 4, 6)]
    stock_image, stock_text = model.pos_embed(shapes, max_txt_seq_len=5, device=torch.device("cpu"))
    set_pe(model, "native", extrapolation=model_extrapolation(model, preset, (2, 2)))
    model.pos_embed.encodings[0].step.sigma = 1.0
    image, text = model.pos_embed(shapes, max_txt_seq_len=5, device=torch.device("cpu"))
    assert torch.equal(text, stock_text)
    assert (image - stock_image).abs().max() > 1e-3


def test_encodings_without_one_shared_table_are_refused():
    model = tiny_qwen()
    with pytest.raises(ValueError, match="interleaved layout"):
        set_pe(model, "rope_axial", layout="half")
    with pytest.raises(ValueError, match="per_layer"):
        set_pe(model, "rope_axial", per_layer=True)


def test_an_mmpos_encoding_counts_its_image_and_text_tables_once():
    model = tiny_qwen()
    set_pe(model, "rope_axial")
    for _ in range(2):
        run(model, inputs([(1, 4, 6)]))
    assert position_module(model).table_builds == 2 and position_module(model).forwards == 2


def test_set_pe_and_restore_after_enable_parallelism_are_refused():
    """Qwen-Image's context-parallel plan hooks ``pos_embed`` itself: swapping it afterwards would drop the hook."""
    model = tiny_qwen()
    model._parallel_config = object()  # what enable_parallelism records
    with pytest.raises(RuntimeError, match="before enable_parallelism .* hooks the `pos_embed` module"):
        set_pe(model, "rope_axial")
    del model._parallel_config
    set_pe(model, "rope_axial")
    model._parallel_config = object()
    with pytest.raises(RuntimeError, match="before enable_parallelism"):
        restore(model)
