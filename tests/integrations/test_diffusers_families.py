"""Conformance suite: every registered diffusers family, on a tiny config built here (:mod:`mmpos.integrations.diffusers.families.tiny`).

Parametrised over the registry like timm's ``test_models.py``: a family is tested by being registered, and a
registered family without a tiny case fails. Rows: native == stock bit for bit (fp32, bf16); restore == stock;
every preset at the training grid == stock; DyPE at twice the grid finite and different, with a table build per
distinct sigma; the seam runs as often as the stock position module; tier 2: an mmpos processor path == stock.
"""

import os

import pytest
import torch

from mmpos.integrations.diffusers import model_extrapolation, position_module, restore, set_pe
from mmpos.integrations.diffusers.families import builtin_families, get_family
from mmpos.integrations.diffusers.families.tiny import CASES, output, run
from mmpos.spectrum.schedule import PRESETS
from tests.fixtures.asserts import in_fresh_memory

FAMILIES = builtin_families()


def cast(inputs, dtype, case=None):
    """Floating inputs (not ids) in ``dtype``; in bf16, without the case's ``cpu_bf16_unsupported`` inputs."""
    dropped = set(case.cpu_bf16_unsupported) if case is not None and dtype == torch.bfloat16 else set()

    def to(v):  # a tensor, or a list of them (Z-Image takes its latents and captions as lists)
        if isinstance(v, (list, tuple)):
            return type(v)(to(item) for item in v)
        return v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    return {k: v if k.endswith("ids") else to(v) for k, v in inputs.items() if k not in dropped}


def test_every_registered_family_has_a_tiny_case():
    assert sorted(CASES) == FAMILIES


@pytest.fixture(params=FAMILIES)
def family(request):
    torch.set_num_threads(1)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_and_restore_are_stock_bit_for_bit(family, dtype):
    case = CASES[family]
    model = case.to(case.model(), dtype)
    inputs = cast(case.inputs(*case.grid), dtype, case)
    stock = run(model, inputs)
    set_pe(model, "native")
    assert torch.equal(run(model, inputs), stock)
    restore(model)
    assert torch.equal(run(model, inputs), stock)
    assert getattr(model, "_mmpos_installed") is None


def test_save_and_load_with_set_pe_installed_is_the_stock_checkpoint(family, tmp_path):
    """``save_pretrained`` with the seam installed writes the stock weights and config (no mmpos state): the stock
    class loads them and computes the stock output; ``set_pe`` on the loaded model is stock again."""
    case = CASES[family]
    model = case.model()
    inputs = case.inputs(*case.grid)
    stock = run(model, inputs)
    keys = sorted(model.state_dict())
    set_pe(model, "native")
    assert sorted(model.state_dict()) == keys
    model.save_pretrained(tmp_path)
    loaded = in_fresh_memory(type(model).from_pretrained(tmp_path).eval())
    assert torch.equal(run(loaded, inputs), stock)
    set_pe(loaded, "native")
    assert torch.equal(run(loaded, inputs), stock)


def test_native_follows_a_dtype_move_after_set_pe(family):
    """``model.to(bfloat16)`` after ``set_pe``: the seam's tables follow the cast as the stock module's would, and
    ``restore`` gives the stock model cast the same way (its position module follows the cast it missed)."""
    case = CASES[family]
    stock, model = case.to(case.model(), torch.bfloat16), case.model()
    set_pe(model, "native")
    case.to(model, torch.bfloat16)
    inputs = cast(case.inputs(*case.grid), torch.bfloat16, case)
    expected = run(stock, inputs)
    assert torch.equal(run(model, inputs), expected)
    restore(model)
    assert torch.equal(run(model, inputs), expected)


def test_save_and_load_with_set_pe_give_the_stock_checkpoint(family, tmp_path):
    """``save_pretrained`` with ``set_pe`` (DyPE) installed writes the stock checkpoint (the same tensors, no mmpos
    key); it loads into the stock class, which computes the stock output."""
    from safetensors.torch import load_file

    case = CASES[family]
    model = case.model()
    inputs = case.inputs(*case.grid)
    stock = run(model, inputs)
    expected = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    set_pe(model, "native", extrapolation=case.dype(model))
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "diffusion_pytorch_model.safetensors")
    assert sorted(saved) == sorted(expected)
    assert all(torch.equal(saved[name], expected[name]) for name in expected)
    loaded = in_fresh_memory(type(model).from_pretrained(tmp_path).eval())
    assert torch.equal(run(loaded, inputs), stock)


