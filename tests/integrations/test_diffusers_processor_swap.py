"""A stock processor set after ``set_pe`` (``set_attn_processor``, as diffusers' tests, ``set_default_attn_processor``
-style helpers and third-party loaders do): every tier-2 family's forward then equals the set_pe result or the stock
one, or is refused by an error that names set_pe and restore (never silently different: on Wan it was).
"""

import pytest
import torch

from mmpos.integrations.diffusers import restore, set_pe
from mmpos.integrations.diffusers.families import builtin_families, get_family
from mmpos.integrations.diffusers.families.tiny import CASES, run

TIER2 = [name for name in builtin_families() if get_family(name).tier == 2]


def stock_processors(model) -> dict:
    """A fresh stock processor per attention module, of the class each had before mmpos."""
    return {name: type(m.processor)() for name, m in model.named_modules() if hasattr(m, "set_processor")}


def set_processors(model, processors: dict) -> None:
    """``model.set_attn_processor`` where the model has it (Z-Image has not: each module's ``set_processor``)."""
    if hasattr(model, "set_attn_processor"):
        model.set_attn_processor({f"{name}.processor": p for name, p in processors.items()})
    else:
        for name, module in model.named_modules():
            if name in processors:
                module.set_processor(processors[name])


@pytest.mark.parametrize("pe", ["native", "rope_axial"])
@pytest.mark.parametrize("family", TIER2)
def test_a_stock_processor_set_after_set_pe_is_correct_or_refused_by_name(family, pe):
    torch.set_num_threads(1)
    case = CASES[family]
    model = case.model()
    inputs = case.inputs(*case.grid)
    stock = run(model, inputs)
    fresh = stock_processors(model)
    # a spectrum that differs from the stock one, so that "equals set_pe" and "equals stock" are told apart
    set_pe(model, pe, theta=500.0)
    installed = run(model, inputs)
    assert (installed - stock).abs().max() > 1e-4

    set_processors(model, fresh)
    try:
        swapped = run(model, inputs)
    except RuntimeError as error:
        assert "set_pe" in str(error) and "restore" in str(error)
    else:
        assert torch.equal(swapped, installed) or torch.equal(swapped, stock)

    restore(model)
    assert torch.equal(run(model, inputs), stock)


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_the_refusal_names_the_layer_and_the_processors(family):
    case = CASES[family]
    model = case.model()
    inputs = case.inputs(*case.grid)
    set_pe(model, "rope_axial")
    name, _ = get_family(family).attention_modules(model)[0]
    module = dict(model.named_modules())[name]
    stock = get_family(family).stock_processor()
    module.set_processor(stock())
    with pytest.raises(RuntimeError, match=rf"{name} runs {stock.__name__}, not the \w+PEAttnProcessor"):
        run(model, inputs)
