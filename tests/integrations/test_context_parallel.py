"""Context parallelism with scheduled extrapolation: every rank resolves the spectrum of the whole sequence.

2 real processes (torchrun, gloo, ``OMP_NUM_THREADS=1``; the diffusers CPU limitations patched by the worker are
named in its docstring): a tiny fp64 Flux with ``set_pe("native", extrapolation=model_extrapolation(...))`` under
``enable_parallelism`` (Ulysses and ring, even and uneven sequence lengths) gives the one-process output.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmpos.integrations.diffusers import model_extrapolation, position_module, restore, set_pe
from tests.fixtures.tiny_models import tiny_flux, tiny_flux_inputs

WORKER = Path(__file__).parents[1] / "workers" / "cp_flux_worker.py"
pytestmark = pytest.mark.usefixtures("one_thread")

# (preset, mode, image rows, image cols, text tokens); trained grid 4 x 4, so 8 x 8 extrapolates 2x
CASES = [(preset, mode, 8, 8, 8) for preset in ("ntk", "yarn", "dype") for mode in ("ulysses", "ring")]
CASES += [("dype", "ulysses", 5, 5, 7), ("dype", "ring", 5, 5, 7), ("yarn", "ulysses", 5, 7, 3)]  # uneven


def test_two_process_context_parallel_equals_one_process(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "29523",
        str(WORKER),
        str(tmp_path),
        json.dumps(CASES),
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        differences = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert len(differences) == len(CASES)
        worst = {case: d for case, d in differences.items() if not d <= 1e-12}
        assert not worst, f"rank {rank}: context-parallel output differs from one process: {worst}"


def shard(ids, rank, world_size=2):
    return ids.tensor_split(world_size)[rank]


@pytest.mark.parametrize("preset", ["ntk", "yarn", "dype"])
def test_a_shard_of_ids_gets_the_tables_of_the_whole_sequence(preset):
    """The seam called on a shard inside a forward (as under the plan) resolves the whole sequence's spectrum:
    its table rows equal the one-process table's rows of those tokens."""
    model = tiny_flux(torch.float64)
    set_pe(model, "native", extrapolation=model_extrapolation(model, preset, trained_grid=(4, 4)))
    inputs = tiny_flux_inputs(torch.float64, height=8, width=8, text=8)
    full_ids = torch.cat([inputs["txt_ids"], inputs["img_ids"]])
    seen = []
    seam = position_module(model)
    original = type(seam).forward

    def sharded_forward(self, ids):  # what rank 0 sees under enable_parallelism
        seen.append(original(self, torch.cat([shard(inputs["txt_ids"], 0), shard(inputs["img_ids"], 0)])))
        return original(self, ids)

    seam.forward = sharded_forward.__get__(seam)
    with torch.no_grad():
        model(**inputs)
    rows = torch.cat([torch.arange(8).tensor_split(2)[0], 8 + torch.arange(64).tensor_split(2)[0]])
    with torch.no_grad():
        seam.encodings[0].step.sigma = 0.5
        full = original(seam, full_ids)
    for got, want in zip(seen[0], full):
        assert torch.equal(got, want[rows])


def test_extents_are_set_for_the_forward_only():
    model = tiny_flux(torch.float64)
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype", trained_grid=(4, 4)))
    step = position_module(model).encodings[0].step
    with torch.no_grad():
        model(**tiny_flux_inputs(torch.float64, height=8, width=6))
    assert step.extents is None
    bad = dict(tiny_flux_inputs(torch.float64, height=8, width=6), hidden_states=torch.randn(1, 48, 3))
    with pytest.raises(RuntimeError):
        model(**bad)
    assert step.extents is None
    restore(model)
    assert not model._forward_hooks and not model._forward_pre_hooks
