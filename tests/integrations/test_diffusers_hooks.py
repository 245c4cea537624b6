"""mmpos' encodings as diffusers hooks (:mod:`mmpos.integrations.diffusers.hooks`): ``apply_pe`` / ``apply_dype``
register one ``ModelHook`` in the model's ``HookRegistry``; ``set_pe`` / ``restore`` are thin wrappers over them.
The properties diffusers' hook tests check: removal through the registry gives the stock model back bit for bit,
hooks stack with diffusers' own (First-Block Cache) in either order, and a deep copy is independent.
"""

import copy
import inspect

import pytest
import torch
from diffusers.hooks import FirstBlockCacheConfig, HookRegistry, apply_first_block_cache

from mmpos.integrations.diffusers import (
    PE_HOOK,
    DyPEConfig,
    PEConfig,
    apply_dype,
    apply_pe,
    model_extrapolation,
    position_module,
    restore,
    set_pe,
)
from mmpos.integrations.diffusers.families import builtin_families, get_family
from mmpos.integrations.diffusers.families.tiny import CASES, run

TIER2 = [name for name in builtin_families() if get_family(name).tier == 2]


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def registry(model) -> HookRegistry:
    return HookRegistry.check_if_exists_or_initialize(model)


@pytest.mark.parametrize("family", TIER2 + ["ltx"])  # every tier-2 family, and a tier-1 one
def test_registry_removal_gives_the_stock_model_back_bit_for_bit(family):
    case = CASES[family]
    model = case.model()
    inputs = case.inputs(*case.grid)
    stock = run(model, inputs)
    position = getattr(model, get_family(family).position_attr)
    processors = {name: m.processor for name, m in model.named_modules() if hasattr(m, "set_processor")}
    pe = "rope_axial" if get_family(family).tier == 2 else "native"
    apply_pe(model, PEConfig(pe, options={"theta": 500.0}))
    assert registry(model).get_hook(PE_HOOK) is not None and PE_HOOK in repr(registry(model))
    assert (run(model, inputs) - stock).abs().max() > 1e-4

    registry(model).remove_hook(PE_HOOK)
    assert torch.equal(run(model, inputs), stock)
    assert getattr(model, get_family(family).position_attr) is position
    assert {n: m.processor for n, m in model.named_modules() if hasattr(m, "set_processor")} == processors
    assert model.forward.__func__ is type(model).forward and model._mmpos_installed is None  # the class's forward
    with pytest.raises(ValueError, match="call set_pe first"):
        restore(model)


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_apply_pe_is_set_pe_and_restore_removes_the_hook(family):
    case = CASES[family]
    inputs = case.inputs(*case.grid)
    first, second = case.model(), case.model()
    set_pe(first, "rope_axial", coord_axes=(1, 2), theta=300.0)
    apply_pe(second, PEConfig("rope_axial", coord_axes=(1, 2), options={"theta": 300.0}))
    assert torch.equal(run(first, inputs), run(second, inputs))
    assert inspect.signature(second.forward) == inspect.signature(case.model().forward)  # pipelines inspect it
    restore(second)
    assert registry(second).get_hook(PE_HOOK) is None


def test_apply_pe_twice_replaces_the_encoding():
    case = CASES["flux"]
    model, inputs = case.model(), case.inputs(*case.grid)
    stock = run(model, inputs)
    apply_pe(model, PEConfig("rope_axial", options={"theta": 300.0}))
    apply_pe(model, PEConfig("native"))
    assert registry(model)._hook_order.count(PE_HOOK) == 1
    assert torch.equal(run(model, inputs), stock)


@pytest.mark.parametrize("family", ["flux", "wan", "flux2", "qwen", "z_image"])
def test_apply_dype_is_the_dype_preset_of_model_extrapolation(family):
    case = CASES[family]
    rows, cols = case.grid
    inputs = case.inputs(2 * rows, 2 * cols, sigma=0.8)
    by_preset, by_config = case.model(), case.model()
    extrapolation = model_extrapolation(by_preset, "dype", case.grid, lambda_t=1.5)
    set_pe(by_preset, "native", extrapolation=extrapolation)
    apply_dype(by_config, DyPEConfig(trained_grid=case.grid, lambda_t=1.5))
    stock = run(case.model(), inputs)
    dype = run(by_config, inputs)
    assert torch.equal(dype, run(by_preset, inputs))
    assert (dype - stock).abs().max() > 1e-5  # twice the grid: DyPE changes the spectrum
    entries = position_module(by_config).encodings[0].schedule.entries
    (schedule,) = {e for e in entries if getattr(e, "dynamic", False)}
    assert (schedule.method, schedule.lambda_t) == ("vision_yarn", 1.5)


def test_dype_config_refuses_an_unknown_method():
    with pytest.raises(ValueError, match=r"DyPEConfig.method='pi'.*\['vision_yarn', 'yarn', 'ntk'\]"):
        apply_dype(CASES["flux"].model(), DyPEConfig(trained_grid=(4, 4), method="pi"))
    with pytest.raises(TypeError, match="config must be a PEConfig"):
        apply_pe(CASES["flux"].model(), DyPEConfig(trained_grid=(4, 4)))