def test_the_family_pipelines_exist_in_diffusers(family):
    import diffusers

    missing = [name for name in get_family(family).pipelines if not hasattr(diffusers, name)]
    assert missing == []


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_at_the_training_grid_is_stock(family, preset):
    case = CASES[family]
    model = case.model()
    stock = {sigma: run(model, case.inputs(*case.grid, sigma=sigma)) for sigma in (1.0, 0.2)}
    set_pe(model, "native", extrapolation=model_extrapolation(model, preset, case.grid))
    for sigma, expected in stock.items():
        assert torch.equal(run(model, case.inputs(*case.grid, sigma=sigma)), expected), sigma


def test_dype_at_twice_the_grid_follows_the_step(family):
    case = CASES[family]
    model = case.model()
    rows, cols = case.grid
    big = {sigma: case.inputs(2 * rows, 2 * cols, sigma=sigma) for sigma in (1.0, 0.5)}
    stock = {sigma: run(model, inputs) for sigma, inputs in big.items()}
    set_pe(model, "native", extrapolation=case.dype(model))
    seam = position_module(model)
    outs = {sigma: run(model, inputs) for sigma, inputs in big.items()}
    for sigma, out in outs.items():
        assert torch.isfinite(out).all()
        assert (out - stock[sigma]).abs().max() > 1e-6, sigma
    assert seam.encodings[0].step.sigma == pytest.approx(0.5)
    builds = seam.table_builds
    run(model, big[0.5])  # the same sigma again: no new spectrum
    assert seam.encodings[0].step.sigma == pytest.approx(0.5)
    assert seam.table_builds - builds <= builds / 2  # at most what one forward builds


def test_the_seam_runs_as_often_as_the_stock_position_module(family):
    """Tables once per forward (or as often as the stock module is called), never once per layer."""
    case = CASES[family]
    model = case.model()
    stock_module = getattr(model, get_family(family).position_attr, None)  # None: the pipeline builds the tables
    calls = []
    if isinstance(stock_module, torch.nn.Module):
        handle = stock_module.register_forward_hook(lambda *a: calls.append(1))
        run(model, case.inputs(*case.grid))
        handle.remove()
    set_pe(model, "native")
    run(model, case.inputs(*case.grid))
    run(model, case.inputs(*case.grid))
    seam = position_module(model)
    if calls:  # as often as the stock module (Helios, FramePack: four tables a forward, one per token group)
        assert seam.forwards == 2 * len(calls)
    else:
        assert 2 <= seam.forwards <= 4


def test_tier_two_families_run_an_mmpos_encoding_through_their_processors(family):
    fam, case = get_family(family), CASES[family]
    if fam.tier != 2:
        pytest.skip(f"{family} is tier 1: its stock processors stay (set_pe changes the spectrum only)")
    model = case.model()
    inputs = case.inputs(*case.grid)
    stock = run(model, inputs)
    set_pe(model, "rope_axial")  # the native spectrum through mmpos' own tables and rotation
    assert torch.allclose(run(model, inputs), stock, atol=2e-5, rtol=1e-4)


def test_tier_two_families_train_a_learned_encoding(family):
    fam, case = get_family(family), CASES[family]
    if fam.tier != 2 or not case.learned:
        pytest.skip(f"{family}: no per-head learned encodings (tier {fam.tier})")
    from mmpos.integrations.diffusers import train_only_pe

    model = case.model()
    inputs = case.inputs(*case.grid)
    stock = run(model, inputs)
    set_pe(model, "rope_mixed", per_layer=True)
    params = train_only_pe(model)
    out = output(model(**inputs, return_dict=False))
    assert torch.isfinite(out).all() and (out.detach() - stock).abs().max() > 1e-6
    out.square().mean().backward()
    assert params and all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)
    assert sum(p.grad.abs().sum() for p in params) > 0


def test_tier_one_families_refuse_what_needs_mmpos_processors(family):
    fam, case = get_family(family), CASES[family]
    if fam.tier != 1:
        pytest.skip(f"{family} is tier 2")
    model = case.model()
    with pytest.raises(TypeError, match="tier 1"):
        set_pe(model, "rope_mixed")
    with pytest.raises(TypeError, match="spectrum options"):
        set_pe(model, "native", layout="half")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MMPOS_SLOW") != "1", reason="slow: compiles every family (MMPOS_SLOW=1)")
