"""`mmpos generate --model <Qwen-Image> --extrapolate ...` on a tiny QwenImagePipeline saved to disk (built offline:
tiny transformer, VAE, Qwen2.5-VL text encoder and tokenizer): the CLI loads the pipeline its model_index.json
names, is the stock pipeline at the training size, and extrapolates above it."""

import numpy as np
import pytest
import torch
import yaml
from diffusers import QwenImagePipeline
from PIL import Image
from safetensors.torch import save_file

from mmpos.cli import main
from mmpos.pipelines.images import save_image
from mmpos.pipelines.loading import generate_kind
from tests.fixtures.tiny_qwen_image import qwen_prompt_embeds, tiny_qwen_image_components

COMMON = ["--device", "cpu", "--dtype", "float32", "--set", "sampler.num_inference_steps=2", "--train-size", "32"]
PROMPT = "a red circle on a blue background"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_qwen_generate")
    QwenImagePipeline(**tiny_qwen_image_components()).save_pretrained(root / "qwen")
    QwenImagePipeline(**tiny_qwen_image_components(text_encoder=False)).save_pretrained(root / "qwen_no_text")
    save_file(qwen_prompt_embeds(), str(root / "embeds.safetensors"))
    return root


def pixels(path):
    return np.asarray(Image.open(path))


def generate(saved, out, *extra):
    torch.set_num_threads(1)
    return main(["generate", "--model", str(saved / "qwen"), "--prompt", PROMPT, *COMMON, "--out", str(out), *extra])


def test_the_model_index_picks_the_pipeline(saved, capsys):
    assert generate_kind(saved / "qwen") == "generate_qwen"
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--model", str(saved), *COMMON])  # no model_index.json there
    assert exit_info.value.code == 2
    assert f"--model {saved}: no diffusers pipeline there" in capsys.readouterr().err


def test_qwen_generate_is_stock_at_the_training_size_and_extrapolates_above(saved, tmp_path):
    for preset in ("none", "dype"):
        assert (
            generate(saved, tmp_path / f"1x_{preset}", "--height", "32", "--width", "32", "--extrapolate", preset) == 0
        )
    stock = QwenImagePipeline.from_pretrained(saved / "qwen")(
        prompt=[PROMPT],
        height=32,
        width=32,
        num_inference_steps=2,
        max_sequence_length=512,
        output_type="pt",
        generator=torch.Generator().manual_seed(0),
    ).images[0]
    save_image(stock, tmp_path / "stock.png")
    assert np.array_equal(pixels(tmp_path / "1x_none/image_0.png"), pixels(tmp_path / "stock.png"))
    assert np.array_equal(pixels(tmp_path / "1x_dype/image_0.png"), pixels(tmp_path / "stock.png"))
    # 4x: the text tokens keep the training spectrum, so the change is the image tokens' alone (at 2x, on these
    # 4-channel axes, smaller than a uint8 step)
    for preset in ("none", "ntk"):
        assert (
            generate(saved, tmp_path / f"4x_{preset}", "--height", "128", "--width", "128", "--extrapolate", preset)
            == 0
        )
    assert Image.open(tmp_path / "4x_ntk/image_0.png").size == (128, 128)
    assert not np.array_equal(pixels(tmp_path / "4x_none/image_0.png"), pixels(tmp_path / "4x_ntk/image_0.png"))
    config = yaml.safe_load((tmp_path / "4x_ntk/config.yaml").read_text())
    assert config["pipeline"] == "QwenImagePipeline"
    installed = config["extrapolate"]["installed"]
    assert installed["trained_grid"] == [2.0, 2.0]  # 32 px / 16 px per token
    assert installed["schedules"]["row"] == {"method": "ntk", "original_length": 2.0, "dynamic": False}


def test_qwen_generate_from_prompt_embeds_without_a_text_encoder(saved, tmp_path, capsys):
    embeds = ["--model", str(saved / "qwen_no_text"), "--prompt-embeds", str(saved / "embeds.safetensors")]
    assert (
        main(
            [
                "generate",
                *embeds,
                *COMMON,
                "--height",
                "64",
                "--width",
                "32",
                "--extrapolate",
                "dype",
                "--out",
                str(tmp_path / "embeds"),
            ]
        )
        == 0
    )
    assert Image.open(tmp_path / "embeds/image_0.png").size == (32, 64)
    save_file({"pooled_prompt_embeds": torch.zeros(1, 16)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(SystemExit) as exit_info:  # a user error: one line, exit code 2
        main(
            [
                "generate",
                "--model",
                str(saved / "qwen_no_text"),
                "--prompt-embeds",
                str(tmp_path / "bad.safetensors"),
                *COMMON,
                "--out",
                str(tmp_path / "bad"),
            ]
        )
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and "lacks ['prompt_embeds']; expected prompt_embeds" in last
