"""Camera adapters under diffusers' context parallelism on the families other than Wan (Wan's cases:
``test_context_parallel.py``), 2 real processes (torchrun, gloo, ``OMP_NUM_THREADS=1``; ``cp_camera_worker.py``).

diffusers 0.42.1 gives a ``_cp_plan`` to LTX-2 only of the other camera families (HunyuanVideo 1.5, SkyReels-V2 and
Cosmos have none: refused by name, ``test_camera_adapter_families.py``). LTX-2's plan leaves ``cross_attn_rope``
whole: a stock forward under it fails (measured here); on :func:`ltx2_context_parallel_plan` (that plan with
``cross_attn_rope`` split as ``rope``, no text mask entry) the stock model and a ``plucker`` adapter on it equal
one process, even and uneven, Ulysses and ring; what the plan does not shard is refused by name.
"""

import json
from pathlib import Path

import pytest
from diffusers import LTX2VideoTransformer3DModel

from mmpos.integrations.diffusers.families.ltx2 import ltx2_context_parallel_plan
from tests.integrations.test_context_parallel import torchrun

WORKER = Path(__file__).parents[1] / "workers" / "cp_camera_worker.py"
pytestmark = pytest.mark.usefixtures("one_thread")

# [kind, mode, plan, (frames, rows, cols, text, audio), variant]; odd token counts run with *_anything
EQUAL = [
    ["plucker", "ulysses", "mmpos", [2, 4, 4, 4, 6], "cameras"],
    ["plucker", "ring", "mmpos", [2, 4, 4, 4, 6], "path"],
    ["plucker", "ulysses", "mmpos", [1, 3, 5, 3, 5], "path"],
    ["plucker", "ring", "mmpos", [3, 3, 3, 4, 6], "cameras"],
]
ZERO = [["plucker", "ulysses", "mmpos", [1, 3, 5, 3, 5], "zero"]]
STOCK = [["", "ring", "mmpos", [1, 3, 5, 3, 5], "cameras"]]
DIFFUSERS_PLAN = [["", "ring", "diffusers", [2, 4, 4, 4, 6], "none_mask"]]
REFUSED = {
    "the plan leaves cross_attn_rope whole": [["plucker", "ulysses", "diffusers", [2, 4, 4, 4, 6], "cameras"]],
    "encoder_attention_mask is not supported": [["plucker", "ring", "mmpos", [2, 4, 4, 4, 6], "mask"]],
    "mmpos has not verified the ltx2 seam": [["plucker", "ulysses", "mmpos", [2, 4, 4, 4, 6], "set_pe"]],
    "the 'ucpe' camera adapter does not run": [["ucpe", "ring", "mmpos", [2, 4, 4, 4, 6], "cameras"]],
}
REFUSED_CASES = [case for cases in REFUSED.values() for case in cases]


def name(case):
    return "/".join(map(str, case))


@pytest.fixture(scope="module")
def per_rank(tmp_path_factory):
    """One 2-process run of every case: per rank, per case, what cp_camera_worker.py records."""
    out = tmp_path_factory.mktemp("cp_camera")
    torchrun(WORKER, out, json.dumps(EQUAL + ZERO + STOCK + DIFFUSERS_PLAN + REFUSED_CASES))
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_ltx2_plucker_under_context_parallelism_equals_one_process(per_rank):
    """Video and audio outputs within 1e-6 of one process (fp32; measured <= 4.8e-7) at both parallel forwards; the
    camera changes the output (> 1e-2), so its rays were cut with the tokens, not dropped."""
    for rank, results in enumerate(per_rank):
        for case in EQUAL:
            got = results[name(case)]
            assert "error" not in got, f"rank {rank}, {name(case)}: {got.get('error')}"
            assert got["video"] <= 1e-6 and got["audio"] <= 1e-6, f"rank {rank}, {name(case)}: {got}"
            assert got["camera_effect"] > 1e-2 and got["parallel_camera_effect"] > 1e-2, f"rank {rank}: {got}"


def test_ltx2_zero_initialised_adapter_under_context_parallelism_is_bit_identical(per_rank):
    """An adapter as initialised adds exact zeros on each rank's shard: the parallel output is bit-identical to the
    parallel output without it (and within 1e-6 of one process)."""
    for results in per_rank:
        for case in ZERO:
            got = results[name(case)]
            assert got["parallel_camera_effect"] == 0.0 and got["camera_effect"] == 0.0, got
            assert got["video"] <= 1e-6 and got["audio"] <= 1e-6, got


def test_ltx2_stock_model_on_the_mmpos_plan_equals_one_process(per_rank):
    """Without a camera (no mmpos installed) the plan alone: the whole audio on every rank attends to duplicated
    audio keys, which is the one-process attention."""
    for results in per_rank:
        for case in STOCK:
            got = results[name(case)]
            assert "error" not in got and got["video"] <= 1e-6 and got["audio"] <= 1e-6, got


def test_diffusers_ltx2_plan_fails_without_mmpos(per_rank):
    """diffusers 0.42.1's own plan: a stock forward (the text mask passed as None, as its plan asks) fails on the
    cross-modal table left whole. If this starts to run, ltx2_context_parallel_plan can go."""
    for results in per_rank:
        error = results[name(DIFFUSERS_PLAN[0])].get("error", "")
        assert "must match the size of tensor b" in error, error


def test_what_the_plan_does_not_shard_is_refused_by_name(per_rank):
    for results in per_rank:
        for message, cases in REFUSED.items():
            for case in cases:
                error = results[name(case)].get("error", "")
                assert message in error and "\n" not in error, error


def test_ltx2_context_parallel_plan_is_diffusers_plan_with_cross_attn_rope_split():
    stock, plan = LTX2VideoTransformer3DModel._cp_plan, ltx2_context_parallel_plan()
    assert plan["cross_attn_rope"] == plan["rope"] == stock["rope"] and "cross_attn_rope" not in stock
    assert set(plan[""]) == set(stock[""]) - {"encoder_attention_mask"}
    assert {key: plan[key] for key in stock if key != ""} == {key: stock[key] for key in stock if key != ""}
