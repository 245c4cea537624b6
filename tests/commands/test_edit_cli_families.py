"""`mmpos edit band|transplant|loose --model FOLDER` on FLUX.2 Klein, Qwen-Image(-Edit, -Edit-Plus) and Z-Image:
tiny random pipelines saved with ``save_pretrained`` (``tests/fixtures/tiny_edit_families.py``), 2 steps.

Per method and family: the pipeline class follows the folder's ``model_index.json``; a run writes its images (of
the expected size), ``config.yaml``, the figures and ``summary.json`` and exits 0; with the edit off
(``band.enabled=false``, ``transplant.enabled=false``, ``loose.strength=0``) the written images are the stock
diffusers pipeline's for the same seed and the config the run saved, pixel for pixel. A model no method pipeline
runs is one line naming the method's pipeline classes and families, exit code 2.
"""

import inspect
import json
import os

import diffusers
import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from mmpos.cli import main
from mmpos.pipelines.edits import get_edit
from mmpos.pipelines.edits.method import seeded_generator
from mmpos.pipelines.edits.transplant.canvas import TransplantConfig
from mmpos.pipelines.images import load_image, to_pil
from mmpos.pipelines.loading import load_pipeline_class
from tests.fixtures.tiny_edit_families import (
    TINY_FAMILY_MODELS,
    family_prompt_embeds,
    pil_image,
    save_tiny_family_models,
)

pytestmark = pytest.mark.usefixtures("one_thread")

