"""One rank of test_context_parallel_camera's 2-process run (torchrun, gloo): camera adapters on the stock tiny
fp32 LTX-2 (``families.tiny.tiny_ltx2``: audio and video) under diffusers' ``enable_parallelism``.

Per case ``[kind, mode, plan, grid, variant]``: the one-process outputs (video and audio) with and without a seeded
``kind`` adapter (the same weights on every rank), then a second copy of the model (same seed) made parallel with
``plan`` (``"mmpos"``: :func:`ltx2_context_parallel_plan`; ``"diffusers"``: the class's ``_cp_plan``, or
``"none"``: no camera, diffusers' plan only) and two forwards with the camera. ``grid``: ``(frames, rows, cols,
text, audio)`` tokens; ``variant``: ``"cameras"`` (cameras built on the grid), ``"path"`` (the camera path, put on
each forward's grid by the adapter), ``"zero"`` (the adapter as initialised: zero), ``"mask"`` (a text mask
passed), ``"none_mask"`` (``encoder_attention_mask=None`` passed, which diffusers' plan asks for), ``"set_pe"``
(``set_pe("native")`` too). Writes ``rank{R}.json``: per case the largest difference of each output to one
process, how much the camera changes the one-process video output and how much it changes the parallel one, or the
error. The diffusers CPU limitations patched: see :mod:`cp_patches`.
"""

import contextlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `tests` is a package

from mmpos.camera import preset_trajectory  # noqa: E402
from mmpos.camera.video import video_cameras  # noqa: E402
from mmpos.integrations.diffusers import set_pe  # noqa: E402
from mmpos.integrations.diffusers.camera_adapter import CameraAdapter, camera_conditioning  # noqa: E402
from mmpos.integrations.diffusers.families.ltx2 import ltx2_context_parallel_plan  # noqa: E402
from mmpos.integrations.diffusers.families.tiny import ltx2_inputs, tiny_ltx2  # noqa: E402
from tests.workers import cp_patches  # noqa: E402
from tests.workers.ending import end_process_group  # noqa: E402


def model(variant):
    torch.manual_seed(0)
    transformer = tiny_ltx2().eval()
    transformer.set_attention_backend("native")
    if variant == "set_pe":
        set_pe(transformer, "native")
    return transformer


def camera_context(kind, grid, variant):
    """``model -> with block`` conditioning a forward on an orbit through a seeded ``kind`` adapter (``kind`` empty:
    no camera)."""
    if not kind:
        return lambda transformer: contextlib.nullcontext()
    frames, rows, cols = grid[:3]
    trajectory = preset_trajectory("orbit", 8 * (frames - 1) + 1)
    cameras = (
        trajectory if variant == "path" else video_cameras(trajectory, (frames, rows, cols), (32 * rows, 32 * cols))
    )
    adapter = CameraAdapter.for_transformer(tiny_ltx2(), kind)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in adapter.parameters() if variant != "zero" else ():  # a trained-looking adapter
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return lambda transformer: camera_conditioning(transformer, adapter, cameras)


def run_case(kind, mode, plan, grid, variant) -> dict:
    frames, rows, cols, text, audio = grid
    inputs = ltx2_inputs(rows, cols, text=text, frames=frames, audio_frames=audio)
    if variant in ("mask", "none_mask"):
        inputs["encoder_attention_mask"] = torch.ones(1, text) if variant == "mask" else None
    camera = camera_context(kind, grid, variant)
    one = model(None)
    with torch.no_grad():
        without_camera = one(**inputs, return_dict=False)
        with camera(one):
            alone = one(**inputs, return_dict=False)
    parallel = model(variant)
    options = {} if plan == "diffusers" else {"cp_plan": ltx2_context_parallel_plan()}
    uneven = any(n % 2 for n in (frames * rows * cols, text))
    parallel.enable_parallelism(config=cp_patches.parallel_config(mode, uneven), **options)
    outputs = []
    try:
        with torch.no_grad():
            for _ in range(2):
                with camera(parallel):
                    outputs.append(parallel(**inputs, return_dict=False))
            parallel_without = parallel(**inputs, return_dict=False)  # the adapter removed
    except (RuntimeError, ValueError) as error:  # a refusal, or diffusers failing (recorded, checked by the test)
        return dict(error=str(error).splitlines()[0])
    return dict(
        video=max(float((out[0] - alone[0]).abs().max()) for out in outputs),
        audio=max(float((out[1] - alone[1]).abs().max()) for out in outputs),
        camera_effect=float((alone[0] - without_camera[0]).abs().max()),
        parallel_camera_effect=max(float((out[0] - parallel_without[0]).abs().max()) for out in outputs),
    )


out_dir, cases = Path(sys.argv[1]), json.loads(sys.argv[2])
cp_patches.start()
results = {"/".join(map(str, case)): run_case(*case) for case in cases}
(out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
end_process_group()
