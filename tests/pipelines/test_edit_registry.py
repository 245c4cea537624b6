"""Edit methods as a registered extension point (mmpos.pipelines.edits): the shipped methods' records, the
pipeline picked from a model's ``model_index.json``, and a method registered here being a command (its help, its
options) whose runner is the stock pipeline at zero strength on a tiny world model."""

import json

import numpy as np
import pytest
import torch
from diffusers import FluxPipeline

from mmpos.models.world.image import build_pipeline, build_text_encoder, build_transformer, build_vae, conditioning
from mmpos.models.world.samples import generate
from mmpos.pipelines.commands import build_parser, main
from mmpos.pipelines.commands.edit import edit_config
from mmpos.pipelines.edits import (
    EditMethod,
    UnsupportedModelError,
    get_edit,
    list_edits,
    pipeline_for,
    register_edit,
    resolve_pipeline,
    run_edit,
    unregister_edit,
)
from mmpos.pipelines.edits.band.pipelines import (
    BandModulationFlux2KleinPipeline,
    BandModulationFlux2Pipeline,
    BandModulationFluxPipeline,
    BandModulationKontextPipeline,
    BandModulationQwenImage21Pipeline,
    BandModulationQwenImagePipeline,
    BandModulationZImagePipeline,
)
from mmpos.pipelines.edits.detect import index_pipeline_keys
from mmpos.pipelines.edits.loose.pipelines import (
    LooseRoPEKleinPipeline,
    LooseRoPEKontextPipeline,
    LooseRoPEQwenEditPipeline,
    LooseRoPEQwenEditPlusPipeline,
)
from mmpos.pipelines.edits.transplant.pipeline_fill import PosBridgeFillPipeline
from mmpos.pipelines.edits.transplant.pipeline_inpaint import (
    PosBridgeKleinInpaintPipeline,
    PosBridgeQwenInpaintPipeline,
)
from mmpos.pipelines.loading import resolve_model
from tests.models.test_world_models import SIZE, TINY_TEXT, TINY_TRANSFORMER, TINY_VAE


def test_the_shipped_methods_are_registered_with_pipelines_that_take_their_options():
    import inspect

    assert list_edits()[:3] == ["band", "transplant", "loose"]
    for name in ("band", "transplant", "loose"):
        method = get_edit(name)
        assert method.world_task in ("t2i", "fill", "kontext") and method.demo_section is not None
        for key in method.pipelines:
            assert name in inspect.signature(method.pipeline_class(key).__call__).parameters
        assert {f.name for f in __import__("dataclasses").fields(method.options_class())} >= {"enabled"}
    with pytest.raises(ValueError, match="unknown edit method 'paint'; expected one of"):
        get_edit("paint")
    with pytest.raises(ValueError, match="already registered"):
        register_edit(EditMethod(**{**vars(get_edit("band")), "help": "another band"}))


def saved_index(folder, class_name, transformer="FluxTransformer2DModel"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model_index.json").write_text(
        json.dumps({"_class_name": class_name, "transformer": ["diffusers", transformer]})
    )
    return folder


@pytest.mark.parametrize(
    "method, class_name, expected",
    [
        ("band", "FluxPipeline", BandModulationFluxPipeline),
        ("band", "FluxKontextPipeline", BandModulationKontextPipeline),
        ("transplant", "FluxFillPipeline", PosBridgeFillPipeline),
        ("loose", "FluxKontextPipeline", LooseRoPEKontextPipeline),
        ("band", "Flux2Pipeline", BandModulationFlux2Pipeline),
        ("band", "Flux2KleinPipeline", BandModulationFlux2KleinPipeline),
        ("band", "QwenImagePipeline", BandModulationQwenImagePipeline),
        ("band", "QwenImage21Pipeline", BandModulationQwenImage21Pipeline),
        ("band", "ZImagePipeline", BandModulationZImagePipeline),
        ("transplant", "Flux2KleinInpaintPipeline", PosBridgeKleinInpaintPipeline),
        ("transplant", "QwenImageInpaintPipeline", PosBridgeQwenInpaintPipeline),
        ("loose", "Flux2KleinPipeline", LooseRoPEKleinPipeline),
        ("loose", "QwenImageEditPipeline", LooseRoPEQwenEditPipeline),
        ("loose", "QwenImageEditPlusPipeline", LooseRoPEQwenEditPlusPipeline),
    ],
)
def test_the_model_index_picks_the_methods_pipeline(tmp_path, method, class_name, expected):
    assert pipeline_for(get_edit(method), saved_index(tmp_path / class_name, class_name)) is expected


