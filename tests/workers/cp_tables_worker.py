"""One rank of test_context_parallel's per-rank table runs (torchrun, gloo): per case a tiny fp32 model with
``set_pe`` run in one process, then a second copy (same seed, empty caches) under diffusers' ``enable_parallelism``
three times (the third forward must reuse the cached tables; ``wan+KIND`` families run every forward under a
seeded camera adapter of that kind). Writes ``rank{R}.json``: per case the largest difference to one process, the
rows of every table and coordinate tensor the seam caches, this rank's token count, the tables the third forward
built and (camera cases) how much the camera changes the one-process output; or the error of a refused case.

Cases: ``[family, pe, mode, grid, preset]`` (``pe="stock"``: diffusers without mmpos, only the difference); ``grid``
is Wan's latent ``(frames, height, width)``, Flux's ``(height, width, text)``, FLUX.2's ``(rows, cols, text[,
reference rows, reference cols])``, Qwen-Image's ``(rows, cols, text[, masked text tokens, reference rows,
reference cols])``, LTX's ``(frames, rows, cols, text[, masked, per_token])`` or ChronoEdit's latent
``(frames, height, width)``; ``preset`` an extrapolation preset
of :func:`model_extrapolation` or ``null``. The diffusers CPU limitations patched (and only those): see
:mod:`cp_patches`.
"""

import contextlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `tests` is a package

from diffusers import Flux2Transformer2DModel, LTXVideoTransformer3DModel, QwenImageTransformer2DModel  # noqa: E402

