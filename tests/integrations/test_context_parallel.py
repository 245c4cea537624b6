"""Context parallelism: every rank resolves the spectrum of the whole sequence and builds only its own rows.

2 real processes (torchrun, gloo, ``OMP_NUM_THREADS=1``; the diffusers CPU limitations patched by the workers are
named in ``tests/workers/cp_patches.py``):

- a tiny fp64 Flux with ``set_pe("native", extrapolation=model_extrapolation(...))`` under ``enable_parallelism``
  (Ulysses and ring, even and uneven sequence lengths) gives the one-process output (``cp_flux_worker.py``);
- tiny fp32 Wan, ChronoEdit, Flux, FLUX.2, Qwen-Image and LTX-Video models (native, ``rope_axial``, ``rope_mixed``, extrapolation
  presets) give the one-process output, and every table and coordinate tensor a rank's seam caches has at most that
  rank's rows (``cp_tables_worker.py``); what diffusers cannot shard (Qwen-Image's ring attention with a padded text
  mask, LTX's text mask and per-token timesteps) is refused by name.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmpos.coords.grids import grid_coords, grid_rows
from mmpos.integrations.diffusers import model_extrapolation, position_module, restore, set_pe
from mmpos.integrations.diffusers.families import ltx
from mmpos.integrations.diffusers.families.tiny import CASES as FAMILY_CASES
from tests.fixtures.tiny_models import tiny_flux, tiny_flux_inputs

WORKER = Path(__file__).parents[1] / "workers" / "cp_flux_worker.py"
TABLES_WORKER = Path(__file__).parents[1] / "workers" / "cp_tables_worker.py"
pytestmark = pytest.mark.usefixtures("one_thread")

# (preset, mode, image rows, image cols, text tokens); trained grid 4 x 4, so 8 x 8 extrapolates 2x
CASES = [(preset, mode, 8, 8, 8) for preset in ("ntk", "yarn", "dype") for mode in ("ulysses", "ring")]
CASES += [("dype", "ulysses", 5, 5, 7), ("dype", "ring", 5, 5, 7), ("yarn", "ulysses", 5, 7, 3)]  # uneven


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torchrun(worker, *arguments):
    """Run ``worker`` on 2 processes (a free port: other test runs may share the machine)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
    ]
    result = subprocess.run(
        command + [str(worker), *map(str, arguments)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_two_process_context_parallel_equals_one_process(tmp_path):
    torchrun(WORKER, tmp_path, json.dumps(CASES))
    for rank in (0, 1):
        differences = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert len(differences) == len(CASES)
        worst = {case: d for case, d in differences.items() if not d <= 1e-12}
        assert not worst, f"rank {rank}: context-parallel output differs from one process: {worst}"


# [family, pe, mode, grid, preset]: Wan latents (frames, height, width), patch (1, 2, 2); Flux (height, width,
# text); FLUX.2 (rows, cols, text[, reference rows, cols]). Odd token counts run with *_anything.
TABLE_CASES = {
    "wan": [
        ["wan", "native", "ulysses", [2, 8, 8], None],
        ["wan", "rope_axial", "ring", [1, 6, 10], None],
        ["wan", "rope_mixed", "ulysses", [2, 8, 8], None],
        ["wan", "rope_axial", "ring", [2, 8, 8], "ntk"],
    ],
    "flux": [["flux", "native", "ring", [4, 4, 8], None], ["flux", "rope_mixed", "ulysses", [5, 5, 7], None]],
    # ChronoEdit: Wan's plan and seam; its two-frame input at times 0 and 7 (latents (frames, height, width))
    "chronoedit": [
        ["chronoedit", "native", "ulysses", [2, 8, 8], None],
        ["chronoedit", "rope_axial", "ring", [2, 6, 10], "dype"],
        ["chronoedit", "rope_mixed", "ulysses", [3, 8, 8], None],
    ],
    "camera": [
        ["wan+plucker", "native", "ulysses", [2, 8, 8], None],
        ["wan+plucker", "rope_mixed", "ring", [1, 6, 10], None],
    ],
    "flux2": [
        ["flux2", "native", "ulysses", [4, 4, 4], None],
        ["flux2", "native", "ring", [6, 6, 5, 2, 4], "dype"],
        ["flux2", "rope_axial", "ulysses", [6, 6, 4], "yarn"],
    ],
    # Qwen-Image: grid (rows, cols, text[, masked text tokens, reference rows, cols]); its plan splits pos_embed's
    # outputs along dim 0. Masked tokens: a padded prompt (else the mask is None, as QwenImagePipeline passes it)
    "qwen": [
        ["qwen", "native", "ulysses", [4, 4, 8], None],
        ["qwen", "native", "ring", [5, 5, 7], None],
        ["qwen", "rope_axial", "ulysses", [5, 5, 7], None],
        ["qwen", "rope_axial", "ring", [4, 6, 8], None],
        ["qwen", "native", "ulysses", [6, 6, 7], "dype"],
        ["qwen", "rope_axial", "ring", [6, 6, 8], "yarn"],
        ["qwen", "native", "ulysses", [5, 5, 8, 3], None],
        ["qwen", "native", "ring", [4, 4, 8, 0, 2, 3], "dype"],
    ],
    "ltx": [
        ["ltx", "native", "ulysses", [2, 4, 4, 4], None],
        ["ltx", "native", "ring", [2, 4, 4, 4], None],
        ["ltx", "native", "ulysses", [3, 3, 5, 3], None],
        ["ltx", "native", "ring", [1, 5, 7, 3], "yarn"],
        ["ltx", "native", "ulysses", [2, 8, 8, 4], "dype"],
    ],
}


@pytest.fixture(scope="module")
def per_rank_tables(tmp_path_factory):
    """One 2-process run of every case of TABLE_CASES: per rank, per case, what cp_tables_worker.py records."""
    out = tmp_path_factory.mktemp("cp_tables")
    cases = (
        [case for family in TABLE_CASES.values() for case in family] + REFUSED + QWEN_MASKED_RING + LTX_REFUSED_CASES
    )
    torchrun(TABLES_WORKER, out, json.dumps(cases))
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


REFUSED = [["wan+ucpe", "native", "ring", [2, 8, 8], None], ["wan+prope", "rope_axial", "ulysses", [2, 8, 8], None]]


@pytest.mark.parametrize("family", sorted(TABLE_CASES))
def test_two_process_tables_are_per_rank_and_equal_one_process(per_rank_tables, family):
    """Output == one process (fp32, <= 1e-6; every parallel forward); every table and coordinate tensor a rank's
    seam keeps between forwards has at most that rank's rows (never the whole sequence's: before, Wan's seam
    cached the whole grid's tables on every rank); the third forward builds no table (the cache hits). The camera
    cases (a seeded ``plucker`` adapter, its rays cut with the tokens) change the output, and equal one process."""
    for rank, results in enumerate(per_rank_tables):
        for case in TABLE_CASES[family]:
            name = "/".join(map(str, case))
            got = results[name]
            assert "error" not in got, f"rank {rank}, {name}: {got.get('error')}"
            assert got["difference"] <= 1e-6, f"rank {rank}, {name}: differs from one process by {got['difference']}"
            assert max(got["cached_rows"]) <= got["own_tokens"], f"rank {rank}, {name}: caches {got['cached_rows']}"
            assert got["second_forward_builds"] == 0, f"rank {rank}, {name}: tables rebuilt at the third forward"
            if family == "camera":
                assert got["camera_effect"] > 1e-3, f"rank {rank}, {name}: the camera changes nothing"


def test_two_process_branch_camera_adapters_are_refused_by_name(per_rank_tables):
    """``ucpe`` / ``prope`` (an attention branch over the whole sequence) under real context parallelism: a
    one-line error naming the kind and what runs instead, never a result."""
    for results in per_rank_tables:
        for case in REFUSED:
            kind = case[0].split("+")[1]
            error = results["/".join(map(str, case))].get("error", "")
            assert f"the '{kind}' camera adapter does not run under diffusers' context parallelism" in error
            assert "['plucker']" in error and "\n" not in error


# ring attention with a padded text mask: mmpos refuses it (even and uneven); stock diffusers (no mmpos) is wrong
QWEN_MASKED_RING = [
    ["qwen", "native", "ring", [4, 4, 8, 3], None],
    ["qwen", "rope_axial", "ring", [5, 5, 7, 2], None],
    ["qwen", "stock", "ring", [4, 4, 8, 3], None],
]


def test_two_process_qwen_ring_with_a_padded_text_mask_is_refused(per_rank_tables):
    """diffusers 0.42's even ring attention applies each rank's text mask to every rank's keys: without mmpos the
    output silently differs from one process (if this starts to hold, the refusal can go); with mmpos a one-line
    error names the mask and what runs instead, never a result."""
    for results in per_rank_tables:
        stock = results["/".join(map(str, QWEN_MASKED_RING[-1]))]
        assert stock["difference"] > 1e-3, f"stock diffusers' masked ring attention is now exact: {stock}"
        for case in QWEN_MASKED_RING[:-1]:
            error = results["/".join(map(str, case))].get("error", "")
            assert "encoder_hidden_states_mask masks text tokens" in error and "use ulysses_degree" in error
            assert "\n" not in error


# LTX inputs diffusers 0.42 cannot shard: a text mask (Ulysses keeps all its heads, ring applies each rank's mask
# to every rank's keys), per-token timesteps (the plan does not split them)
LTX_REFUSED = {
    "encoder_attention_mask is not supported": [
        ["ltx", "native", "ulysses", [2, 4, 4, 4, 1, 0], None],
        ["ltx", "native", "ring", [2, 4, 4, 4, 1, 0], None],
    ],
    "per-token timesteps": [["ltx", "native", "ring", [2, 4, 4, 4, 0, 1], None]],
}
LTX_REFUSED_CASES = [case for cases in LTX_REFUSED.values() for case in cases]


def test_two_process_ltx_inputs_diffusers_cannot_shard_are_refused_by_name(per_rank_tables):
    """An LTX text mask (ring: a silently wrong result; Ulysses: a broadcast error) and per-token timesteps (a
    shape error) under real context parallelism: a one-line error naming the input, never a result."""
    for results in per_rank_tables:
        for message, cases in LTX_REFUSED.items():
            for case in cases:
                error = results["/".join(map(str, case))].get("error", "")
                assert error.startswith(f"LTX-Video under diffusers' context parallelism: {message}"), error
                assert "\n" not in error


def test_ltx_rows_built_alone_are_the_whole_grids_rows(monkeypatch):
    """A context-parallel rank's LTX tables (its rows only, also from ``video_coords`` and with a schedule) equal,
    bit for bit, those rows of the one-process tables."""
    model = FAMILY_CASES["ltx"].model()
    set_pe(model, "native", extrapolation=model_extrapolation(model, "yarn", trained_grid=(2, 2)))
    seam = position_module(model)
    inputs = FAMILY_CASES["ltx"].inputs(rows=3, cols=5, frames=3)
    frames, rows, cols = inputs["num_frames"], inputs["height"], inputs["width"]
    video_coords = torch.cartesian_prod(*(torch.arange(n) * 2.0 for n in (frames, rows, cols))).T[None]  # [1, 3, S]
    calls = [
        (frames, rows, cols, inputs["rope_interpolation_scale"], None),
        (frames, rows, cols, None, None),
        (None, None, None, None, video_coords),
    ]
    for call in calls:
        monkeypatch.setattr(ltx, "own_rows", lambda *args: None)  # one process
        whole = ltx.ltx_tables(seam, inputs["hidden_states"], *call)
        for start, stop in [(0, 23), (23, 45), (7, 8)]:
            monkeypatch.setattr(ltx, "own_rows", lambda *args, rows=(start, stop): rows)
            part = ltx.ltx_tables(seam, inputs["hidden_states"][:, start:stop], *call)
            for got, want in zip(part, whole):
                assert torch.equal(got, want[:, start:stop])
    stock = FAMILY_CASES["ltx"].model().rope(inputs["hidden_states"], *calls[-1])
    assert not torch.allclose(stock[0], whole[0])  # the schedule changed the tables


def test_ltx_rank_with_another_token_count_than_its_rows_is_refused(monkeypatch):
    model = FAMILY_CASES["ltx"].model()
    set_pe(model, "native")
    inputs = FAMILY_CASES["ltx"].inputs(rows=2, cols=2)
    monkeypatch.setattr(ltx.context_parallel, "own_output_split", lambda module, name: object())
    monkeypatch.setattr(ltx.context_parallel, "own_rows", lambda hook, length: (0, 3))
    with pytest.raises(
        ValueError, match="hidden_states has 8 tokens on this rank, the plan gives it rows 0:3 of the 8"
    ):
        ltx.ltx_tables(position_module(model), inputs["hidden_states"], 2, 2, 2)


def test_set_pe_after_enable_parallelism_on_ltx_is_refused():
    model = FAMILY_CASES["ltx"].model()
    model._parallel_config = object()  # what enable_parallelism records
    with pytest.raises(RuntimeError, match="before enable_parallelism"):
        set_pe(model, "native")


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


@pytest.mark.parametrize("shape,start,stop", [((2, 4, 3), 0, 24), ((2, 4, 3), 5, 17), ((1, 3, 5), 8, 15), ((7,), 2, 2)])
def test_grid_rows_are_those_rows_of_the_grid(shape, start, stop):
    """A Wan rank's coordinates, built without the rest of the grid."""
    assert torch.equal(grid_rows(shape, start, stop), grid_coords(shape)[start:stop])


def test_grid_rows_outside_the_grid_are_refused():
    with pytest.raises(ValueError, match="rows 20:25 are outside the 24 cells of the grid"):
        grid_rows((2, 4, 3), 20, 25)
