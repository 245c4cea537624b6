"""CPU offload (accelerate's hooks, as diffusers' ``enable_model_cpu_offload`` / ``enable_sequential_cpu_offload``
install them) combined with ``set_pe``, in either order. There is no accelerator here: the offload hooks move weights
to and from ``"cpu"`` (``device="cpu"``), so what is checked is that they stack with mmpos, not a device move.

* A tiny FLUX.1 pipeline: ``pipe.enable_model_cpu_offload(device="cpu")`` before or after ``set_pe``. (diffusers'
  ``enable_sequential_cpu_offload(device="cpu")`` does not run the stock tiny pipeline here: accelerate's
  ``set_module_tensor_to_device`` raises a ``TypeError`` in its post-forward offload, without mmpos.)
* The tiny FLUX.1, FLUX.2, Qwen-Image, Z-Image and Wan transformers under what those calls install per model:
  ``cpu_offload_with_hook`` (model offload) and ``cpu_offload`` (sequential: the weights live on ``"meta"`` between
  forwards and are loaded into each module for its forward).

Properties: ``"native"`` under the offload equals the stock model under it bit for bit, an encoding under the offload
equals the same encoding without it bit for bit, and ``restore`` gives the stock model under the offload back.
"""

import pytest
import torch
from accelerate import cpu_offload, cpu_offload_with_hook
from diffusers import FluxPipeline

from mmpos.integrations.diffusers import restore, set_pe
from mmpos.integrations.diffusers.families.tiny import CASES, run
from tests.fixtures.tiny_models import components, embeddings

FAMILIES = ["flux", "flux2", "qwen", "z_image", "wan"]
CPU = torch.device("cpu")
OFFLOADS = {
    "model": lambda model: cpu_offload_with_hook(model, CPU),
    "sequential": lambda model: cpu_offload(model, execution_device=CPU),
}


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def install(model, pe):
    set_pe(model, pe) if pe == "native" else set_pe(model, pe, theta=300.0)
    return model


@pytest.mark.parametrize("order", ["offload_first", "pe_first"])
@pytest.mark.parametrize("offload", sorted(OFFLOADS))
@pytest.mark.parametrize("family", FAMILIES)
def test_set_pe_under_accelerate_offload_hooks(family, offload, order):
    case = CASES[family]
    inputs = case.inputs(*case.grid)
    stock = case.model()
    OFFLOADS[offload](stock)
    stock_offloaded = run(stock, inputs)
    if offload == "sequential":
        assert next(stock.parameters()).device.type == "meta"  # the weights are loaded per forward
    for pe in ("native", "rope_axial"):
        without = run(install(case.model(), pe), inputs)
        model = case.model()
        if order == "offload_first":
            OFFLOADS[offload](model)
            install(model, pe)
        else:
            OFFLOADS[offload](install(model, pe))
        assert torch.equal(run(model, inputs), without), pe
        if pe == "native":
            assert torch.equal(without, stock_offloaded)
        restore(model)
        assert torch.equal(run(model, inputs), stock_offloaded), pe


def generate(pipe):
    return pipe(
        height=32,
        width=32,
        num_inference_steps=2,
        output_type="latent",
        generator=torch.Generator().manual_seed(0),
        **embeddings(1),
    ).images


@pytest.mark.parametrize("pe", ["native", "rope_axial"])
def test_enable_model_cpu_offload_on_a_flux_pipeline_in_either_order(pe):
    without = generate(install_pipe(FluxPipeline(**components("flux")), pe))
    offload_first = FluxPipeline(**components("flux"))
    offload_first.enable_model_cpu_offload(device="cpu")
    install_pipe(offload_first, pe)
    pe_first = install_pipe(FluxPipeline(**components("flux")), pe)
    pe_first.enable_model_cpu_offload(device="cpu")
    assert torch.equal(generate(offload_first), without)
    assert torch.equal(generate(pe_first), without)
    stock = FluxPipeline(**components("flux"))
    stock.enable_model_cpu_offload(device="cpu")
    expected = generate(stock)
    if pe == "native":
        assert torch.equal(without, expected)
    restore(pe_first.transformer)
    assert torch.equal(generate(pe_first), expected)


def install_pipe(pipe, pe):
    install(pipe.transformer, pe)
    return pipe
