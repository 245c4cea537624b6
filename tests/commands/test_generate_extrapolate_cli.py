"""`mmpos generate --height/--width --extrapolate` on a tiny FLUX pipeline saved to disk."""

import numpy as np
import pytest
import torch
import yaml
from diffusers import FluxPipeline
from PIL import Image
from safetensors.torch import save_file

from mmpos.cli import main
from mmpos.pipelines.commands._options import fresh_folder
from mmpos.pipelines.extrapolate import parse_extrapolate
from tests.fixtures.tiny_models import components, embeddings

COMMON = [
    "--device",
    "cpu",
    "--dtype",
    "float32",
    "--set",
    "sampler.num_inference_steps=2",
    "--set",
    "sampler.max_sequence_length=6",
    "--train-size",
    "32",
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_generate")
    FluxPipeline(**components("flux")).save_pretrained(root / "flux")
    save_file(embeddings(1), str(root / "embeds.safetensors"))
    return ["--model", str(root / "flux"), "--prompt-embeds", str(root / "embeds.safetensors")]


def pixels(folder):
    return np.asarray(Image.open(folder / "image_0.png"))


def test_generate_with_dype_saves_the_schedule_and_is_stock_at_the_training_size(saved, tmp_path, capsys):
    torch.set_num_threads(1)
    for preset in ("none", "dype"):
        assert (
            main(
                [
                    "generate",
                    *saved,
                    *COMMON,
                    "--height",
                    "32",
                    "--width",
                    "32",
                    "--extrapolate",
                    preset,
                    "--out",
                    str(tmp_path / f"1x_{preset}"),
                ]
            )
            == 0
        )
    assert np.array_equal(pixels(tmp_path / "1x_none"), pixels(tmp_path / "1x_dype"))
    assert (
        main(
            [
                "generate",
                *saved,
                *COMMON,
                "--height",
                "64",
                "--width",
                "96",
                "--extrapolate",
                "row=dype,col=ntk",
                "--out",
                str(tmp_path / "big"),
            ]
        )
        == 0
    )
    assert Image.open(tmp_path / "big" / "image_0.png").size == (96, 64)
    installed = yaml.safe_load((tmp_path / "big" / "config.yaml").read_text())["extrapolate"]["installed"]
    assert installed["trained_grid"] == [2.0, 2.0]  # 32 px / 16 px per token
    assert installed["schedules"]["row"]["dynamic"] and installed["schedules"]["row"]["method"] == "vision_yarn"
    assert installed["schedules"]["col"] == {"method": "ntk", "original_length": 2.0, "dynamic": False}
    assert '"row": "dype"' in capsys.readouterr().out  # printed


def test_unnamed_outputs_never_overwrite_an_earlier_run(saved, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        assert main(["generate", *saved, *COMMON, "--height", "32", "--width", "32"]) == 0
    assert (tmp_path / "outputs/generate/image_0.png").is_file()
    assert (tmp_path / "outputs/generate-2/image_0.png").is_file()
    assert fresh_folder(tmp_path / "outputs/generate") == tmp_path / "outputs/generate-3"


def test_prompt_embeds_with_the_world_model_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "generate",
                "--model",
                "world",
                "--prompt-embeds",
                str(tmp_path / "embeds.pt"),
                "--out",
                str(tmp_path / "out"),
            ]
        )
    assert exit_info.value.code == 2 and "--prompt-embeds is for FLUX.1 / Qwen-Image" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_bad_preset_is_one_line_and_exit_code_2(saved, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", *saved, *COMMON, "--extrapolate", "dyp"])
    assert exit_info.value.code == 2
    assert "--extrapolate 'dyp': preset 'dyp' is unknown" in capsys.readouterr().err
    with pytest.raises(ValueError, match="axis 'rows' is unknown"):
        parse_extrapolate("rows=dype")


def test_an_axis_given_twice_is_refused_not_the_last_one_taken():
    with pytest.raises(ValueError, match="axis 'row' is given twice"):
        parse_extrapolate("row=dype,row=ntk")
    assert parse_extrapolate("row=dype,col=ntk") == {"row": "dype", "col": "ntk"}


def test_ultraimage_composes_with_dype_and_is_stock_at_the_training_size(saved, tmp_path):
    """``--extrapolate dype+ultraimage``: the attention rule after ``+``; at the training size the image is the
    stock one, past it UltraImage changes it (against DyPE alone) and the config records the rule."""
    torch.set_num_threads(1)
    runs = {"1x_none": ("none", "32"), "1x_both": ("dype+ultraimage", "32"), "big_dype": ("dype", "64")}
    runs["big_both"] = ("dype+ultraimage", "64")
    runs["big_spa"] = ("dype+spa", "64")
    for name, (preset, side) in runs.items():
        args = ["generate", *saved, *COMMON, "--height", side, "--width", side, "--extrapolate", preset]
        assert main([*args, "--out", str(tmp_path / name)]) == 0
    assert np.array_equal(pixels(tmp_path / "1x_none"), pixels(tmp_path / "1x_both"))
    change = np.abs(pixels(tmp_path / "big_both").astype(float) - pixels(tmp_path / "big_dype")).mean()
    assert change > 0.05  # of 255 (random tiny weights: small logits; 0 without the rule)
    installed = yaml.safe_load((tmp_path / "big_both" / "config.yaml").read_text())["extrapolate"]["installed"]
    assert installed["rules"] == ["ultraimage"] and installed["schedules"]["row"]["dynamic"]
    spa = np.abs(pixels(tmp_path / "big_spa").astype(float) - pixels(tmp_path / "big_dype")).mean()
    assert spa > 0.05  # SPA on the first 3 steps: 4 x 4 tokens, 2 x 2 trained -> 3 bundles a side, 3 grids


def test_attention_rules_parse_after_a_plus():
    from mmpos.pipelines.extrapolate import split_rules

    assert split_rules("dype+ultraimage") == ("dype", ["ultraimage"])
    assert split_rules("ultraimage") == ("none", ["ultraimage"])
    assert parse_extrapolate("row=dype,col=ntk+ultraimage") == {"row": "dype", "col": "ntk"}
    with pytest.raises(ValueError, match="one position preset"):
        split_rules("dype+ntk")
    with pytest.raises(ValueError, match="one attention rule at a time"):
        split_rules("ultraimage+spa")
    assert split_rules("dype+spa") == ("dype", ["spa"])


@pytest.mark.parametrize("family", ["flux2", "qwen", "z_image"])
def test_spa_from_the_command_line_on_the_tiny_family_folders(family, tmp_path, capsys):
    """``mmpos tiny-pipeline FAMILY`` then ``mmpos generate ... --extrapolate dype+spa``: at the folder's size (the
    training size here) the stock image, at twice the side SPA's image differs from DyPE's alone."""
    import shlex

    torch.set_num_threads(1)
    assert main(["tiny-pipeline", family, "--out", str(tmp_path / "tiny")]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("mmpos generate"))
    command = shlex.split(line.strip())[1:]
    side = int(command[command.index("--height") + 1])
    runs = {"1x_none": ("none", side), "1x_spa": ("dype+spa", side), "2x_dype": ("dype", 2 * side)}
    runs["2x_spa"] = ("dype+spa", 2 * side)
    for name, (preset, size) in runs.items():
        sizes = ["--height", str(size), "--width", str(size), "--train-size", str(side)]
        assert main([*command, *sizes, "--extrapolate", preset, "--out", str(tmp_path / name)]) == 0
    assert np.array_equal(pixels(tmp_path / "1x_none"), pixels(tmp_path / "1x_spa"))
    # random tiny weights, 2 steps, 3 bundle grids: the change is small (measured: FLUX.2 0.04, Qwen-Image 0.004,
    # Z-Image 1.2 of 255 on average) but there, where DyPE alone gives the same image every run
    assert np.abs(pixels(tmp_path / "2x_spa").astype(float) - pixels(tmp_path / "2x_dype")).mean() > 1e-3
    installed = yaml.safe_load((tmp_path / "2x_spa" / "config.yaml").read_text())["extrapolate"]["installed"]
    assert installed["rules"] == ["spa"]


def test_sega_brings_its_ntk_base_is_stock_at_the_training_size_and_changes_ntk_past_it(saved, tmp_path):
    """``--extrapolate sega``: SEGA's factors over the NTK preset (the port's base); ``none+sega`` on the stock
    ladder. At the training size the image is the stock one; past it, a measured change against NTK alone."""
    from mmpos.pipelines.extrapolate import split_rules

    assert split_rules("sega") == ("ntk", ["sega"]) and split_rules("none+sega") == ("none", ["sega"])
    assert split_rules("dype+sega") == ("dype", ["sega"])
    torch.set_num_threads(1)
    runs = {"1x_none": ("none", "32"), "1x_sega": ("sega", "32"), "big_ntk": ("ntk", "64"), "big_sega": ("sega", "64")}
    for name, (preset, side) in runs.items():
        args = ["generate", *saved, *COMMON, "--height", side, "--width", side, "--extrapolate", preset]
        assert main([*args, "--out", str(tmp_path / name)]) == 0
    assert np.array_equal(pixels(tmp_path / "1x_none"), pixels(tmp_path / "1x_sega"))
    change = np.abs(pixels(tmp_path / "big_sega").astype(float) - pixels(tmp_path / "big_ntk")).mean()
    assert change > 0.01  # of 255 (0 without the rule; factors about m_ref = 2 ** 0.08 = 1.057, 2 steps)
    installed = yaml.safe_load((tmp_path / "big_sega" / "config.yaml").read_text())["extrapolate"]["installed"]
    assert installed["rules"] == ["sega"] and installed["schedules"]["row"]["method"] == "ntk"


def test_install_rules_puts_sega_on_qwen_image_with_its_stock_processors():
    """``--extrapolate sega`` on Qwen-Image: ``set_pe`` native (no ``rope_axial`` fallback: the stock processors
    read the tables SEGA scales), the NTK ladder on the rows and columns and the rule at the training grid."""
    from mmpos.integrations.diffusers.attention_rules import SpectralRule, encoding_processors
    from mmpos.integrations.diffusers.families.tiny import CASES
    from mmpos.pipelines.extrapolate import install_rules
    from mmpos.spectrum.schedule import extrapolation_preset

    model = CASES["qwen"].model()
    install_rules(model, ["sega"], (4.0, 4.0), [None, *extrapolation_preset("ntk", (4.0, 4.0))])
    state = model._mmpos_attention_rule[0]
    assert isinstance(state, SpectralRule) and state.train_grid == (4.0, 4.0)
    assert not encoding_processors(model) and model.pos_embed.native
