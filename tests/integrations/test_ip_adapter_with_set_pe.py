"""An IP-Adapter and ``set_pe`` on FLUX.1, in either order: refused by an error naming the fix, and the model is left
as it was (the set_pe result, or the IP-Adapter model). The IP-Adapter runs with the stock PE and under the edits
(docs/editing.md)."""

import pytest
import torch

from mmpos.integrations.diffusers import restore, set_pe
from tests.fixtures.tiny_models import load_tiny_ip_adapter, tiny_flux, tiny_flux_inputs


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def test_set_pe_after_an_ip_adapter_is_refused_naming_unload_ip_adapter():
    model = load_tiny_ip_adapter(tiny_flux())
    processors, position = dict(model.attn_processors), model.pos_embed
    with pytest.raises(TypeError, match=r"FluxIPAdapterAttnProcessor.*unload_ip_adapter\(\) first"):
        set_pe(model, "rope_axial")
    assert model.attn_processors == processors and getattr(model, "_mmpos_installed", None) is None
    assert model.pos_embed is position  # nothing was installed


def test_an_ip_adapter_after_set_pe_is_refused_naming_set_pe():
    model, inputs = tiny_flux(), tiny_flux_inputs()
    set_pe(model, "rope_axial", theta=300.0)
    installed = run(model, inputs)
    with pytest.raises(TypeError, match="made by set_pe.*load_ip_adapter after set_pe is not supported"):
        load_tiny_ip_adapter(model)
    assert torch.equal(run(model, inputs), installed)  # the set_pe model still runs, unchanged
    restore(model)
    assert torch.equal(run(model, inputs), run(tiny_flux(), inputs))
