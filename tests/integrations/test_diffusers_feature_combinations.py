"""``set_pe`` combined with diffusers' model features on the tiny configs of FLUX.1, FLUX.2, Qwen-Image, Z-Image and
Wan: each feature gives the same result with mmpos ``"native"`` as without mmpos (native is stock bit for bit), and an
mmpos encoding under the feature equals the same encoding without it, to the feature's own tolerance (exact for the
attention backend and group offloading; under layerwise casting the encoding moves by at most twice what the casting
moves the stock model). Group offloading onloads to the CPU here (the hooks stack; no device moves)."""

import pytest
import torch
from diffusers.hooks import apply_group_offloading, apply_layerwise_casting

from mmpos.integrations.diffusers import restore, set_pe
from mmpos.integrations.diffusers.families.tiny import CASES, run

FAMILIES = ["flux", "flux2", "qwen", "z_image", "wan"]


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def with_feature(feature, family, pe):
    """The output of the tiny ``family`` model with ``feature`` applied, then ``set_pe(pe)`` (``None``: no mmpos)."""
    case = CASES[family]
    model, inputs = case.model(), case.inputs(*case.grid)
    feature(model)
    if pe is not None:
        set_pe(model, pe, theta=300.0) if pe != "native" else set_pe(model, pe)
    return run(model, inputs), model, inputs


def native_backend(model):
    model.set_attention_backend("native")


def layerwise_casting(model):
    apply_layerwise_casting(model, storage_dtype=torch.bfloat16, compute_dtype=torch.float32)


def group_offloading(model):
    apply_group_offloading(model, onload_device=torch.device("cpu"), offload_type="block_level", num_blocks_per_group=1)


FEATURES = {"attention backend native": native_backend, "layerwise casting": layerwise_casting}
FEATURES["group offloading"] = group_offloading


def stock_under(feature, family):
    """The stock model's output under ``feature``; skipped where the stock model does not run under it here (Wan
    and Z-Image under layerwise casting: their fp32 timestep embedding meets bf16 weights)."""
    try:
        return with_feature(FEATURES[feature], family, None)[0]
    except RuntimeError as error:
        pytest.skip(f"the stock {family} model does not run under {feature}: {error}")


@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("family", FAMILIES)
def test_native_under_a_feature_is_the_feature_without_mmpos(family, feature):
    stock = stock_under(feature, family)
    native, model, inputs = with_feature(FEATURES[feature], family, "native")
    assert torch.equal(native, stock)
    restore(model)
    assert torch.equal(run(model, inputs), stock)


@pytest.mark.parametrize("feature", sorted(FEATURES))
@pytest.mark.parametrize("family", ["flux", "flux2", "z_image", "wan"])  # mmpos processors (Qwen-Image: stock ones)
def test_an_encoding_under_a_feature_is_the_encoding_without_it(family, feature):
    stock_featured = stock_under(feature, family)
    plain, _, _ = with_feature(lambda model: None, family, "rope_axial")
    featured, _, _ = with_feature(FEATURES[feature], family, "rope_axial")
    if feature != "layerwise casting":
        assert torch.equal(featured, plain)
        return
    # bf16 storage rounds the weights: the encoding moves by what the casting moves the stock model, no more
    stock, _, _ = with_feature(lambda model: None, family, None)
    casting_error = (stock_featured - stock).abs().max()
    assert 0 < (featured - plain).abs().max() <= 2 * casting_error
