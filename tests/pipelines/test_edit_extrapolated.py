"""Edits at twice the training size: band modulation (Flux) and LooseRoPE (Kontext) over a ``set_pe`` with DyPE or
NTK schedules on the tiny Flux (trained grid 2 x 2 tokens = 32 px; run at 64 px = 4 x 4 tokens). Edit off (band:
``enabled=False``; LooseRoPE: ``strength=0``) is the ``set_pe`` model bit for bit; the schedule acts (DyPE
rebuilds its tables once per sigma); edits on change the output, through the extrapolated spectrum."""

import pytest
import torch
from diffusers import FluxKontextPipeline, FluxPipeline

from mmpos.integrations.diffusers import model_extrapolation, position_module, set_pe
from mmpos.pipelines import BandModulationFluxPipeline, LooseRoPEKontextPipeline
from tests.fixtures.tiny_models import components, embeddings, image

TRAINED_GRID = (2, 2)  # tokens: 32 px at 16 px per token
SIZE = 64  # 2x


pytestmark = pytest.mark.usefixtures("one_thread")


def _band_run(pipe, **extra):
    return pipe(
        height=SIZE,
        width=SIZE,
        num_inference_steps=3,
        output_type="latent",
        generator=torch.Generator().manual_seed(0),
        **embeddings(2),
        **extra,
    ).images


@pytest.mark.parametrize("preset", ["dype", "ntk"])
def test_band_at_twice_the_training_size_over_a_schedule(preset):
    parts = components("flux")
    stock, band = FluxPipeline(**parts), BandModulationFluxPipeline(**parts)  # one transformer
    plain, plain_edited = _band_run(stock), _band_run(band)
    set_pe(
        parts["transformer"], "native", extrapolation=model_extrapolation(parts["transformer"], preset, TRAINED_GRID)
    )
    reference = _band_run(stock)
    assert not torch.equal(reference, plain)  # the schedule acts at 2x
    builds = position_module(parts["transformer"]).table_builds
    assert torch.equal(_band_run(band, band={"enabled": False}), reference)  # edit off: the set_pe model
    if preset == "dype":  # one table per distinct sigma (3 steps), not one per call or per layer
        assert position_module(parts["transformer"]).table_builds - builds <= 3
    edited = _band_run(band)
    assert torch.equal(edited[0], reference[0])  # the reference image follows the set_pe model's trajectory
    assert not torch.allclose(edited[1:], reference[1:])  # the target is style-aligned to it
    assert not torch.allclose(edited[1:], plain_edited[1:])  # ... through the extrapolated spectrum


def test_loose_at_twice_the_training_size_over_dype():
    parts = components("kontext")
    stock, loose = FluxKontextPipeline(**parts), LooseRoPEKontextPipeline(**parts)
    collage, mask = image(SIZE, SIZE), torch.zeros(SIZE, SIZE, dtype=torch.bool)
    mask[16:48, 0:32] = True
    schedule = dict(cutoffs=(1, 2), step_range=(0, 2), saliency="spectral_residual")

    def run(pipe, **extra):
        return pipe(
            image=collage,
            height=SIZE,
            width=SIZE,
            max_area=SIZE * SIZE,
            num_inference_steps=4,
            _auto_resize=False,
            output_type="latent",
            generator=torch.Generator().manual_seed(0),
            **embeddings(1),
            **extra,
        ).images

    plain = run(stock)
    set_pe(
        parts["transformer"], "native", extrapolation=model_extrapolation(parts["transformer"], "dype", TRAINED_GRID)
    )
    reference = run(stock)
    assert not torch.equal(reference, plain)
    assert torch.equal(run(loose, crop_mask=mask, loose={**schedule, "strength": 0.0}), reference)
    assert not torch.allclose(run(loose, crop_mask=mask, loose=schedule), reference)


def test_edit_cli_runs_band_above_the_training_size_with_dype(tmp_path, capsys):
    import yaml
    from PIL import Image
    from safetensors.torch import save_file

    from mmpos.cli import main

    FluxPipeline(**components("flux")).save_pretrained(tmp_path / "flux")
    save_file(embeddings(3), str(tmp_path / "embeds.safetensors"))  # the reference and two targets
    common = [
        "edit",
        "band",
        "--model",
        str(tmp_path / "flux"),
        "--prompt-embeds",
        str(tmp_path / "embeds.safetensors"),
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--set",
        "sampler.num_inference_steps=2",
        "--set",
        f"sampler.height={SIZE}",
        "--set",
        f"sampler.width={SIZE}",
        "--set",
        "figure.sweep=[]",
        "--no-figures",
    ]
    assert main([*common, "--extrapolate", "dype", "--train-size", "32", "--out", str(tmp_path / "dype")]) == 0
    assert '"row": "dype"' in capsys.readouterr().out
    installed = yaml.safe_load((tmp_path / "dype/config.yaml").read_text())["extrapolate"]["installed"]
    assert installed["trained_grid"] == [2.0, 2.0] and installed["schedules"]["col"]["dynamic"]
    assert Image.open(tmp_path / "dype/edited_1.png").size == (SIZE, SIZE)
    with pytest.raises(SystemExit) as exit_info:  # attention rules are for mmpos generate: one line, before loading
        main([*common, "--extrapolate", "dype+ultraimage", "--out", str(tmp_path / "rule")])
    assert exit_info.value.code == 2 and "attention rules are for mmpos generate" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main([*common, "--extrapolate", "dyp", "--out", str(tmp_path / "bad")])
    assert exit_info.value.code == 2 and "mmpos edit: error: --extrapolate 'dyp'" in capsys.readouterr().err
