"""One model serving several threads: per-call state (a diffusion step's sigma, a forward's patch grid, a call's
camera) is per thread, so every output equals the sequential run's, bit for bit.

Each test starts its threads together (a barrier) and repeats calls, so that calls interleave.
"""

import threading

import pytest
import torch

import mmpos
from mmpos.integrations.diffusers import model_extrapolation, set_pe
from mmpos.spectrum import extrapolation_preset
from tests.fixtures.tiny_models import tiny_flux, tiny_flux_inputs

pytestmark = pytest.mark.usefixtures("one_thread")


def in_threads(work, arguments, repeats):
    """``work(argument)`` ``repeats`` times in one thread per argument, all started together: the outputs per
    argument, and the errors raised."""
    barrier, outputs, errors = threading.Barrier(len(arguments)), {a: [] for a in arguments}, []

    def run(argument):
        try:
            barrier.wait()
            for _ in range(repeats):
                outputs[argument].append(work(argument))
        except Exception as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    threads = [threading.Thread(target=run, args=(a,)) for a in arguments]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outputs, errors


def assert_all_equal(outputs, expected):
    differing = [
        (a, i) for a, outs in outputs.items() for i, out in enumerate(outs) if not torch.equal(out, expected[a])
    ]
    total = sum(len(outs) for outs in outputs.values())
    assert not differing, f"{len(differing)} of {total} outputs differ from the sequential run: {differing[:5]}"


def test_one_dype_encoding_at_four_sigmas():
    pe = mmpos.create_pe(
        "rope_axial", head_dim=32, axes_dims=(16, 16), extrapolation=extrapolation_preset("dype", (4, 4))
    )
    coords = mmpos.coords.image_grid(12, 12)
    q, k = torch.randn(2, 1, 2, 144, 32, dtype=torch.float64).unbind(0)
    sigmas = (1.0, 0.7, 0.4, 0.1)

    def rotated(sigma):
        pe.step.sigma = sigma
        table = pe.table(coords, torch.float64)
        return torch.cat(pe.rotate_qk(q, k, table), dim=-1)

    expected = {s: rotated(s) for s in sigmas}
    assert len({tuple(e.flatten()[:4].tolist()) for e in expected.values()}) == 4  # the sigmas matter
    outputs, errors = in_threads(rotated, sigmas, repeats=30)
    assert not errors
    assert_all_equal(outputs, expected)


def test_flux_with_dype_at_four_timesteps():
    model = tiny_flux()
    set_pe(model, "native", extrapolation=model_extrapolation(model, "dype", trained_grid=(4, 4)))
    timesteps = (1.0, 0.75, 0.5, 0.25)

    def denoised(t):
        with torch.no_grad():
            return model(**dict(tiny_flux_inputs(height=8, width=8), timestep=torch.tensor([t]))).sample

    expected = {t: denoised(t) for t in timesteps}
    outputs, errors = in_threads(denoised, timesteps, repeats=6)
    assert not errors
    assert_all_equal(outputs, expected)


def test_open_clip_tower_at_four_image_sizes():
    from open_clip.model import CLIP

    from mmpos.integrations.open_clip import convert

    torch.manual_seed(0)
    model = CLIP(
        embed_dim=32,
        vision_cfg=dict(image_size=32, layers=2, width=64, head_width=16, patch_size=8),
        text_cfg=dict(context_length=8, vocab_size=100, width=32, heads=2, layers=1),
    ).eval()
    convert(model.visual, pe="rope_axial")
    sizes = (16, 32, 40, 64)
    images = {s: torch.randn(1, 3, s, s, generator=torch.Generator().manual_seed(s)) for s in sizes}

    def encoded(size):
        with torch.no_grad():
            return model.encode_image(images[size])

    expected = {s: encoded(s) for s in sizes}
    outputs, errors = in_threads(encoded, sizes, repeats=5)
    assert not errors
    assert_all_equal(outputs, expected)


