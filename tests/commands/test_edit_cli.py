"""`mmpos edit {band,transplant,loose}` / `mmpos generate` on tiny pipelines saved to disk (from_pretrained)."""

import json

import pytest
import torch
from diffusers import FluxFillPipeline, FluxKontextPipeline, FluxPipeline
from PIL import Image
from safetensors.torch import save_file

from mmpos.cli import main
from mmpos.pipelines.loading import load_pipeline
from tests.fixtures.tiny_models import components, embeddings, image


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    paths = {}
    for kind, cls in (("flux", FluxPipeline), ("fill", FluxFillPipeline), ("kontext", FluxKontextPipeline)):
        paths[kind] = root / kind
        cls(**components(kind)).save_pretrained(paths[kind])
    for batch in (1, 3):
        save_file(embeddings(batch), str(root / f"embeds{batch}.safetensors"))
    Image.fromarray((image(32, 48)[0].permute(1, 2, 0).numpy() * 255).astype("uint8")).save(root / "bg.png")
    Image.fromarray((image(40, 30, seed=5)[0].permute(1, 2, 0).numpy() * 255).astype("uint8")).save(root / "ref.png")
    mask = torch.zeros(32, 48, dtype=torch.uint8)
    mask[8:24, 16:40] = 255
    Image.fromarray(mask.numpy()).save(root / "mask.png")
    return root, paths


def test_from_pretrained_loads_the_same_weights(saved):
    root, paths = saved
    pipe = load_pipeline("band", paths["flux"], dtype="float32")
    stock = FluxPipeline(**components("flux"))
    e = embeddings(3)
    kwargs = dict(height=32, width=32, num_inference_steps=2, output_type="latent", **e)
    ours = pipe(band={"enabled": False}, generator=torch.Generator().manual_seed(0), **kwargs).images
    assert torch.equal(ours, stock(generator=torch.Generator().manual_seed(0), **kwargs).images)
    for kind, path in (("transplant", paths["fill"]), ("loose", paths["kontext"]), ("band", paths["kontext"])):
        assert load_pipeline(kind, path, dtype="float32").text_encoder is None
    assert type(load_pipeline("band", paths["kontext"], dtype="float32")).__name__ == "BandModulationKontextPipeline"
    with pytest.raises(ValueError, match="pipeline kind"):  # no alias kinds: an edit is named by its method
        load_pipeline("band_kontext", paths["kontext"], dtype="float32")


COMMON = ["--device", "cpu", "--dtype", "float32", "--set", "sampler.num_inference_steps=2"]


