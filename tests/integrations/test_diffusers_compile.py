"""``torch.compile`` of a ``set_pe``'d transformer (diffusers' own compile tests use ``fullgraph=True``), counted
with dynamo's ``CompileCounter`` backend (one frame per compiled graph): over the steps of a sampler (the timestep
changes) a compiled FLUX.1 compiles no more after its first call, and the compiled outputs equal the eager ones.
(Before the seams skipped their ``forwards`` counter and native-table cache while dynamo traces, every call
compiled again: 2, 3, 4 frames over three steps.)

Open (measured here, not yet fixed): DyPE's schedule breaks ``fullgraph=True`` on ``coordinate_extents(...).tolist()``
(strict xfail below); Wan's seam breaks it on ``torch.is_inference_mode_enabled()``; with ``dynamic=True`` a
resolution change on FLUX.1 compiles twice more, not once."""

import os

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from mmpos.integrations.diffusers import DyPEConfig, apply_dype, set_pe
from mmpos.integrations.diffusers.families.tiny import CASES, output

SIGMAS = (0.9, 0.5, 0.2)
slow = pytest.mark.skipif(os.environ.get("MMPOS_SLOW") != "1", reason="slow: compiles a model (MMPOS_SLOW=1)")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch.set_num_threads(1)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def run(model, inputs):
    with torch.no_grad():
        return output(model(**inputs, return_dict=False))


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
@pytest.mark.xfail(strict=True, raises=torch._dynamo.exc.Unsupported, reason="DyPE: .tolist() breaks fullgraph")
def test_a_dype_transformer_compiles_with_fullgraph():
    case = CASES["flux"]
    model = case.model()
    apply_dype(model, DyPEConfig(trained_grid=case.grid))
    compiled_steps(model, case)
