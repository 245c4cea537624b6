"""One rank of test_context_parallel's per-rank table runs (torchrun, gloo): per case a tiny fp32 model with
``set_pe`` run in one process, then a second copy (same seed, empty caches) under diffusers' ``enable_parallelism``
twice (the second forward must reuse the cached tables). Writes ``rank{R}.json``: per case the largest difference
to one process (both parallel forwards), the rows of every table and coordinate tensor the seam caches, this rank's
token count and the tables built by the second forward.

Cases: ``[family, pe, mode, grid, preset]``; ``grid`` is Wan's latent ``(frames, height, width)`` or Flux's
``(height, width, text)`` or FLUX.2's ``(rows, cols, text[, reference rows, reference cols])``; ``preset`` an extrapolation preset of :func:`model_extrapolation` or ``null``. The
diffusers CPU limitations patched (and only those): see :mod:`cp_patches`.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

import cp_patches  # noqa: E402
from diffusers import Flux2Transformer2DModel  # noqa: E402
from fixtures.families import FLUX2_CONFIG  # noqa: E402
from fixtures.families import _flux2_inputs as flux2_inputs  # noqa: E402
from fixtures.tiny_models import tiny_flux, tiny_flux_inputs, tiny_wan, tiny_wan_inputs  # noqa: E402

from mmpos.integrations.diffusers import model_extrapolation, position_module, set_pe  # noqa: E402


def model_and_inputs(family, pe, grid, preset):
    """The model with ``set_pe``, its inputs and the lengths of the sequences the plan splits."""
    if family == "wan":
        model, (frames, height, width) = tiny_wan(), grid
        inputs, parts = tiny_wan_inputs(frames=frames, height=height, width=width), [frames * height * width // 4]
        trained = (2, 2)
    elif family == "flux":
        model, (height, width, text) = tiny_flux(), grid
        inputs, parts = tiny_flux_inputs(height=height, width=width, text=text), [text, height * width]
        trained = (4, 4)
    else:  # flux2: grid (rows, cols, text, reference rows, reference cols); the reference at t = 10
        torch.manual_seed(0)
        model, (rows, cols, text, *reference) = Flux2Transformer2DModel(**FLUX2_CONFIG).eval(), grid
        inputs = flux2_inputs(rows, cols, text=text, reference=tuple(reference) or None)
        parts, trained = [text, inputs["img_ids"].shape[1]], (4, 4)
    model.set_attention_backend("native")
    options = {} if preset is None else {"extrapolation": model_extrapolation(model, preset, trained_grid=trained)}
    set_pe(model, pe, **options)
    return model, inputs, parts


def cached_rows(seam) -> list[int]:
    """The sequence length of every tensor the seam and its encodings keep between forwards."""
    rows = []
    for pe in seam.encodings:
        for _, _, coords, table in pe.cache._entries.values():
            rows += [coords.shape[-2], table.cis.shape[-2]]
    if getattr(seam, "_native_cache", None) is not None:
        rows += [t.shape[0] for t in seam._native_cache[2]]
    for _, out in getattr(seam, "_recent", ()):  # a spectrum seam's outputs (FLUX.2 native: per call)
        rows += [t.shape[0] for t in out]
    grid_cache = getattr(seam, "_grid_cache", None)
    if grid_cache is not None:
        rows += [coords.shape[0] for coords in grid_cache._entries.values()]
    return rows


torch.manual_seed(0)
out_dir, cases = Path(sys.argv[1]), json.loads(sys.argv[2])
cp_patches.start()
results = {}
for family, pe, mode, grid, preset in cases:
    model, inputs, parts = model_and_inputs(family, pe, grid, preset)
    with torch.no_grad():
        alone = model(**inputs, return_dict=False)[0]
        model, _, _ = model_and_inputs(family, pe, grid, preset)
        model.enable_parallelism(config=cp_patches.parallel_config(mode, any(n % 2 for n in parts)))
        first = model(**inputs, return_dict=False)[0]
        seam = position_module(model)
        builds = seam.table_builds
        second = model(**inputs, return_dict=False)[0]
    own = sum(len(torch.arange(n).tensor_split(2)[dist.get_rank()]) for n in parts)
    results[f"{family}/{pe}/{mode}/{grid}/{preset}"] = dict(
        difference=max(float((out - alone).abs().max()) for out in (first, second)),
        cached_rows=cached_rows(seam),
        own_tokens=own,
        second_forward_builds=seam.table_builds - builds,
    )
(out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
dist.destroy_process_group()
