"""LoRA (diffusers' ``load_lora_adapter``, i.e. peft's ``inject_adapter_in_model``) combined with ``set_pe`` on the tiny
FLUX.1, FLUX.2, Qwen-Image, Z-Image and Wan transformers, in either order: mmpos' processors call the attention
module's linears, so they run whatever peft put there. Properties (those diffusers' LoRA tests check, written here):

* the order does not matter (LoRA then ``set_pe`` == ``set_pe`` then LoRA, bit for bit), the LoRA moves the output,
  and under ``"native"`` the result is the stock model's with the same LoRA, bit for bit;
* ``fuse_lora`` / ``unfuse_lora`` keep the output (fp32 rounding of the merged weights), ``set_adapters(weights=w)``
  equals a LoRA whose ``B`` is scaled by ``w``, a hot-swap (``hotswap=True``) equals loading the new weights fresh,
  ``unload_lora`` gives the set_pe model without LoRA back, and ``restore`` gives the stock model with the LoRA.
"""

import pytest
import torch

from mmpos.integrations.diffusers import DyPEConfig, apply_dype, restore, set_pe
from mmpos.integrations.diffusers.families.tiny import CASES, run

FAMILIES = ["flux", "flux2", "qwen", "z_image", "wan"]
FUSED_TOLERANCE = 1e-5  # fuse/unfuse add and subtract B @ A into fp32 weights


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def lora_state_dict(model, rank=2, seed=0, scale_b=1.0) -> dict:
    """A random LoRA on every linear of every attention module of ``model`` (the q/k/v, fused and output projections
    the processors call; diffusers' peft key format, no prefix)."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and any(
            part.startswith(("attn", "attention")) for part in name.split(".")
        ):
            state[f"{name}.lora_A.weight"] = torch.randn(rank, module.in_features, generator=generator) * 0.3
            state[f"{name}.lora_B.weight"] = torch.randn(module.out_features, rank, generator=generator) * 0.3 * scale_b
    assert state, "no attention projections found"
    return state


def load(model, state, **kwargs):
    model.load_lora_adapter(dict(state), adapter_name="lora", prefix=None, **kwargs)
    return model


def install(model, pe):
    if pe == "dype":
        apply_dype(model, DyPEConfig(trained_grid=(2, 2)))  # the 4 x 4 inputs are twice the grid: DyPE is active
    elif pe == "native":
        set_pe(model, "native")
    else:
        set_pe(model, pe, theta=300.0)
    return model


PES = ["native", "rope_axial"]


@pytest.mark.parametrize("pe", PES)
@pytest.mark.parametrize("family", FAMILIES)
def test_lora_before_or_after_set_pe_is_the_same_model(family, pe):
    case = CASES[family]
    inputs = case.inputs(*case.grid, sigma=0.6)
    state = lora_state_dict(case.model())
    without = run(install(case.model(), pe), inputs)
    lora_first = run(install(load(case.model(), state), pe), inputs)
    pe_first = run(load(install(case.model(), pe), state), inputs)
    assert torch.equal(lora_first, pe_first)
    assert (pe_first - without).abs().max() > 1e-2  # the LoRA is in the forward
    if pe == "native":
        assert torch.equal(pe_first, run(load(case.model(), state), inputs))  # = the stock model with the LoRA


@pytest.mark.parametrize("family", ["flux", "qwen", "z_image"])
def test_lora_under_dype_in_either_order(family):
    case = CASES[family]
    inputs = case.inputs(4, 4, sigma=0.6)
    state = lora_state_dict(case.model())
    dype = run(install(case.model(), "dype"), inputs)
    assert (dype - run(case.model(), inputs)).abs().max() > 1e-5  # DyPE is active at twice the grid
    lora_first = run(install(load(case.model(), state), "dype"), inputs)
    assert torch.equal(lora_first, run(load(install(case.model(), "dype"), state), inputs))
    assert (lora_first - dype).abs().max() > 1e-2


@pytest.mark.parametrize("pe", PES)
@pytest.mark.parametrize("family", FAMILIES)
def test_set_adapters_hotswap_and_unload_after_set_pe(family, pe):
    case = CASES[family]
    inputs = case.inputs(*case.grid, sigma=0.6)
    first, second = lora_state_dict(case.model()), lora_state_dict(case.model(), seed=1)
    without = run(install(case.model(), pe), inputs)
    model = load(install(case.model(), pe), first)

    model.set_adapters(["lora"], weights=[0.5])
    halved = run(load(install(case.model(), pe), lora_state_dict(case.model(), scale_b=0.5)), inputs)
    assert (run(model, inputs) - halved).abs().max() < 1e-6
    model.set_adapters(["lora"], weights=[1.0])

    swapped_before = run(model, inputs)
    load(model, second, hotswap=True)
    swapped = run(model, inputs)
    assert torch.equal(swapped, run(load(install(case.model(), pe), second), inputs))
    assert (swapped - swapped_before).abs().max() > 1e-2

    model.unload_lora()
    assert torch.equal(run(model, inputs), without)


@pytest.mark.parametrize("pe", PES)
@pytest.mark.parametrize("family", FAMILIES)
def test_fuse_unfuse_and_restore_under_lora(family, pe):
    case = CASES[family]
    inputs = case.inputs(*case.grid, sigma=0.6)
    state = lora_state_dict(case.model())
    model = load(install(case.model(), pe), state)
    unfused = run(model, inputs)
    model.fuse_lora()
    assert (run(model, inputs) - unfused).abs().max() < FUSED_TOLERANCE
    model.unfuse_lora()
    assert (run(model, inputs) - unfused).abs().max() < FUSED_TOLERANCE
    restore(model)  # mmpos off, the LoRA stays
    stock_lora = run(load(case.model(), state), inputs)
    assert (run(model, inputs) - stock_lora).abs().max() < FUSED_TOLERANCE
    if pe != "native":
        assert (unfused - stock_lora).abs().max() > 1e-4  # the encoding was in the forward


@pytest.mark.parametrize("family", FAMILIES)
def test_hotswap_to_a_higher_rank_after_set_pe(family):
    """``enable_lora_hotswap(target_rank=4)`` before the first load: a rank-4 LoRA swaps into a rank-2 one's place."""
    case = CASES[family]
    inputs = case.inputs(*case.grid, sigma=0.6)
    model = install(case.model(), "rope_axial")
    model.enable_lora_hotswap(target_rank=4)
    load(model, lora_state_dict(case.model(), rank=2))
    load(model, lora_state_dict(case.model(), rank=4, seed=1), hotswap=True)
    fresh = load(install(case.model(), "rope_axial"), lora_state_dict(case.model(), rank=4, seed=1))
    assert torch.equal(run(model, inputs), run(fresh, inputs))