@pytest.mark.parametrize(
    "method, class_name, transformer, named",
    [
        ("transplant", "FluxPipeline", "FluxTransformer2DModel", "a FluxPipeline (family flux)"),
        ("loose", "FluxFillPipeline", "FluxTransformer2DModel", "a FluxFillPipeline (family flux)"),
        ("band", "QwenImageEditPipeline", "QwenImageTransformer2DModel", "a QwenImageEditPipeline (family qwen)"),
        ("transplant", "Flux2Pipeline", "Flux2Transformer2DModel", "a Flux2Pipeline (family flux2)"),
        ("band", "MyOwnPipeline", "MyOwnTransformer", "a MyOwnPipeline;"),
    ],
)
def test_a_model_the_method_does_not_run_on_is_a_named_error(tmp_path, method, class_name, transformer, named):
    edit = get_edit(method)
    with pytest.raises(UnsupportedModelError) as error:
        pipeline_for(edit, saved_index(tmp_path / "m", class_name, transformer))
    message = str(error.value)
    assert named in message and f"`mmpos edit {method}` runs on: {', '.join(edit.pipelines)}" in message


def test_a_family_key_covers_the_familys_pipelines_and_a_class_key_comes_first():
    toy = EditMethod(
        name="toy_keys",
        help="",
        config_class="x:Y",
        world_task="t2i",
        add_options=None,
        flag_keys={},
        collect=None,
        cli_run=None,
        pipelines={"FluxKontextPipeline": "kontext", "flux": "any flux"},
    )
    assert index_pipeline_keys({"_class_name": "FluxFillPipeline"}) == ["FluxFillPipeline", "flux"]
    subclass = {"_class_name": "BandModulationFluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"]}
    assert index_pipeline_keys(subclass) == ["BandModulationFluxPipeline", "flux"]  # family from the transformer
    for class_name, key in (
        ("FluxFillPipeline", "flux"),
        ("FluxKontextPipeline", "FluxKontextPipeline"),
        ("BandModulationFluxPipeline", "flux"),
    ):
        keys = index_pipeline_keys({"_class_name": class_name, "transformer": ["diffusers", "FluxTransformer2DModel"]})
        assert resolve_pipeline(toy, keys) == key


def test_band_follows_the_model_unless_the_config_names_a_variant(tmp_path):
    kontext = str(saved_index(tmp_path / "kontext", "FluxKontextPipeline"))
    config = {"model": kontext, "variant": "auto"}
    assert resolve_model(get_edit("band"), config) == (kontext, BandModulationKontextPipeline)
    assert config["variant"] == "kontext"  # the saved config says what ran
    assert resolve_model(get_edit("band"), {"model": kontext, "variant": "flux"})[1] is BandModulationFluxPipeline
    with pytest.raises(ValueError, match="variant='sdxl': expected auto or one of"):
        resolve_model(get_edit("band"), {"model": kontext, "variant": "sdxl"})


def test_the_cli_refuses_a_model_the_method_does_not_run_on_in_one_line(tmp_path, capsys):
    folder = saved_index(tmp_path / "flux", "FluxPipeline")
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "edit",
                "transplant",
                "--model",
                str(folder),
                "--background",
                "bg.png",
                "--mask",
                "m.png",
                "--reference",
                "r.png",
                "--device",
                "cpu",
                "--out",
                str(tmp_path / "out"),
            ]
        )
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "is a FluxPipeline (family flux); `mmpos edit transplant` runs on: FluxFillPipeline" in err
    assert not (tmp_path / "out").exists()


