"""Camera control on the pipeline of another camera family than Wan (SkyReels-V2, tiny random components saved as a
pipeline folder, no downloads): ``camera_control(SkyReelsV2Pipeline)`` and ``mmpos generate video --model FOLDER``."""

import numpy as np
import pytest
import torch

from mmpos.camera import preset_trajectory
from mmpos.cli import main
from mmpos.integrations.diffusers.camera_adapter import CameraAdapter
from mmpos.integrations.diffusers.families.tiny import SKYREELS_V2_CONFIG
from mmpos.models.tiny_wan import TEXT_DIM, tiny_umt5, tiny_wan_vae
from tests.fixtures.tiny_models import camera_video_frames as frames
from tests.fixtures.tiny_models import trained_looking


def skyreels_components():
    from diffusers import FlowMatchEulerDiscreteScheduler, SkyReelsV2Transformer3DModel

    torch.manual_seed(0)
    transformer = SkyReelsV2Transformer3DModel(**{**SKYREELS_V2_CONFIG, "text_dim": TEXT_DIM, "num_layers": 2}).eval()
    text_encoder, tokenizer = tiny_umt5()
    return dict(
        transformer=transformer,
        vae=tiny_wan_vae(),
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from diffusers import SkyReelsV2Pipeline

    root = tmp_path_factory.mktemp("tiny_skyreels")
    SkyReelsV2Pipeline(**skyreels_components()).save_pretrained(root / "skyreels")
    return root / "skyreels"


@pytest.mark.parametrize("kind", ["ucpe", "plucker"])
def test_a_camera_controlled_skyreels_pipeline_is_stock_at_zero_init(kind):
    from diffusers import SkyReelsV2Pipeline

    from mmpos.pipelines import camera_control

    torch.set_num_threads(1)
    components = skyreels_components()
    stock, pipe = SkyReelsV2Pipeline(**components), camera_control(SkyReelsV2Pipeline)(**components)
    for p in (stock, pipe):
        p.set_progress_bar_config(disable=True)
    expected = frames(stock)
    pipe.camera_adapter = CameraAdapter.for_transformer(pipe.transformer, kind, head_dim=16)
    assert torch.equal(frames(pipe, camera=preset_trajectory("orbit", 9, degrees=90)), expected)
    pipe.camera_adapter = trained_looking(pipe.camera_adapter, 1)
    changed = frames(pipe, camera=preset_trajectory("orbit", 9, degrees=90))
    assert (changed - expected).abs().max() > 1e-4
    assert torch.equal(frames(pipe), expected)  # no camera: the stock call


def test_camera_control_refuses_a_pipeline_of_a_family_without_cameras():
    from diffusers import FluxPipeline

    from mmpos.pipelines import camera_control

    with pytest.raises(ValueError, match="FluxPipeline is not a pipeline of a family that takes camera adapters"):
        camera_control(FluxPipeline)


def test_generate_video_on_a_skyreels_folder_with_an_adapter(folder, tmp_path, capsys):
    from diffusers import SkyReelsV2Transformer3DModel

    transformer = SkyReelsV2Transformer3DModel.from_pretrained(folder / "transformer")
    trained_looking(CameraAdapter.for_transformer(transformer, "ucpe", head_dim=16), 1).save_pretrained(
        tmp_path / "adapter"
    )
    common = ["generate", "video", "--model", str(folder), "--frames", "9", "--height", "32", "--width", "48"]
    common += ["--steps", "2", "--device", "cpu", "--dtype", "float32", "--camera", "preset:orbit"]
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    assert main([*common, "--adapter", str(tmp_path / "adapter"), "--out", str(tmp_path / "camera")]) == 0
    printed = capsys.readouterr().out
    assert f"model: {folder}" in printed and "camera adapter: ucpe" in printed
    from PIL import Image

    plain = np.asarray(Image.open(tmp_path / "plain" / "frames.png"), dtype=np.float64)
    steered = np.asarray(Image.open(tmp_path / "camera" / "frames.png"), dtype=np.float64)
    assert plain.shape == steered.shape and np.abs(plain - steered).max() > 1  # the adapter steered the video
    assert (tmp_path / "camera" / "video.mp4").stat().st_size > 0


def test_generate_video_refuses_a_folder_of_a_family_without_cameras(tmp_path, capsys):
    (tmp_path / "flux").mkdir()
    (tmp_path / "flux" / "model_index.json").write_text('{"_class_name": "FluxPipeline"}')
    with pytest.raises(SystemExit) as error:
        main(["generate", "video", "--model", str(tmp_path / "flux"), "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert error.value.code == 2 and "a FluxPipeline pipeline" in err and "skyreels_v2" in err


@pytest.fixture(scope="module")
def hunyuan15_folder(tmp_path_factory):
    """A tiny HunyuanVideo 1.5 pipeline saved without text encoders, and its prompt tensors."""
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        ClassifierFreeGuidance,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Pipeline,
        HunyuanVideo15Transformer3DModel,
    )
    from safetensors.torch import save_file

    from mmpos.integrations.diffusers.families.tiny import HUNYUAN_VIDEO15_CONFIG

    root = tmp_path_factory.mktemp("tiny_hunyuan15")
    torch.manual_seed(0)
    transformer = HunyuanVideo15Transformer3DModel(**{**HUNYUAN_VIDEO15_CONFIG, "in_channels": 9}).eval()  # 4 + 4 + 1
    vae = AutoencoderKLHunyuanVideo15(latent_channels=4, block_out_channels=(8,) * 5, layers_per_block=1).eval()
    HunyuanVideo15Pipeline(
        text_encoder=None,
        tokenizer=None,
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder_2=None,
        tokenizer_2=None,
        guider=ClassifierFreeGuidance(guidance_scale=1.0),
    ).save_pretrained(root / "hunyuan15")
    g = torch.Generator().manual_seed(1)
    embeds = dict(
        prompt_embeds=torch.randn(1, 5, 16, generator=g),
        prompt_embeds_mask=torch.ones(1, 5, dtype=torch.long),
        prompt_embeds_2=torch.randn(1, 3, 16, generator=g),
        prompt_embeds_mask_2=torch.ones(1, 3, dtype=torch.long),
    )
    save_file(embeds, str(root / "embeds.safetensors"))
    return root / "hunyuan15", root / "embeds.safetensors"


def test_generate_video_on_a_hunyuan_video15_folder_with_prompt_embeds(hunyuan15_folder, tmp_path, capsys):
    from diffusers import HunyuanVideo15Transformer3DModel

    folder, embeds = hunyuan15_folder
    transformer = HunyuanVideo15Transformer3DModel.from_pretrained(folder / "transformer")
    trained_looking(CameraAdapter.for_transformer(transformer, "plucker"), 1).save_pretrained(tmp_path / "adapter")
    common = ["generate", "video", "--model", str(folder), "--prompt-embeds", str(embeds), "--frames", "9"]
    common += ["--height", "32", "--width", "48", "--steps", "2", "--device", "cpu", "--dtype", "float32"]
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    assert main([*common, "--adapter", str(tmp_path / "adapter"), "--out", str(tmp_path / "camera")]) == 0
    assert "camera adapter: plucker" in capsys.readouterr().out
    from PIL import Image

    plain = np.asarray(Image.open(tmp_path / "plain" / "frames.png"), dtype=np.float64)
    steered = np.asarray(Image.open(tmp_path / "camera" / "frames.png"), dtype=np.float64)
    assert plain.shape == steered.shape and np.abs(plain - steered).max() > 1

    from safetensors.torch import save_file

    save_file({"pooled_prompt_embeds": torch.zeros(1, 4)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(SystemExit) as error:
        main([*common[:4], "--prompt-embeds", str(tmp_path / "bad.safetensors"), "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert error.value.code == 2 and "holds ['pooled_prompt_embeds']; this pipeline takes" in err


@pytest.fixture(scope="module")
def ltx2_folder(tmp_path_factory):
    """A tiny LTX-2 pipeline (video and audio; the component configs of diffusers' own LTX-2 pipeline test, caption
    channels 32) saved without a text encoder, and its prompt tensors (two Gemma layers' states, flattened)."""
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors, LTX2Vocoder
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("tiny_ltx2")
    torch.manual_seed(0)
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=4,
        audio_cross_attention_dim=8,
        num_layers=2,
        qk_norm="rms_norm_across_heads",
        caption_channels=32,
        rope_double_precision=False,
        rope_type="split",
    ).eval()
    connector = dict(num_attention_heads=4, attention_head_dim=8, num_layers=1, num_learnable_registers=None)
    connectors = LTX2TextConnectors(
        caption_channels=32,
        text_proj_in_factor=2,
        **{f"{stream}_connector_{k}": v for stream in ("video", "audio") for k, v in connector.items()},
        connector_rope_base_seq_len=32,
        rope_double_precision=False,
        causal_temporal_positioning=False,
        rope_type="split",
    ).eval()
    vae = AutoencoderKLLTX2Video(
        latent_channels=4,
        block_out_channels=(8,),
        decoder_block_out_channels=(8,),
        layers_per_block=(1,),
        decoder_layers_per_block=(1, 1),
        spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,),
        decoder_inject_noise=(False, False),
        downsample_type=("spatial",),
        upsample_residual=(False,),
        upsample_factor=(1,),
        timestep_conditioning=False,
        patch_size=1,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    ).eval()
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4,
        output_channels=2,
        ch_mult=(1,),
        num_res_blocks=1,
        attn_resolutions=None,
        in_channels=2,
        resolution=32,
        latent_channels=2,
        norm_type="pixel",
        causality_axis="height",
        mid_block_add_attention=False,
        sample_rate=16000,
        mel_hop_length=160,
        is_causal=True,
        mel_bins=8,
    ).eval()
    vocoder = LTX2Vocoder(
        in_channels=16,
        hidden_channels=32,
        out_channels=2,
        upsample_kernel_sizes=[4, 4],
        upsample_factors=[2, 2],
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3, 5]],
        output_sampling_rate=16000,
    ).eval()
    LTX2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        audio_vae=audio_vae,
        text_encoder=None,
        tokenizer=None,
        connectors=connectors,
        transformer=transformer,
        vocoder=vocoder,
    ).save_pretrained(root / "ltx2")
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(1, 6, dtype=torch.long)
    embeds = dict(prompt_embeds=torch.randn(1, 6, 64, generator=g), prompt_attention_mask=mask)
    embeds.update(
        negative_prompt_embeds=torch.randn(1, 6, 64, generator=g), negative_prompt_attention_mask=mask.clone()
    )
    save_file(embeds, str(root / "embeds.safetensors"))
    return root / "ltx2", root / "embeds.safetensors"


def test_generate_video_on_an_ltx2_folder_with_prompt_embeds(ltx2_folder, tmp_path, capsys):
    from diffusers import LTX2VideoTransformer3DModel

    folder, embeds = ltx2_folder
    transformer = LTX2VideoTransformer3DModel.from_pretrained(folder / "transformer")
    trained_looking(CameraAdapter.for_transformer(transformer, "ucpe", head_dim=16), 1).save_pretrained(
        tmp_path / "adapter"
    )
    common = ["generate", "video", "--model", str(folder), "--prompt-embeds", str(embeds), "--frames", "9"]
    common += ["--height", "32", "--width", "32", "--steps", "2", "--device", "cpu", "--dtype", "float32"]
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    assert main([*common, "--adapter", str(tmp_path / "adapter"), "--out", str(tmp_path / "camera")]) == 0
    assert "camera adapter: ucpe" in capsys.readouterr().out
    from PIL import Image

    plain = np.asarray(Image.open(tmp_path / "plain" / "frames.png"), dtype=np.float64)
    steered = np.asarray(Image.open(tmp_path / "camera" / "frames.png"), dtype=np.float64)
    assert plain.shape == steered.shape and np.abs(plain - steered).max() > 1