def _cached_steps(model, inputs):
    """Two forwards under First-Block Cache (the second with a slightly different latent: the cache decides)."""
    moved = dict(inputs, hidden_states=inputs["hidden_states"] * 1.001)
    with model.cache_context("cond"):
        return run(model, inputs), run(model, moved)


@pytest.mark.parametrize("family", ["flux", "wan"])
@pytest.mark.parametrize("threshold", [1e-9, 10.0])  # never / always reuse the cached tail
def test_first_block_cache_stacks_in_either_order(family, threshold):
    case = CASES[family]
    inputs = case.inputs(*case.grid)
    config = PEConfig("rope_axial", options={"theta": 300.0})

    plain = case.model()
    apply_pe(plain, config)
    uncached = run(plain, inputs)

    pe_first, cache_first = case.model(), case.model()
    apply_pe(pe_first, config)
    apply_first_block_cache(pe_first, FirstBlockCacheConfig(threshold=threshold))
    apply_first_block_cache(cache_first, FirstBlockCacheConfig(threshold=threshold))
    apply_pe(cache_first, config)
    a, b = _cached_steps(pe_first, inputs), _cached_steps(cache_first, inputs)
    assert torch.equal(a[0], uncached) and torch.equal(b[0], uncached)  # the first step computes every block
    assert torch.equal(a[1], b[1])
    if threshold > 1:  # the second step reused the first's tail: its change is smaller than a full forward's
        full = run(plain, dict(inputs, hidden_states=inputs["hidden_states"] * 1.001))
        assert not torch.equal(a[1], full)

    # mmpos off, the cache stays: both equal the stock model under the same cache
    stock = case.model()
    apply_first_block_cache(stock, FirstBlockCacheConfig(threshold=threshold))
    reference = _cached_steps(stock, inputs)
    for model in (pe_first, cache_first):
        restore(model)
        registry(model).reset_stateful_hooks()  # as a pipeline does before a new generation
        steps = _cached_steps(model, inputs)
        assert torch.equal(steps[0], reference[0]) and torch.equal(steps[1], reference[1])


def test_a_deep_copy_runs_its_own_weights():
    """The registry's wrapper is a closure that a deep copy would share (the copy running the original's
    layers); mmpos' hook forward is copied with the model."""
    case = CASES["flux"]
    model, inputs = case.model(), case.inputs(*case.grid)
    apply_pe(model, PEConfig("rope_axial"))
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone.proj_out.weight.mul_(2.0)
    before = run(model, inputs)
    assert not torch.equal(run(clone, inputs), before)
    reference = copy.deepcopy(clone)
    restore(reference)
    apply_pe(reference, PEConfig("rope_axial"))
    assert torch.equal(run(clone, inputs), run(reference, inputs))


def _taylorseer():
    from diffusers.hooks import TaylorSeerCacheConfig

    return TaylorSeerCacheConfig(cache_interval=2, disable_cache_before_step=1, taylor_factors_dtype=torch.float32)


CACHES = {"first_block_cache": lambda: FirstBlockCacheConfig(threshold=0.05), "taylorseer": _taylorseer}


def _steps(model, inputs, count=5):
    """``count`` denoising-like forwards (the latent drifts) in one cache context."""
    outs = []
    with model.cache_context("cond"):
        for step in range(count):
            outs.append(run(model, dict(inputs, hidden_states=inputs["hidden_states"] * (1 - 0.01 * step))))
    return torch.stack(outs)


@pytest.mark.parametrize(  # TaylorSeer leaves the tiny Wan's steps unchanged: nothing to compare there
    "family,cache", [("flux", "first_block_cache"), ("wan", "first_block_cache"), ("flux", "taylorseer")]
)
def test_cache_hooks_over_several_steps_stack_in_either_order(family, cache):
    """Several steps under a diffusers cache (``enable_cache``): mmpos before or after the cache gives the same steps,
    and mmpos ``"native"`` under the cache gives the stock model's steps under it."""
    case = CASES[family]
    inputs = case.inputs(*case.grid)
    config = PEConfig("rope_axial", options={"theta": 300.0})
    pe_first, cache_first, native, stock = (case.model() for _ in range(4))
    apply_pe(pe_first, config)
    pe_first.enable_cache(CACHES[cache]())
    cache_first.enable_cache(CACHES[cache]())
    apply_pe(cache_first, config)
    assert torch.equal(_steps(pe_first, inputs), _steps(cache_first, inputs))
    native.enable_cache(CACHES[cache]())
    apply_pe(native, PEConfig("native"))
    stock.enable_cache(CACHES[cache]())
    cached = _steps(stock, inputs)
    assert torch.equal(_steps(native, inputs), cached)
    uncached = torch.stack(
        [run(case.model(), dict(inputs, hidden_states=inputs["hidden_states"] * (1 - 0.01 * s))) for s in range(5)]
    )
    assert not torch.equal(cached, uncached)  # the cache did skip work
