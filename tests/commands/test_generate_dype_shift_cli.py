"""`mmpos generate --extrapolate dype --dype-shift authors|comfyui|off` on a tiny FLUX pipeline whose scheduler shifts
with the resolution (Qwen-Image-like max_shift 0.9, so the two conventions differ): the mu each run used is saved in
its config.yaml, and the images follow it."""

import numpy as np
import pytest
import torch
import yaml
from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline
from PIL import Image
from safetensors.torch import save_file

from mmpos.cli import main
from tests.fixtures.tiny_models import components, embeddings

SCHEDULER = dict(
    use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=256, max_image_seq_len=8192
)
COMMON = ["--device", "cpu", "--dtype", "float32", "--set", "sampler.num_inference_steps=2"]
COMMON += ["--set", "sampler.max_sequence_length=6", "--train-size", "32", "--extrapolate", "dype"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_dype_shift")
    parts = dict(components("flux"), scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER))
    FluxPipeline(**parts).save_pretrained(root / "flux")
    save_file(embeddings(1), str(root / "embeds.safetensors"))
    return ["--model", str(root / "flux"), "--prompt-embeds", str(root / "embeds.safetensors")]


def generate(saved, out, size, *extra):
    assert main(["generate", *saved, *COMMON, "--height", size, "--width", size, *extra, "--out", str(out)]) == 0
    config = yaml.safe_load((out / "config.yaml").read_text())
    return config["extrapolate"], np.asarray(Image.open(out / "image_0.png"))


def test_each_convention_sets_its_mu_and_off_keeps_the_pipelines(saved, tmp_path):
    torch.set_num_threads(1)
    authors, authors_image = generate(saved, tmp_path / "authors", "64")  # the default
    comfyui, comfyui_image = generate(saved, tmp_path / "comfyui", "64", "--dype-shift", "comfyui")
    off, off_image = generate(saved, tmp_path / "off", "64", "--dype-shift", "off")
    assert authors["shift"] == "authors" and authors["installed"]["noise_shift"] == {"convention": "authors", "mu": 0.9}
    assert comfyui["installed"]["noise_shift"] == {"convention": "comfyui", "mu": 1.15}  # ComfyUI-DyPE's defaults
    assert off["installed"]["noise_shift"] == {"convention": "off", "mu": None}
    assert not np.array_equal(authors_image, off_image) and not np.array_equal(authors_image, comfyui_image)


def test_at_the_training_size_the_shift_stays_the_pipelines(saved, tmp_path):
    torch.set_num_threads(1)
    shifted, shifted_image = generate(saved, tmp_path / "authors", "32")
    _, off_image = generate(saved, tmp_path / "off", "32", "--dype-shift", "off")
    assert shifted["installed"]["noise_shift"]["mu"] is None
    assert np.array_equal(shifted_image, off_image)


def test_a_bad_shift_in_the_config_is_one_line_and_exit_code_2(saved, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", *saved, *COMMON, "--set", "extrapolate.shift=paper"])
    assert exit_info.value.code == 2
    assert "extrapolate.shift='paper': expected one of ('authors', 'comfyui', 'off')" in capsys.readouterr().err


def test_the_comfyui_convention_is_an_extrapolate_option(saved, tmp_path):
    torch.set_num_threads(1)
    setting, _ = generate(saved, tmp_path / "c", "64", "--set", "extrapolate.options={convention: comfyui}")
    row = setting["installed"]["schedules"]["row"]
    assert row["convention"] == "comfyui" and row["lambda_s"] == 2.0