from mmpos.camera import preset_trajectory  # noqa: E402
from mmpos.camera.video import video_cameras  # noqa: E402
from mmpos.integrations.diffusers import model_extrapolation, position_module, set_pe  # noqa: E402
from mmpos.integrations.diffusers.camera_adapter import CameraAdapter, camera_conditioning  # noqa: E402
from mmpos.integrations.diffusers.families.tiny import (  # noqa: E402
    CASES,
    FLUX2_CONFIG,
    LTX_CONFIG,
    QWEN_CONFIG,
    chronoedit_inputs,
    flux2_inputs,
    ltx_inputs,
    qwen_inputs,
    randn,
)
from tests.fixtures.tiny_models import tiny_flux, tiny_flux_inputs, tiny_wan, tiny_wan_inputs  # noqa: E402
from tests.workers import cp_patches  # noqa: E402
from tests.workers.ending import end_process_group  # noqa: E402


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
    elif family == "qwen":  # grid (rows, cols, text[, masked, reference rows, reference cols])
        torch.manual_seed(0)
        model = QwenImageTransformer2DModel(**QWEN_CONFIG).eval()
        rows, cols, text, masked, *reference = (*grid, 0) if len(grid) == 3 else grid
        inputs, trained = qwen_inputs(rows, cols, text=text), (4, 4)
        if reference:  # an Edit sequence: the image, then a reference image (QwenImageEditPipeline's img_shapes)
            inputs["img_shapes"] = [[(1, rows, cols), (1, *reference[:2])]]
            inputs["hidden_states"] = randn(1, rows * cols + reference[0] * reference[1], 16)
        parts = [text, inputs["hidden_states"].shape[1]]
        # the last `masked` text tokens padding; QwenImagePipeline passes None for an unpadded prompt
        inputs["encoder_hidden_states_mask"] = (torch.arange(text) < text - masked)[None] if masked else None
    elif family == "ltx":
        model, inputs, parts = ltx_model_and_inputs(*grid)
        trained = (4, 4)
    elif family == "chronoedit":  # grid: latents (frames, height, width), patch (1, 2, 2); two frames at t = 0, 7
        frames, height, width = grid
        model = CASES["chronoedit"].model()
        inputs = chronoedit_inputs(height // 2, width // 2, frames=frames)
        parts, trained = [frames * height * width // 4], (2, 2)
    else:  # flux2: grid (rows, cols, text, reference rows, reference cols); the reference at t = 10
        torch.manual_seed(0)
        model, (rows, cols, text, *reference) = Flux2Transformer2DModel(**FLUX2_CONFIG).eval(), grid
        inputs = flux2_inputs(rows, cols, text=text, reference=tuple(reference) or None)
        parts, trained = [text, inputs["img_ids"].shape[1]], (4, 4)
    model.set_attention_backend("native")
    options = {} if preset is None else {"extrapolation": model_extrapolation(model, preset, trained_grid=trained)}
    if pe != "stock":  # "stock": diffusers alone, without mmpos
        set_pe(model, pe, **options)
    return model, inputs, parts


def ltx_model_and_inputs(frames, rows, cols, text, masked=0, per_token=0):
    """LTX-Video (patch 1: a token per latent cell) without a text mask, or with the fixture's (``masked``), and one
    timestep, or one per token with the first frame clean (``per_token``, the image-to-video pipeline's)."""
    torch.manual_seed(0)
    model, inputs = LTXVideoTransformer3DModel(**LTX_CONFIG).eval(), ltx_inputs(rows, cols, text=text, frames=frames)
    if not masked:
        inputs["encoder_attention_mask"] = None
    if per_token:
        timestep = inputs["timestep"].expand(1, frames * rows * cols).clone()
        inputs["timestep"] = timestep.index_fill(1, torch.arange(rows * cols), 0.0)
    return model, inputs, [frames * rows * cols, text]


def cached_rows(seam) -> list[int]:
    """The sequence length of every tensor the seam and its encodings keep between forwards."""
    rows = []
    for pe in seam.encodings:
        for _, _, coords, table in pe.cache._entries.values():
            rows += [coords.shape[-2], table.cis.shape[-2]]
    if getattr(seam, "_native_cache", None) is not None:
        rows += [t.shape[0] for t in seam._native_cache[2]]
    for _, out in getattr(seam, "_recent", ()):  # a spectrum seam's outputs (FLUX.2 [S, D], LTX [B, S, D])
        rows += [t.shape[-2] for t in out]
    grid_cache = getattr(seam, "_grid_cache", None)
    if grid_cache is not None:
        rows += [coords.shape[0] for coords in grid_cache._entries.values()]
    return rows


def camera_context(kind, grid):
    """``model -> with block`` conditioning a Wan forward on an orbit through a seeded ``kind`` adapter (the same
    weights for every model), or no camera (``kind`` empty)."""
    if not kind:
        return lambda model: contextlib.nullcontext()
    frames, height, width = grid
    cameras = video_cameras(preset_trajectory("orbit", 4 * (frames - 1) + 1), (frames, height // 2, width // 2),
                            (8 * height, 8 * width))  # fmt: skip
    adapter = CameraAdapter.for_transformer(tiny_wan(), kind)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in adapter.parameters():  # a trained-looking adapter (zero-initialised adds nothing)
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return lambda model: camera_conditioning(model, adapter, cameras)


def run_case(family, pe, mode, grid, preset) -> dict:
    family, _, kind = family.partition("+")  # "wan+plucker": Wan with a camera adapter
    camera = camera_context(kind, grid)
    model, inputs, parts = model_and_inputs(family, pe, grid, preset)
    with torch.no_grad():
        without_camera = model(**inputs, return_dict=False)[0]
        with camera(model):
            alone = model(**inputs, return_dict=False)[0]
    model, _, _ = model_and_inputs(family, pe, grid, preset)
    model.enable_parallelism(config=cp_patches.parallel_config(mode, any(n % 2 for n in parts)))
    outputs = []
    try:
        for _ in range(2):
            with torch.no_grad(), camera(model):
                outputs.append(model(**inputs, return_dict=False)[0])
    except (RuntimeError, ValueError) as error:  # a refusal (recorded, checked by the test)
        return dict(error=str(error))
    if pe == "stock":
        return dict(difference=max(float((out - alone).abs().max()) for out in outputs))
    seam = position_module(model)
    builds = seam.table_builds
    with torch.no_grad(), camera(model):
        outputs.append(model(**inputs, return_dict=False)[0])
    return dict(
        difference=max(float((out - alone).abs().max()) for out in outputs),
        cached_rows=cached_rows(seam),
        own_tokens=sum(len(torch.arange(n).tensor_split(2)[dist.get_rank()]) for n in parts),
        second_forward_builds=seam.table_builds - builds,
        camera_effect=float((alone - without_camera).abs().max()),
    )


torch.manual_seed(0)
out_dir, cases = Path(sys.argv[1]), json.loads(sys.argv[2])
cp_patches.start()
results = {
    f"{family}/{pe}/{mode}/{grid}/{preset}": run_case(family, pe, mode, grid, preset)
    for family, pe, mode, grid, preset in cases
}
(out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
end_process_group()