def test_native_compiles_without_graph_breaks_where_stock_does(family):
    case = CASES[family]
    if not case.compiles:
        pytest.skip(
            f"{family} does not compile with fullgraph=True (the reason: its case in mmpos/integrations/diffusers/families/tiny.py)"
        )
    model = case.model()
    inputs = case.inputs(*case.grid)
    set_pe(model, "native")  # (a schedule reads the image extent as Python numbers: one graph per extent)
    eager = run(model, inputs)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        assert torch.equal(output(compiled(**inputs, return_dict=False)), eager)


def test_every_rotary_transformer_of_diffusers_is_registered_or_excluded():
    """The installed diffusers' rotary transformer classes (``families.coverage``'s criterion), enumerated now: each
    is covered by a registered family or named in ``EXCLUDED``, never both; no stale exclusion; one per line, sorted."""
    from mmpos.integrations.diffusers.families.coverage import (
        EXCLUDED,
        registered_class_names,
        rotary_transformer_classes,
    )

    classes = rotary_transformer_classes()
    registered = registered_class_names()
    print(f"{len(classes)} rotary transformer classes in diffusers:", ", ".join(classes))
    print(f"{sum(name in registered for name in classes)} registered, {len(EXCLUDED)} excluded")
    assert [name for name in classes if name not in registered and name not in EXCLUDED] == []
    assert [name for name in EXCLUDED if name in registered] == []
    assert [name for name in EXCLUDED if name not in classes] == []  # stale: diffusers renamed or removed it
    assert list(EXCLUDED) == sorted(EXCLUDED) and all(reason.strip() for reason in EXCLUDED.values())
    assert [name for name in registered if name not in classes] == []  # every family's classes are rotary ones


def test_the_rotary_criterion_tells_rotary_modules_from_the_others():
    """Rotary: Flux's (imports its rope), SANA-Video's (``WanRotaryPosEmbed``), Mochi's (learned ``pos_frequencies``
    under ``rope``); not rotary: SD3 and PixArt (sincos), the protein model whose source only says "proper"."""
    from mmpos.integrations.diffusers.families.coverage import rotary_transformer_classes

    classes = rotary_transformer_classes()
    assert {"FluxTransformer2DModel", "SanaVideoTransformer3DModel", "MochiTransformer3DModel"} <= set(classes)
    assert not {"SD3Transformer2DModel", "PixArtTransformer2DModel", "RFD4ProteinaTransformer"} & set(classes)


def test_the_docs_list_the_exclusions():
    from pathlib import Path

    from mmpos.integrations.diffusers.families.coverage import exclusions_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "adding_a_family.md").read_text()
    table = page.split("<!-- exclusions-table:start -->\n", 1)[1].split("\n<!-- exclusions-table:end -->", 1)[0]
    assert table == exclusions_table()  # regenerate: python -m mmpos.integrations.diffusers.families


def test_the_readme_table_lists_the_registered_families():
    """The README table is the registry's, with the forward-time column of the committed benchmark rows."""
    import json
    from pathlib import Path

    from mmpos.integrations.diffusers.families import markdown_table

    root = Path(__file__).resolve().parents[2]
    timings = json.loads((root / "assets/results/families/bench_families.json").read_text())
    readme = (root / "README.md").read_text()
    table = readme.split("<!-- families-table:start -->\n", 1)[1].split("\n<!-- families-table:end -->", 1)[0]
    # regenerate: python -m mmpos.integrations.diffusers.families --timings assets/results/families/bench_families.json
    assert table == markdown_table(timings)


def test_the_forward_time_cell_shows_the_ratios_and_the_overhead_in_ms():
    from mmpos.integrations.diffusers.families import timing_cell

    row = {"native_x": 0.987, "dype_x": 1.374, "native_overhead_ms": -0.0123, "dype_overhead_ms": 3.21}
    assert timing_cell(row) == "0.99x (-0.01 ms) / 1.37x (+3.21 ms)"
    assert timing_cell({"native_x": 1.0, "dype_x": 1.5}) == "1.00x / 1.50x"  # rows of an older benchmark


def test_a_latent_of_the_wrong_rank_or_no_tensor_is_refused_naming_the_layout():
    from mmpos.integrations.diffusers.families.base import check_latents

    check_latents(torch.zeros(1, 4, 2, 3), "[B, C, H, W]")
    with pytest.raises(ValueError, match=r"hidden_states has shape \(1, 4, 2, 3\); expected latents \[B, C, F, H, W\]"):
        check_latents(torch.zeros(1, 4, 2, 3), "[B, C, F, H, W]")
    with pytest.raises(ValueError, match=r"has shape NoneType; expected latents \[B, C, H, W\]"):
        check_latents(None, "[B, C, H, W]")
