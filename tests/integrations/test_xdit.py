"""xDiT (xfuser, not installed here) and camera adapters under context parallelism: refused by name, never silently
wrong. xDiT is faked: a processor class whose module is xfuser's, and xfuser's parallel-state module in
``sys.modules`` with an initialised sequence-parallel group (what ``xfuser.core.distributed.initialize_model_parallel``
leaves there)."""

import sys
import types

import pytest
import torch

from mmpos.camera import preset_trajectory
from mmpos.camera.video import video_cameras
from mmpos.integrations.diffusers import ProcessorInstaller, restore, set_pe
from mmpos.integrations.diffusers.camera_adapter import CameraAdapter, camera_conditioning, install_camera_adapter
from mmpos.integrations.diffusers.xdit import parallel_degrees
from tests.fixtures.tiny_models import tiny_flux, tiny_flux_inputs, tiny_wan, tiny_wan_inputs

pytestmark = pytest.mark.usefixtures("one_thread")
STATE = "xfuser.core.distributed.parallel_state"


class FakeXDiTProcessor:
    def __call__(self, attn, hidden_states, *args, **kwargs):
        raise AssertionError("never called")


FakeXDiTProcessor.__module__ = "xfuser.model_executor.layers.attention_processor"


def xdit_state(monkeypatch, sequence=2, pipeline=1, tensor=1):
    """xfuser's parallel-state module as ``initialize_model_parallel`` leaves it (groups with a ``world_size``)."""
    state = types.ModuleType(STATE)
    state._SP, state._PP, state._TP = (types.SimpleNamespace(world_size=n) for n in (sequence, pipeline, tensor))
    monkeypatch.setitem(sys.modules, STATE, state)
    return state


@pytest.mark.parametrize("make", [tiny_flux, tiny_wan])
@pytest.mark.parametrize("pe", ["native", "rope_axial"])
def test_set_pe_on_xdit_processors_is_refused_naming_both(make, pe):
    model = make()
    model.set_attn_processor(FakeXDiTProcessor())
    with pytest.raises(TypeError) as error:
        set_pe(model, pe)
    message = str(error.value)
    assert "FakeXDiTProcessor" in message and "xfuser.model_executor" in message and "\n" not in message
    assert "enable_parallelism" in message  # what to do instead
    assert getattr(model, "_mmpos_installed", None) is None


def test_installing_over_xdit_processors_is_refused():
    model = tiny_wan()
    model.set_attn_processor(FakeXDiTProcessor())
    with pytest.raises(TypeError, match="xDiT's FakeXDiTProcessor"):
        ProcessorInstaller.of(model)


@pytest.mark.parametrize("make", [tiny_flux, tiny_wan])
def test_set_pe_under_xdit_sequence_parallelism_is_refused(make, monkeypatch):
    """The stock processors put back (what the old error advised) under xDiT's USP state: refused, by name."""
    xdit_state(monkeypatch, sequence=2)
    with pytest.raises(RuntimeError) as error:
        set_pe(make(), "native")
    assert "set_pe under xDiT (xfuser) parallelism (sequence degree 2)" in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("pe", ["native", "rope_mixed"])
def test_a_forward_after_xdit_parallelism_starts_is_refused(pe, monkeypatch):
    model, inputs = tiny_flux(), tiny_flux_inputs()
    set_pe(model, pe)
    with torch.no_grad():
        model(**inputs)
    xdit_state(monkeypatch, sequence=1, pipeline=2)
    with pytest.raises(RuntimeError, match=r"under xDiT \(xfuser\) parallelism \(pipeline degree 2\)"), torch.no_grad():
        model(**inputs)


def test_xdit_state_without_parallel_groups_is_not_refused(monkeypatch):
    """Data or CFG parallelism only (sequence, pipeline and tensor degree 1): every rank runs the whole sequence."""
    xdit_state(monkeypatch, sequence=1)
    assert parallel_degrees() == {}
    model, inputs = tiny_wan(), tiny_wan_inputs()
    with torch.no_grad():
        stock = model(**inputs).sample
        set_pe(model, "native")
        assert torch.equal(model(**inputs).sample, stock)
    restore(model)


def test_an_unreadable_xdit_group_counts_as_parallel(monkeypatch):
    state = xdit_state(monkeypatch)
    state._SP = object()  # no world_size: refuse rather than guess
    assert parallel_degrees() == {"sequence": None}
    with pytest.raises(RuntimeError, match="sequence degree unknown"):
        set_pe(tiny_wan(), "native")


# ---- camera adapters under diffusers' context parallelism --------------------------------------------------------
def cameras():
    return video_cameras(preset_trajectory("orbit", 5), (2, 4, 3), (64, 48))


@pytest.mark.parametrize("kind", ["ucpe", "prope"])
def test_a_branch_camera_adapter_on_a_context_parallel_model_is_refused(kind):
    model = tiny_wan()
    adapter = CameraAdapter.for_transformer(model, kind)
    model._parallel_config = object()  # what enable_parallelism records
    with pytest.raises(RuntimeError, match=f"the '{kind}' camera adapter does not run under diffusers' context"):
        with camera_conditioning(model, adapter, cameras()):
            pass
    assert ProcessorInstaller.find(model) is None  # nothing was installed


@pytest.mark.parametrize("kind", ["ucpe", "prope"])
def test_context_parallelism_enabled_after_a_branch_camera_adapter_is_refused_at_the_call(kind):
    """enable_parallelism sets ``_parallel_config`` on the processors it finds (the camera level's): the next
    call is refused instead of running the branch over each rank's shard only."""
    model = tiny_wan()
    set_pe(model, "native")
    adapter = CameraAdapter.for_transformer(model, kind)
    install_camera_adapter(model, adapter.conditioning(cameras()))
    for processor in model.attn_processors.values():  # as enable_parallelism does
        if hasattr(processor, "_parallel_config"):
            processor._parallel_config = object()
    with pytest.raises(RuntimeError, match="plucker"), torch.no_grad():  # names what runs under it
        model(**tiny_wan_inputs(frames=2, height=8, width=6))
