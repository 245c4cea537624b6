"""A native seam builds its output once per distinct call and reuses it at every step (the per-forward cost of
``set_pe``): ``PositionSeam.memo`` (Qwen-Image, Wan's tier-2 seam) and ``Family.tables_key`` (Cosmos: the latents'
shape; Qwen-Image 2.1: the mask's values; FLUX-style ids rebuilt every forward: their values). A changed call rebuilds, and every output is the stock one bit for bit."""

import pytest
import torch

from mmpos.integrations.diffusers import position_module, set_pe
from mmpos.integrations.diffusers.families.tiny import CASES, run

# family -> the seam method that builds an output (None: a SpectrumSeam, counted by its table_builds)
# (chroma, hidream, kandinsky6: ids the model rebuilds every forward, keyed by value: ids_values_key)
BUILDERS = {
    "qwen": "tables_at",
    "chronoedit": "_native_tables",
    "cosmos": None,
    "qwenimage21": None,
    "chroma": None,
    "hidream": None,
    "kandinsky6": None,
}


def counted_builds(seam, builder):
    """A function returning how many outputs ``seam`` has built since this call."""
    if builder is None:
        start = seam.table_builds
        return lambda: seam.table_builds - start
    calls = []
    build = getattr(seam, builder)

    def counting(*args, **kwargs):
        calls.append(1)
        return build(*args, **kwargs)

    setattr(seam, builder, counting)
    return lambda: len(calls)


@pytest.mark.parametrize("family", sorted(BUILDERS))
def test_native_seam_builds_once_per_call_and_equals_stock(family):
    torch.set_num_threads(1)
    case = CASES[family]
    model = case.model()
    rows, cols = case.grid
    grids = {"train": (rows, cols), "double": (2 * rows, 2 * cols)}
    stock = {name: run(model, case.inputs(*grid)) for name, grid in grids.items()}
    set_pe(model, "native")
    builds = counted_builds(position_module(model), BUILDERS[family])
    for _ in range(3):  # fresh input tensors each step, as a pipeline's latents
        assert torch.equal(run(model, case.inputs(*grids["train"])), stock["train"])
    assert builds() == 1
    assert torch.equal(run(model, case.inputs(*grids["double"])), stock["double"])
    assert builds() == 2
    assert torch.equal(run(model, case.inputs(*grids["train"])), stock["train"])  # still kept
    assert builds() == 2


def test_scheduled_seam_is_not_memoised():
    """DyPE on Qwen-Image: the output follows the step's sigma, so each sigma gets its own tables."""
    torch.set_num_threads(1)
    case = CASES["qwen"]
    model = case.model()
    rows, cols = case.grid
    set_pe(model, "native", extrapolation=case.dype(model))
    seam = position_module(model)
    builds = []
    for sigma in (1.0, 0.5):
        run(model, case.inputs(2 * rows, 2 * cols, sigma=sigma))
        builds.append(seam.table_builds)
    assert builds[1] > builds[0]  # the second sigma's image tables are new
    assert seam._memo == []
