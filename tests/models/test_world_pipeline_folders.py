"""The shipped world models are diffusers pipeline folders: from_pretrained, prompt strings, the world tokenizer."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers import DiffusionPipeline, FluxFillPipeline, FluxKontextPipeline, FluxPipeline

from mmpos.models.world.image import conditioning, load_world_pipeline
from mmpos.models.world.text import WorldTextEncoder
from mmpos.world.tokenizer import WorldTokenizer, world_tokenizer

ASSETS = Path(__file__).resolve().parents[2] / "assets"
CAPTION = "a large red star at center on a plain white background"
CLASSES = {"t2i": FluxPipeline, "fill": FluxFillPipeline, "kontext": FluxKontextPipeline}


def quiet(pipe):
    pipe.set_progress_bar_config(disable=True)
    return pipe


def call_inputs(task: str) -> dict:
    """What each task needs beside the prompt, at the models' 32 px."""
    from PIL import Image

    image = Image.new("RGB", (32, 32), (200, 200, 200))
    if task == "fill":
        mask = np.zeros((32, 32), dtype=np.uint8)
        mask[8:24, 8:24] = 255
        return dict(image=image, mask_image=Image.fromarray(mask))
    if task == "kontext":
        return dict(image=image, max_area=32 * 32, _auto_resize=False)
    return {}


@pytest.mark.parametrize("task", tuple(CLASSES))
def test_each_shipped_model_loads_with_from_pretrained_and_takes_a_prompt_string(task):
    pipe = quiet(DiffusionPipeline.from_pretrained(ASSETS / f"world-{task}"))
    assert type(pipe) is CLASSES[task]
    assert isinstance(pipe.text_encoder, WorldTextEncoder) and isinstance(pipe.tokenizer_2, WorldTokenizer)
    assert pipe.transformer.dtype == torch.float32  # shipped in fp16, loaded in fp32 by default
    images = pipe(
        prompt=CAPTION,
        height=32,
        width=32,
        num_inference_steps=2,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
        **call_inputs(task),
    ).images
    assert images.shape == (1, 32, 32, 3) and np.isfinite(images).all()


def test_prompt_strings_give_the_images_of_the_embeddings_the_world_code_passes():
    pipe = quiet(FluxPipeline.from_pretrained(ASSETS / "world-t2i"))
    run = lambda **kw: (
        pipe(
            height=32,
            width=32,
            num_inference_steps=2,
            output_type="pt",  # noqa: E731
            generator=torch.Generator().manual_seed(0),
            **kw,
        ).images
    )
    from_strings = run(prompt=[CAPTION], negative_prompt=[""], true_cfg_scale=3.0)
    assert torch.equal(from_strings, run(**conditioning(pipe, [CAPTION], 3.0)))


def test_the_tokenizer_gives_the_encoders_ids_and_refuses_unknown_words(tmp_path):
    encoder = WorldTextEncoder.from_pretrained(ASSETS / "world-t2i" / "text_encoder")
    captions = [CAPTION, "", "A  Red circle"]
    tokenizer = world_tokenizer(encoder.config.vocabulary, encoder.config.max_length)
    tokenizer.save_pretrained(tmp_path)
    loaded = WorldTokenizer.from_pretrained(tmp_path)
    for max_length in (40, 512):  # Flux pads CLIP's slot to model_max_length, T5's to max_sequence_length
        ids = loaded(
            captions, padding="max_length", max_length=max_length, truncation=True, return_tensors="pt"
        ).input_ids
        assert torch.equal(ids[:, :40], encoder.tokenize(captions)) and not ids[:, 40:].any()
        assert torch.equal(encoder(ids)[0], encoder(encoder.tokenize(captions))[0])
    with pytest.raises(ValueError, match=r"outside the world's vocabulary: \['zebra'\]"):
        loaded(["a red zebra"])
    with pytest.raises(ValueError, match="more than 39 words"):
        encoder(loaded(["a " * 45], padding="max_length", max_length=64, return_tensors="pt").input_ids)


def test_an_older_export_still_loads_and_upgrades_to_a_pipeline_folder(tmp_path):
    from mmpos.training.world.export import upgrade_model_folder

    shutil.copytree(ASSETS / "world-vae", tmp_path / "world-vae")
    for part in ("transformer", "text_encoder"):  # what exports wrote before model_index.json
        shutil.copytree(ASSETS / "world-t2i" / part, tmp_path / "world-t2i" / part)
    old = quiet(load_world_pipeline("t2i", tmp_path))
    upgrade_model_folder(tmp_path, "t2i")
    new = quiet(FluxPipeline.from_pretrained(tmp_path / "world-t2i"))
    for name in ("transformer", "vae", "text_encoder", "text_encoder_2"):
        old_state, new_state = getattr(old, name).state_dict(), getattr(new, name).state_dict()
        assert all(torch.equal(old_state[k], new_state[k]) for k in old_state), name