def test_camera_control_wan_pipeline_with_orbit_pan_and_no_camera():
    from mmpos.camera import preset_trajectory
    from mmpos.integrations.diffusers.camera_adapter import CameraAdapter
    from mmpos.models.tiny_wan import tiny_wan_components
    from mmpos.pipelines import CameraControlWanPipeline

    pipe = CameraControlWanPipeline(**tiny_wan_components())
    pipe.set_progress_bar_config(disable=True)
    adapter = CameraAdapter.for_transformer(pipe.transformer, "plucker")
    with torch.no_grad():  # a trained-looking adapter: the camera changes the video
        for p in adapter.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3), dtype=p.dtype) * 0.5)
    pipe.camera_adapter = adapter
    cameras = {"orbit": preset_trajectory("orbit", 9, degrees=90), "pan": preset_trajectory("pan", 9), "none": None}

    def video(name):
        return pipe(
            prompt="a slow camera orbit around a house",
            height=32,
            width=48,
            num_frames=9,
            num_inference_steps=2,
            guidance_scale=3.0,
            max_sequence_length=16,
            output_type="pt",
            camera=cameras[name],
            generator=torch.Generator().manual_seed(0),
        ).frames

    expected = {name: video(name) for name in cameras}
    assert not torch.equal(expected["orbit"], expected["none"]) and not torch.equal(expected["pan"], expected["none"])
    outputs, errors = in_threads(video, tuple(cameras), repeats=2)
    assert not errors, errors
    assert_all_equal(outputs, expected)
    assert pipe.transformer.blocks[0].attn1.processor.__class__.__name__ == "WanAttnProcessor"  # all removed


def _edit_runs(method):
    """A tiny world edit pipeline and ``work(setting) -> outputs`` for four settings of ``method`` (one of them the
    stock pipeline on the same transformer, which runs no edit session)."""
    from mmpos.models.world.samples import generate
    from mmpos.pipelines.edits.band.demo import run_band
    from mmpos.pipelines.edits.loose.demo import loose_for_steps, run_loose
    from mmpos.pipelines.edits.transplant.demo import run_transplant
    from mmpos.world.canvas import WORLD_TRANSPLANT
    from mmpos.world.edit_pairs import harmonise_pair, style_set, transplant_pair
    from tests.pipelines.test_world_editing import SIZE, stock, tiny_edit_pipeline

    pipe = tiny_edit_pipeline(method)
    if method == "band":
        sets = [style_set(5, 2, SIZE)]
        plain, captions = stock(pipe, "t2i"), [sets[0].reference.spec.caption()] + sets[0].prompts
        examples = [{"image": sets[0].reference.image, "caption": c} for c in captions]
        settings = {"off": {"enabled": False}, "half": {"strength": 0.5}, "full": {"strength": 1.0}}

        def work(name):
            if name == "stock":
                return torch.from_numpy(generate(plain, "t2i", examples, steps=2)[1:])
            return torch.from_numpy(run_band(pipe, sets, steps=2, band=settings[name], guidance=3.0).outputs)

    elif method == "transplant":
        pairs = [transplant_pair(3, SIZE)]
        settings = {name: {**WORLD_TRANSPLANT, "tau": tau} for name, tau in (("early", 0.9), ("late", 0.0))}
        settings["off"] = {**WORLD_TRANSPLANT, "enabled": False}
        settings["swap"] = {**WORLD_TRANSPLANT, "mode": "swap"}

        def work(name):
            return torch.from_numpy(run_transplant(pipe, pairs, steps=3, transplant=settings[name]).outputs)

    else:
        pair = harmonise_pair(7, SIZE)
        plain = stock(pipe, "kontext")
        examples = [{"image": pair.target.image, "context": pair.collage, "caption": pair.instruction}]
        settings = {name: loose_for_steps(3, strength=s) for name, s in (("zero", 0.0), ("one", 1.0), ("two", 2.0))}

        def work(name):
            if name == "stock":
                return torch.from_numpy(generate(plain, "kontext", examples, steps=3))
            return torch.from_numpy(run_loose(pipe, [pair], steps=3, loose=settings[name], guidance=3.0).outputs)

    return work, tuple(settings) + (() if method == "transplant" else ("stock",))


@pytest.mark.parametrize("method", ["band", "transplant", "loose"])
def test_edit_pipeline_from_four_threads_with_different_settings(method):
    """One edit pipeline (FLUX.1 world model, tiny config) from 4 threads, each with its own edit settings (and,
    for band and loose, the stock pipeline on the same transformer in a thread without an edit session): every
    output equals the sequential run's; none raises "the 'edit' level is already filled"."""
    work, names = _edit_runs(method)
    expected = {name: work(name) for name in names}
    assert len({e.numpy().tobytes() for e in expected.values()}) >= 3  # the settings matter
    outputs, errors = in_threads(work, names, repeats=3)
    assert not errors, errors
    assert_all_equal(outputs, expected)