def test_edit_band_cli(saved, tmp_path):
    root, paths = saved
    out = tmp_path / "band"
    assert (
        main(
            [
                "edit",
                "band",
                "--model",
                str(paths["flux"]),
                "--prompt-embeds",
                str(root / "embeds3.safetensors"),
                "--out",
                str(out),
                "--set",
                "sampler.height=32",
                "--set",
                "sampler.width=48",
                "--set",
                "figure.sweep=[0.0, 1.0]",
                *COMMON,
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert {p.split("/")[-1] for p in summary["outputs"]} == {
        "edited_0.png",
        "edited_1.png",
        "comparison.png",
        "diagnostic.png",
    }
    assert Image.open(out / "edited_0.png").size == (48, 32)
    assert "band" in (out / "config.yaml").read_text()


def test_a_named_out_that_holds_files_is_refused_unless_overwrite(saved, tmp_path, capsys):
    root, paths = saved
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.yaml").write_text("my own notes\n")
    args = [
        "edit",
        "band",
        "--model",
        str(paths["flux"]),
        "--prompt-embeds",
        str(root / "embeds3.safetensors"),
        "--out",
        str(out),
        "--set",
        "sampler.height=32",
        "--set",
        "sampler.width=48",
        "--no-figures",
        *COMMON,
    ]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert "already holds files" in capsys.readouterr().err
    assert (out / "config.yaml").read_text() == "my own notes\n"  # untouched
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--out", str(out / "config.yaml"), "--model", str(paths["flux"]), *COMMON])
    assert exit_info.value.code == 2 and "is a file" in capsys.readouterr().err
    assert main(args + ["--overwrite"]) == 0
    assert "band" in (out / "config.yaml").read_text()


def test_edit_transplant_cli_resizes_off_grid_inputs(saved, tmp_path, capsys):
    root, paths = saved
    Image.open(root / "bg.png").resize((50, 34)).save(tmp_path / "bg.png")
    Image.open(root / "mask.png").resize((50, 34), Image.NEAREST).save(tmp_path / "mask.png")
    out = tmp_path / "transplant"
    assert (
        main(
            [
                "edit",
                "transplant",
                "--model",
                str(paths["fill"]),
                "--background",
                str(tmp_path / "bg.png"),
                "--mask",
                str(tmp_path / "mask.png"),
                "--reference",
                str(root / "ref.png"),
                "--prompt-embeds",
                str(root / "embeds1.safetensors"),
                "--out",
                str(out),
                "--set",
                "transplant.tile_fraction=0.5",
                "--set",
                "figure.sweep=[1.01]",
                *COMMON,
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "background: resized 34x50 to 32x48" in printed and "resized 34x50 to 32x48 (nearest)" in printed
    assert Image.open(out / "edited_0.png").size == (48, 32)
    assert (out / "diagnostic.png").is_file() and (out / "comparison.png").is_file()


def test_edit_loose_and_generate_cli(saved, tmp_path, capsys):
    root, paths = saved
    out = tmp_path / "loose"
    assert (
        main(
            [
                "edit",
                "loose",
                "--model",
                str(paths["kontext"]),
                "--image",
                str(root / "bg.png"),
                "--mask",
                str(root / "mask.png"),
                "--prompt-embeds",
                str(root / "embeds1.safetensors"),
                "--out",
                str(out),
                "--set",
                "loose.step_range=[0, 1]",
                "--set",
                "figure.sweep=[0.0]",
                *COMMON,
            ]
        )
        == 0
    )
    assert (out / "comparison.png").is_file() and (out / "diagnostic.png").is_file()
    gen = tmp_path / "gen"
    assert (
        main(
            [
                "generate",
                "--model",
                str(paths["flux"]),
                "--prompt-embeds",
                str(root / "embeds1.safetensors"),
                "--out",
                str(gen),
                "--set",
                "sampler.height=32",
                "--set",
                "sampler.width=32",
                *COMMON,
            ]
        )
        == 0
    )
    assert Image.open(gen / "image_0.png").size == (32, 32)
    capsys.readouterr()
    with pytest.raises(SystemExit) as error:  # a user error: one line, exit code 2
        main(["generate", "--model", str(paths["flux"]), "--set", "sampler.steps=3", *COMMON])
    assert error.value.code == 2 and "unknown key 'steps'" in capsys.readouterr().err


def test_edit_band_kontext_variant_cli(saved, tmp_path):
    root, paths = saved
    out = tmp_path / "band_kontext"
    assert (
        main(
            [
                "edit",
                "band",
                "--model",
                str(paths["kontext"]),
                "--image",
                str(root / "bg.png"),
                "--prompt-embeds",
                str(root / "embeds1.safetensors"),
                "--out",
                str(out),
                "--set",
                "variant=kontext",
                "--set",
                "figure.sweep=[]",
                *COMMON,
            ]
        )
        == 0
    )
    assert Image.open(out / "edited_0.png").size == (48, 32)  # the context image's size, not sampler's 1024
    assert (out / "diagnostic.png").is_file()


@pytest.mark.parametrize(
    "command,bad,message",
    [
        ("generate", ["--config", "/nonexistent/generate.yaml"], "config /nonexistent/generate.yaml does not exist"),
        ("generate", ["--set", "sampler=3"], "'sampler' is a section"),
        ("edit band", ["--set", "band.nosuch=1"], "unknown key 'nosuch'"),
        ("generate", ["--config", "BAD_YAML"], "is not valid YAML"),
    ],
)
def test_config_errors_are_one_line_with_exit_2(tmp_path, capsys, command, bad, message):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("a: [1\n")
    bad = [str(bad_yaml) if arg == "BAD_YAML" else arg for arg in bad]
    with pytest.raises(SystemExit) as error:
        main([*command.split(), "--out", str(tmp_path / "out"), *bad])
    err = capsys.readouterr().err
    assert error.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_edit_resolves_model_once_and_refuses_prompt_embeds_on_a_world_model(tmp_path, capsys, monkeypatch):
    from pathlib import Path

    from mmpos.pipelines import loading

    asked, is_world_model = [], loading.is_world_model
    monkeypatch.setattr(loading, "is_world_model", lambda model: asked.append(str(model)) or is_world_model(model))
    for name in ("b.png", "r.png"):
        Image.new("RGB", (32, 32), (200, 90, 40)).save(tmp_path / name)
    config = Path(__file__).resolve().parents[2] / "configs" / "edit_transplant_world.yaml"
    argv = ["edit", "transplant", "--config", str(config), "--background", str(tmp_path / "b.png")]
    argv += ["--box", "4", "4", "20", "20", "--reference", str(tmp_path / "r.png"), "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--prompt-embeds", str(tmp_path / "embeds.pt")])
    assert exit_info.value.code == 2 and "--prompt-embeds is for FLUX.1 / Qwen-Image" in capsys.readouterr().err
    assert asked == ["world"]  # --model resolved once (ModelRef), not asked again along the run
    assert not (tmp_path / "out").exists()


def test_a_world_model_folder_is_found_by_its_text_encoder_module(tmp_path):
    from mmpos.pipelines.loading import is_world_model

    for module, world in (("mmpos.models.world.text", True), ("mmpos.world.text", False), ("transformers", False)):
        folder = tmp_path / module
        folder.mkdir()
        (folder / "model_index.json").write_text(json.dumps({"text_encoder": [module, "WorldTextEncoder"]}))
        assert is_world_model(folder) is world, module
    assert is_world_model("world") and not is_world_model(tmp_path / "missing")