COMMON = ["--device", "cpu", "--dtype", "float32", "--set", "sampler.num_inference_steps=2"]
NO_CFG = {  # the tiny folders have no text encoder: no negative prompt to encode
    "klein": ["--set", "sampler.guidance_scale=1.0"],
    "klein_inpaint": ["--set", "sampler.guidance_scale=1.0"],
    "z_image": ["--set", "sampler.guidance_scale=0.0"],
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The saved tiny pipelines (name -> folder), the embeddings files and the input images, under one root."""
    root = tmp_path_factory.mktemp("tiny_families")
    folders = save_tiny_family_models(root)
    pil_image(32, 32, seed=5).save(root / "ref32.png")
    for side in (32, 64):
        pil_image(side, side).save(root / f"collage{side}.png")  # also the transplant background
        mask = np.zeros((side, side), np.uint8)
        mask[side // 4 : 3 * side // 4, side // 4 : 5 * side // 8] = 255
        Image.fromarray(mask).save(root / f"mask{side}.png")
    return root, folders


def edit(tiny, method, name, out, batch, *extra):
    """``mmpos edit METHOD --model tiny/NAME`` with the family's prompt embeddings; returns the saved config."""
    root, folders = tiny
    kind = TINY_FAMILY_MODELS[name][2]
    args = ["edit", method, "--model", str(folders[name]), "--prompt-embeds", str(root / f"{kind}{batch}.safetensors")]
    assert main([*args, "--out", str(out), *COMMON, *NO_CFG.get(name, []), *extra]) == 0
    return yaml.safe_load((out / "config.yaml").read_text())


def written(out) -> set:
    return {path.rsplit("/", 1)[-1] for path in json.loads((out / "summary.json").read_text())["outputs"]}


def pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def stock(tiny, name):
    """The stock diffusers pipeline of the tiny folder ``name`` (``model_index.json``'s own class)."""
    cls = getattr(diffusers, TINY_FAMILY_MODELS[name][0])
    pipe = load_pipeline_class(cls, tiny[1][name], "float32", "cpu")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def stock_images(tiny, name, config, batch, **call):
    """The stock pipeline's images ``[B, 3, H, W]`` with the run's sampler settings and seed."""
    embeds = family_prompt_embeds(TINY_FAMILY_MODELS[name][2], batch)
    pipe = stock(tiny, name)
    accepted = inspect.signature(pipe.__call__).parameters  # as the CLI: Qwen-Image 2.1 takes no guidance_scale
    sampler = {key: value for key, value in config["sampler"].items() if key in accepted}
    return pipe(**sampler, **embeds, **call, generator=seeded_generator(config["seed"]), output_type="pt").images


# ---- band modulation ----------------------------------------------------------------------------------------------
BAND = [("klein", "BandModulationFlux2KleinPipeline"), ("qwen", "BandModulationQwenImagePipeline"),
        ("z_image", "BandModulationZImagePipeline"), ("qwen21", "BandModulationQwenImage21Pipeline")]  # fmt: skip


@pytest.mark.parametrize("name, pipeline", BAND, ids=[n for n, _ in BAND])
def test_band_cli_runs_the_familys_pipeline_and_off_is_the_stock_pipeline(tiny, tmp_path, capsys, name, pipeline):
    side = TINY_FAMILY_MODELS[name][3]
    size = ["--set", f"sampler.height={side}", "--set", f"sampler.width={side}"]
    on = edit(tiny, "band", name, tmp_path / "on", 3, *size, "--set", "figure.sweep=[0.0]")
    printed = capsys.readouterr().out
    assert f"({pipeline})" in printed
    if name == "qwen21":  # the FLUX.1 config keys Qwen-Image 2.1 does not take
        assert "sampler: BandModulationQwenImage21Pipeline takes no guidance_scale, max_sequence_length" in printed
    assert written(tmp_path / "on") == {"edited_0.png", "edited_1.png", "comparison.png", "diagnostic.png"}
    assert on["band"]["enabled"] is True and on["sampler"]["height"] == side
    off = edit(
        tiny, "band", name, tmp_path / "off", 3, *size, "--set", "band.enabled=false", "--set", "figure.sweep=[]"
    )
    assert written(tmp_path / "off") == {"edited_0.png", "edited_1.png", "comparison.png"}  # no probe: no diagnostic
    expected = stock_images(tiny, name, off, 3)
    for i in (0, 1):  # the targets: batch elements 1 and 2 of [reference, target, target]
        image = pixels(tmp_path / "off" / f"edited_{i}.png")
        assert image.shape == (side, side, 3)
        assert np.array_equal(image, np.asarray(to_pil(expected[1 + i])))
    edited = [pixels(tmp_path / "on" / f"edited_{i}.png") for i in (0, 1)]
    assert not all(np.array_equal(e, np.asarray(to_pil(expected[1 + i]))) for i, e in enumerate(edited))


def test_band_cli_on_klein_with_a_given_reference_image(tiny, tmp_path):
    root = tiny[0]
    size = ["--set", "sampler.height=32", "--set", "sampler.width=32", "--set", "figure.sweep=[]"]
    edit(tiny, "band", "klein", tmp_path / "generated", 3, *size)
    given = edit(tiny, "band", "klein", tmp_path / "given", 3, *size, "--reference-image", str(root / "ref32.png"))
    assert given["reference"]["image"] == str(root / "ref32.png")
    assert written(tmp_path / "given") == {"edited_0.png", "edited_1.png", "comparison.png", "diagnostic.png"}
    first, second = (pixels(tmp_path / run / "edited_0.png") for run in ("generated", "given"))
    assert first.shape == second.shape == (32, 32, 3)
    assert not np.array_equal(first, second)  # the targets share the given image, not the generated reference


# ---- PE transplant ------------------------------------------------------------------------------------------------
TRANSPLANT = [("klein_inpaint", 32, ["--box", "8", "8", "24", "20"]), ("qwen_inpaint", 64, ["--mask", "MASK"])]


@pytest.mark.parametrize("name, side, where", TRANSPLANT, ids=[n for n, _, _ in TRANSPLANT])
def test_transplant_cli_runs_the_familys_pipeline_and_off_is_stock_on_the_canvas(tiny, tmp_path, name, side, where):
    root = tiny[0]
    background = root / f"collage{side}.png"
    where = [str(root / "mask64.png") if w == "MASK" else w for w in where]
    inputs = ["--background", str(background), *where, "--reference", str(root / "ref32.png")]
    edit(tiny, "transplant", name, tmp_path / "on", 1, *inputs, "--set", "figure.sweep=[1.01]")
    assert written(tmp_path / "on") == {"edited_0.png", "comparison.png", "diagnostic.png"}
    assert pixels(tmp_path / "on" / "edited_0.png").shape == (side, side, 3)  # the background's size
    off = edit(
        tiny, "transplant", name, tmp_path / "off", 1, *inputs, "--set", "transplant.enabled=false", "--no-figures"
    )
    # the stock inpainting pipeline on the method's canvas (same geometry), its region pasted into the background
    cls = get_edit("transplant").pipeline_class(TINY_FAMILY_MODELS[name][0])
    method_pipe = load_pipeline_class(cls, tiny[1][name], "float32", "cpu")
    if where[0] == "--mask":
        target = dict(target_mask=Image.open(where[1]).convert("L"), target_box=None)
    else:
        target = dict(target_mask=None, target_box=[int(v) for v in where[1:]])
    config = TransplantConfig(**off["transplant"])
    canvas = method_pipe.prepare_canvas(config, load_image(background), references=[load_image(root / "ref32.png")],
                                        reference_masks=None, **target)  # fmt: skip
    mask = canvas.inpaint_mask[None, None].float()
    call = dict(image=canvas.image, mask_image=mask, strength=1.0)
    if name == "qwen_inpaint":  # as PosBridgeQwenInpaintPipeline calls it (Klein takes the canvas' own size)
        call.update(zip(("height", "width"), canvas.layout.canvas_size))
    canvas_images = stock_images(tiny, name, off, 1, **call)
    rows, cols = canvas.layout.background.slices
    region = canvas.inpaint_mask[rows, cols]
    expected = torch.where(region, canvas_images[0, :, rows, cols], canvas.image[0, :, rows, cols])
    assert np.array_equal(pixels(tmp_path / "off" / "edited_0.png"), np.asarray(to_pil(expected)))
    assert not np.array_equal(pixels(tmp_path / "on" / "edited_0.png"), np.asarray(to_pil(expected)))


# ---- LooseRoPE ----------------------------------------------------------------------------------------------------
QWEN_EDIT_SIZE = ["--set", "sampler.height+=64", "--set", "sampler.width+=64"]
# Qwen-Image-Edit(-Plus) give the collage to the model at ~1024^2 pixels whatever its size (4096 tokens): 35-75 s here
SLOW = [pytest.mark.slow, pytest.mark.skipif(os.environ.get("MMPOS_SLOW") != "1", reason="slow (MMPOS_SLOW=1)")]
LOOSE = [
    pytest.param("klein", 64, [], id="klein"),  # Klein takes images of 64 px and more
    pytest.param("qwen_edit", 64, QWEN_EDIT_SIZE, id="qwen_edit", marks=SLOW),
    pytest.param("qwen_edit_plus", 64, QWEN_EDIT_SIZE, id="qwen_edit_plus", marks=SLOW),
]


@pytest.mark.parametrize("name, side, size", LOOSE)
def test_loose_cli_runs_the_familys_pipeline_and_strength_0_is_stock(tiny, tmp_path, name, side, size):
    root = tiny[0]
    collage, mask = root / f"collage{side}.png", root / f"mask{side}.png"
    inputs = ["--image", str(collage), "--mask", str(mask), "--set", "figure.sweep=[]", *size]
    edit(tiny, "loose", name, tmp_path / "on", 1, *inputs, "--set", "loose.step_range=[0, 1]")
    assert written(tmp_path / "on") == {"edited_0.png", "comparison.png", "diagnostic.png"}
    assert pixels(tmp_path / "on" / "edited_0.png").shape == (side, side, 3)
    off = edit(tiny, "loose", name, tmp_path / "off", 1, *inputs, "--set", "loose.strength=0.0", "--no-figures")
    expected = stock_images(tiny, name, off, 1, image=Image.open(collage).convert("RGB"))
    assert np.array_equal(pixels(tmp_path / "off" / "edited_0.png"), np.asarray(to_pil(expected[0])))
    assert not np.array_equal(pixels(tmp_path / "on" / "edited_0.png"), np.asarray(to_pil(expected[0])))


# ---- a model no pipeline of the method runs -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "class_name, transformer",
    [("StableDiffusion3Pipeline", "SD3Transformer2DModel"), ("MyOwnPipeline", "MyOwnTransformer")],
)
@pytest.mark.parametrize("method", ["band", "transplant", "loose"])
def test_a_model_the_method_does_not_know_is_one_line_naming_its_families(
    tmp_path, capsys, method, class_name, transformer
):
    folder = tmp_path / "model"
    folder.mkdir()
    index = {
        "_class_name": class_name,
        "transformer": ["diffusers", transformer],
        "vae": ["diffusers", "AutoencoderKL"],
    }
    (folder / "model_index.json").write_text(json.dumps(index))
    inputs = {
        "band": [],
        "transplant": ["--background", "bg.png", "--mask", "m.png", "--reference", "r.png"],
        "loose": ["--image", "c.png", "--mask", "m.png"],
    }[method]
    with pytest.raises(SystemExit) as exit_info:
        main(["edit", method, "--model", str(folder), *inputs, "--device", "cpu", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert f"is a {class_name};" in err  # no family claims it
    for key in get_edit(method).pipelines:  # every pipeline class the method runs on, and its families
        assert key in err
    families = {"band": ["flux", "flux2", "qwen", "qwenimage21", "z_image"], "transplant": ["flux", "flux2", "qwen"],
                "loose": ["flux", "flux2", "qwen"]}[method]  # fmt: skip
    assert f"families {', '.join(families)})" in err
    assert not (tmp_path / "out").exists()


def test_the_released_klein_and_qwen_image_folders_run_transplant_on_their_inpainting_pipeline(tiny):
    from mmpos.pipelines.edits import pipeline_for
    from mmpos.pipelines.edits.transplant.pipeline_inpaint import (
        PosBridgeKleinInpaintPipeline,
        PosBridgeQwenInpaintPipeline,
    )

    transplant = get_edit("transplant")
    assert pipeline_for(transplant, tiny[1]["klein"]) is PosBridgeKleinInpaintPipeline  # saved as Flux2KleinPipeline
    assert pipeline_for(transplant, tiny[1]["qwen"]) is PosBridgeQwenInpaintPipeline  # saved as QwenImagePipeline
    pipe = load_pipeline_class(PosBridgeQwenInpaintPipeline, tiny[1]["qwen"], "float32", "cpu")
    assert isinstance(pipe, diffusers.QwenImageInpaintPipeline) and pipe.vae is not None
