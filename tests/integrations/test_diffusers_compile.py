"""``torch.compile`` of a ``set_pe``'d transformer (diffusers' own compile tests use ``fullgraph=True``), counted
with dynamo's ``CompileCounter`` backend (one frame per compiled graph): over the steps of a sampler (the timestep
changes) a compiled FLUX.1 compiles no more after its first call, and the compiled outputs equal the eager ones.
(Before the seams skipped their ``forwards`` counter and native-table cache while dynamo traces, every call
compiled again: 2, 3, 4 frames over three steps.)

On the five families diffusers users compile most (FLUX.1, FLUX.2, Qwen-Image, Z-Image, Wan), ``rope_axial`` compiles
with ``fullgraph=True, dynamic=True``, no more over the steps, and no more on a resolution change when the inputs are
separate tensors, as pipelines pass them. (Wan's seam broke fullgraph on ``torch.is_inference_mode_enabled()`` before
it built its grid afresh while tracing. The tiny cases' ``img_ids`` / ``txt_ids`` are views of one tensor: dynamo
then guards on their storage offsets and recompiles once on a new size, stock FLUX.1 included; a set_pe'd model
recompiled twice there because torch.compile of an ``nn.Module`` runs its forward pre-hooks outside the forward's
frame and compiled mmpos' installer hook as a frame of its own (an empty graph). mmpos' hooks now run eagerly: one.)

DyPE compiles with ``fullgraph=True`` on FLUX.1, Wan, FLUX.2 and Z-Image: the pre-forward hooks (the step's sigma,
the image extents) run eagerly (``torch.compiler.disable``) and write the resolved spectrum into tensors the graph
reads (``AxialRoPE.publish_schedule``), so the graph follows the sigma schedule without recompiling (before:
``.tolist()`` of the extents and ``float(timestep)`` broke it). FLUX.2's and Z-Image's native seams (tier 1) read the
output image's extents from the forward's inputs in the hook (``Family.image_extents``), and select in the graph
between the published spectrum (image calls) and the training one (text, captions), as their eager tables do;
Z-Image's ComfyUI-DyPE positions follow the published sigma there too."""

import os

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from mmpos.integrations.diffusers import DyPEConfig, apply_dype, set_pe
from mmpos.integrations.diffusers.families.tiny import CASES, run

SIGMAS = (0.9, 0.5, 0.2)
slow = pytest.mark.skipif(os.environ.get("MMPOS_SLOW") != "1", reason="slow: compiles a model (MMPOS_SLOW=1)")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch.set_num_threads(1)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def separate(inputs: dict) -> dict:
    """``inputs`` with every tensor in its own storage (no views of a shared one)."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def compiled_steps(model, case):
    """Eager and compiled (``fullgraph=True``) outputs over ``SIGMAS``; the frame counts after each step."""
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    frames, pairs = [], []
    for sigma in SIGMAS:
        inputs = case.inputs(4, 4, sigma=sigma)
        pairs.append((run(model, inputs), run(compiled, inputs)))
        frames.append(counter.frame_count)
    return pairs, frames


@slow
@pytest.mark.parametrize("pe", ["native", "rope_axial"])
def test_a_set_pe_transformer_compiles_no_more_over_the_steps(pe):
    case = CASES["flux"]
    model = case.model()
    set_pe(model, pe) if pe == "native" else set_pe(model, pe, theta=300.0)
    pairs, frames = compiled_steps(model, case)
    assert frames[0] >= 1 and frames == [frames[0]] * len(SIGMAS)  # no recompilation as the timestep moves
    for eager, compiled in pairs:
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


@slow
@pytest.mark.parametrize(
    "family, convention",
    [("flux", "authors"), ("wan", "authors"), ("flux2", "authors"), ("z_image", "authors"), ("z_image", "comfyui")],
)
def test_dype_compiles_fullgraph_and_follows_the_sigma_schedule_without_recompiling(family, convention):
    """DyPE at 2x the training rows (1.5x for ComfyUI-DyPE's Z-Image positions): the compiled graph reads the spectrum the (eager) hooks resolve at each step, so
    it equals eager at every sigma (which DyPE changes) with one compilation; a new size compiles at most once more."""
    case = CASES[family]
    model = case.model()
    apply_dype(model, DyPEConfig(trained_grid=case.grid, convention=convention))
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    # ComfyUI-DyPE's Z-Image positions keep their integer ids at 2x (its stride 2 base / rows is 1 there): 1.5x
    rows, cols = (3 * case.grid[0] // 2 if convention == "comfyui" else 2 * case.grid[0]), case.grid[1]
    frames, outputs = [], []
    for size, sigma in [((rows, cols), 0.9), ((rows, cols), 0.5), ((rows, cols), 0.2), ((rows, 2 * cols), 0.5)]:
        inputs = separate(case.inputs(*size, sigma=sigma))
        eager = run(model, inputs)
        outputs.append(run(compiled, inputs))
        torch.testing.assert_close(outputs[-1], eager, rtol=1e-5, atol=1e-5)
        frames.append(counter.frame_count)
    assert frames[0] == 1 and frames[:3] == [1, 1, 1]  # one graph over the steps
    assert frames[3] - frames[2] <= 1
    stock = case.model()
    with torch.no_grad():  # the schedule took part: sigma 0.9 is not the stock model's output
        stock_out = run(stock, separate(case.inputs(rows, cols, sigma=0.9)))
    assert (outputs[0] - stock_out).abs().max() > 1e-4


@slow
@pytest.mark.parametrize("family", ["flux", "flux2", "qwen", "z_image", "wan"])
def test_rope_axial_compiles_fullgraph_once_over_steps_and_a_resolution_change(family):
    case = CASES[family]
    model = case.model()
    set_pe(model, "rope_axial", theta=300.0)
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    frames = []
    for rows, cols, sigma in [(4, 4, 0.9), (4, 4, 0.5), (4, 4, 0.2), (6, 4, 0.5)]:
        inputs = separate(case.inputs(rows, cols, sigma=sigma))
        eager = run(model, inputs)
        torch.testing.assert_close(run(compiled, inputs), eager, rtol=1e-5, atol=1e-5)
        frames.append(counter.frame_count)
    assert frames[0] >= 1 and frames[:3] == [frames[0]] * 3  # no recompilation as the timestep moves
    assert frames[3] - frames[2] <= 1  # a resolution change: at most one recompilation
