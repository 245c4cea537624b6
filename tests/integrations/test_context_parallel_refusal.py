"""Families without a verified context-parallel plan are refused by name, never run on shards (issue 33).

One process: diffusers' ``enable_parallelism`` records its ``ParallelConfig`` on the model as ``_parallel_config``
(``ModelMixin._resolve_parallel_config`` in diffusers 0.42.1) before it hooks the plan; the tests record the same
object (a ``ContextParallelConfig`` of degree 2 inside a ``ParallelConfig``) without a process group, which is all
mmpos reads. Every registered family with ``context_parallel=False`` (tiny models of ``mmpos.integrations.diffusers.families.tiny``) refuses a
forward with mmpos installed, and ``set_pe`` on a model already parallel; the verified families run it. A real
2-process case (Chroma under FLUX.1's plan, given as the caller's ``cp_plan``) is ``cp_refuse_worker.py``.
"""

import json
import os

import pytest
import torch
from diffusers import ContextParallelConfig
from diffusers.models._modeling_parallel import ParallelConfig, TensorParallelConfig

from mmpos.integrations.diffusers import set_pe
from mmpos.integrations.diffusers.families import builtin_families, get_family
from mmpos.integrations.diffusers.families.tiny import CASES, output
from mmpos.integrations.diffusers.parallelism import verified_families
from tests.integrations.test_context_parallel import TABLE_CASES, torchrun

pytestmark = pytest.mark.usefixtures("one_thread")
REFUSED = [name for name in builtin_families() if not get_family(name).context_parallel]
VERIFIED = verified_families()
WORKER = os.path.join(os.path.dirname(__file__), "..", "workers", "cp_refuse_worker.py")


def context_parallel() -> ParallelConfig:
    """What ``enable_parallelism(config=ContextParallelConfig(ulysses_degree=2))`` records on the model."""
    return ParallelConfig(context_parallel_config=ContextParallelConfig(ulysses_degree=2))


def installs(name):
    """The ``set_pe`` calls a family takes: ``"native"``, and on tier 2 ``"rope_axial"`` (mmpos processors)."""
    return ["native", "rope_axial"] if get_family(name).tier == 2 else ["native"]


def forward(model, inputs):
    with torch.no_grad():
        return output(model(**inputs, return_dict=False))


def assert_refusal(error, name):
    message = str(error)
    assert f"(family {name!r}) under diffusers' context parallelism" in message
    assert f"mmpos has not verified the {name} seam" in message and "\n" not in message
    assert "data parallel" in message and ", ".join(VERIFIED) in message  # what runs instead


def test_every_verified_family_has_a_two_process_test():
    """``context_parallel=True`` is a claim: each such family has its cases in test_context_parallel's 2-process run."""
    assert VERIFIED and set(VERIFIED) <= set(TABLE_CASES)
    assert set(REFUSED) | set(VERIFIED) == set(builtin_families())


@pytest.mark.parametrize("name,pe", [(name, pe) for name in REFUSED for pe in installs(name)])
def test_a_forward_of_an_unverified_family_under_context_parallelism_is_refused_by_name(name, pe):
    case = CASES[name]
    model, inputs = case.model(), case.inputs(*case.grid)
    set_pe(model, pe)
    forward(model, inputs)  # runs in one process
    model._parallel_config = context_parallel()
    with pytest.raises(RuntimeError) as refused:
        forward(model, inputs)
    assert_refusal(refused.value, name)


@pytest.mark.parametrize("name", REFUSED)
def test_set_pe_on_an_unverified_family_already_parallel_is_refused_by_name(name):
    model = CASES[name].model()
    model._parallel_config = context_parallel()
    stock = getattr(model, get_family(name).position_attr, None)  # None: a rotary-input family (CogVideoX)
    with pytest.raises(RuntimeError) as refused:
        set_pe(model, "native")
    assert_refusal(refused.value, name)
    # == : a seam that is a method (JoyImage) is a new bound object at each access; modules compare by identity
    assert getattr(model, get_family(name).position_attr, None) == stock and not model._forward_pre_hooks


def test_the_refusal_says_when_diffusers_has_no_plan():
    """The message says whether the class has a ``_cp_plan`` in the installed diffusers (0.42.1: none for Chroma;
    LTX-2, MiniMax H3 and Helios have one that mmpos has not verified)."""
    planned = [name for name in REFUSED if type(CASES[name].model())._cp_plan is not None]
    for name in ["chroma"] + planned:
        model = CASES[name].model()
        model._parallel_config = context_parallel()
        with pytest.raises(RuntimeError) as refused:
            set_pe(model, "native")
        says = f"({type(model).__name__} has no _cp_plan in diffusers 0.42.1: the plan is the caller's)"
        assert (says in str(refused.value)) is (name not in planned)


@pytest.mark.parametrize("name", VERIFIED)
def test_verified_families_are_not_refused(name):
    """The mark alone (no plan hooked, processors unaware) leaves a one-process forward: the output is unchanged."""
    case = CASES[name]
    model, inputs = case.model(), case.inputs(*case.grid)
    set_pe(model, "rope_axial")
    alone = forward(model, inputs)
    model._parallel_config = context_parallel()
    assert torch.equal(forward(model, inputs), alone)


def test_tensor_parallelism_is_refused_on_every_family():
    model = CASES["flux"].model()
    set_pe(model, "native")
    model._parallel_config = ParallelConfig(tensor_parallel_config=TensorParallelConfig(tp_degree=2))
    with pytest.raises(RuntimeError, match="'flux'\\) under diffusers' tensor parallelism is refused"):
        forward(model, CASES["flux"].inputs(4, 4))


def test_two_process_plan_on_an_unverified_family_is_refused_by_name(tmp_path):
    """Real ``enable_parallelism`` (2 processes, gloo) with FLUX.1's plan given as Chroma's ``cp_plan``: the stock
    model runs under it (fp32, <= 1e-6 from one process); with ``set_pe`` the forward, and ``set_pe`` after it, are
    refused by name on each rank. What the refusal prevents: with it bypassed, DyPE at twice the training grid
    differs from one process (the seam splits text from image rows by the whole sequence's text-token count, so
    each rank measures a wrong image extent)."""
    torchrun(WORKER, tmp_path)
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["stock_shape"] == got["one_process_shape"] and got["stock_difference"] <= 1e-6
        assert got["bypassed"]["dype"] > 1e-3, f"rank {rank}: bypassed DyPE is {got['bypassed']}"
        for what in ("forward", "set_pe"):
            assert "error" in got[what], f"rank {rank}: {what} under the plan was not refused: {got[what]}"
            assert_refusal(got[what]["error"], "chroma")
            assert got[what]["error"].startswith({"forward": "a forward with", "set_pe": "set_pe on"}[what])