# ----- a method registered here --------------------------------------------------------------------------------
class ShiftedFluxPipeline(FluxPipeline):
    """FLUX.1 with the image tokens' positions moved by ``shift={"rows": r, "cols": c}`` tokens."""

    def __call__(self, *args, shift=None, **kwargs):
        self.offset = (float((shift or {}).get("rows", 0.0)), float((shift or {}).get("cols", 0.0)))
        return super().__call__(*args, **kwargs)

    def prepare_latents(self, *args, **kwargs):
        latents, ids = super().prepare_latents(*args, **kwargs)
        return latents, ids + ids.new_tensor([0.0, *self.offset])


def _add_options(parser):
    parser.add_argument("--rows", type=float, help="tokens to shift down (default: the config's shift.rows)")


@pytest.fixture
def shift():
    method = register_edit(
        EditMethod(
            name="shift",
            help="toy: shifted image positions",
            config_class=dict,
            world_task="t2i",
            pipelines={"FluxPipeline": ShiftedFluxPipeline},
            add_options=_add_options,
            flag_keys={"rows": "shift.rows"},
            collect=lambda result, call: {"outputs": result.images},
            cli_run=None,
        )
    )
    yield method
    unregister_edit("shift")
    assert "shift" not in list_edits()


def test_a_registered_method_is_an_edit_command_with_its_options(shift, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["edit", "--help"])
    assert "toy: shifted image positions" in capsys.readouterr().out
    config = tmp_path / "shift.yaml"
    config.write_text("model: world\ndevice: cpu\ndtype: float32\nshift: {rows: 1.0}\n")
    args = build_parser().parse_args(["edit", "shift", "--config", str(config), "--rows", "2.5"])
    assert args.method == "shift" and args.rows == 2.5
    resolved = edit_config(args)
    assert resolved["shift"] == {"rows": 2.5} and resolved["model"] == "world"
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["edit", "shift", "--rows", "two"])
    assert exit_info.value.code == 2 and "argument --rows: invalid float value" in capsys.readouterr().err


def test_a_registered_methods_runner_on_a_tiny_world_model(shift):
    torch.manual_seed(0)
    transformer = build_transformer("t2i", **TINY_TRANSFORMER)
    pipe = build_pipeline(
        "t2i",
        build_vae(**TINY_VAE),
        transformer,
        build_text_encoder(transformer, **TINY_TEXT),
        pipeline_class=pipeline_for_world(shift),
    )
    pipe.set_progress_bar_config(disable=True)
    captions = ["a large blue square at center", "a small red circle at top left"]
    calls = [dict(num_inference_steps=2, height=SIZE, width=SIZE, **conditioning(pipe, [c], 3.0)) for c in captions]
    still = run_edit(shift, pipe, calls, {"rows": 0.0})
    assert still.outputs.shape == (2, SIZE, SIZE, 3) and still.outputs.dtype == np.uint8
    stock = build_pipeline("t2i", pipe.vae, pipe.transformer, pipe.text_encoder)
    stock.set_progress_bar_config(disable=True)
    blank = np.zeros((SIZE, SIZE, 3), np.uint8)
    plain = np.concatenate(
        [
            generate(stock, "t2i", [{"image": blank, "caption": c}], steps=2, guidance=3.0, seed=i)
            for i, c in enumerate(captions)
        ]
    )
    assert np.array_equal(still.outputs, plain)  # example i sampled with seed 0 + i
    moved = run_edit(shift, pipe, calls, {"rows": 3.0})
    assert not np.array_equal(moved.outputs, still.outputs)


def pipeline_for_world(method):
    from mmpos.pipelines.world.sources import world_pipeline_class

    return world_pipeline_class(method.name, method.world_task)
