"""`mmpos generate --model FOLDER` with the pipeline of a registered family (a tiny offline FLUX.2 Klein here):
the pipeline is picked from ``model_index.json``, the training size from the family, DyPE goes to its image axes."""

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from safetensors.torch import save_file

from mmpos.cli import main

COMMON = [
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--set",
    "sampler.num_inference_steps=2",
    "--set",
    "sampler.guidance_scale=1.0",
    "--set",
    "sampler.max_sequence_length=5",
]


@pytest.fixture(scope="module")
def klein(tmp_path_factory):
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline

    from mmpos.integrations.diffusers.families.tiny import tiny_flux2

    root = tmp_path_factory.mktemp("tiny_klein")
    torch.manual_seed(0)
    vae = AutoencoderKLFlux2(
        block_out_channels=(4,),
        down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",),
        layers_per_block=1,
        latent_channels=1,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    torch.manual_seed(0)
    Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        transformer=tiny_flux2().eval(),
    ).save_pretrained(root / "klein")
    save_file(
        {"prompt_embeds": torch.randn(1, 5, 16, generator=torch.Generator().manual_seed(1))},
        str(root / "embeds.safetensors"),
    )
    return ["--model", str(root / "klein"), "--prompt-embeds", str(root / "embeds.safetensors")]


def pixels(folder):
    return np.asarray(Image.open(folder / "image_0.png"))


def generate(klein, out, *extra):
    return main(["generate", *klein, *COMMON, "--out", str(out), *extra])


def test_a_family_pipeline_generates_and_extrapolates_on_its_image_axes(klein, tmp_path, capsys):
    torch.set_num_threads(1)
    # this tiny VAE has one block: 2 px per token, so 8 px is a 4 x 4 token training grid
    for preset in ("none", "dype"):
        assert (
            generate(
                klein,
                tmp_path / f"1x_{preset}",
                "--height",
                "8",
                "--width",
                "8",
                "--train-size",
                "8",
                "--extrapolate",
                preset,
            )
            == 0
        )
    assert "(Flux2KleinPipeline)" in capsys.readouterr().out
    assert np.array_equal(pixels(tmp_path / "1x_none"), pixels(tmp_path / "1x_dype"))  # at the training size: stock
    for preset in ("none", "ntk"):
        assert (
            generate(
                klein,
                tmp_path / f"4x_{preset}",
                "--height",
                "32",
                "--width",
                "32",
                "--train-size",
                "8",
                "--extrapolate",
                preset,
            )
            == 0
        )
    assert Image.open(tmp_path / "4x_ntk" / "image_0.png").size == (32, 32)
    assert not np.array_equal(pixels(tmp_path / "4x_none"), pixels(tmp_path / "4x_ntk"))
    config = yaml.safe_load((tmp_path / "4x_ntk" / "config.yaml").read_text())
    assert config["pipeline"] == "Flux2KleinPipeline"
    assert config["extrapolate"]["installed"]["trained_grid"] == [4.0, 4.0]


def test_the_training_size_defaults_to_the_familys(klein, tmp_path):
    assert generate(klein, tmp_path / "auto", "--height", "8", "--width", "8", "--extrapolate", "ntk") == 0
    config = yaml.safe_load((tmp_path / "auto" / "config.yaml").read_text())
    assert config["extrapolate"]["installed"]["train_size"] == [1024, 1024]  # FLUX.2's 1:1 size


def test_a_pipeline_no_family_knows_is_refused_naming_the_known_ones(tmp_path, capsys):
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline"}')
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--model", str(folder), *COMMON, "--out", str(tmp_path / "x")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "a StableDiffusionPipeline pipeline" in err and "Flux2KleinPipeline" in err and "FluxPipeline" in err
