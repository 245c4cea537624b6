"""The FLUX.2-architecture world t2i model: training inputs in Flux2Pipeline's layout, a training step, the exported
folder as a FLUX.2 pipeline, band modulation on it (edit off == stock bit for bit, the given reference)."""

import json

import numpy as np
import pytest
import torch
from diffusers import Flux2KleinPipeline, Flux2Pipeline

from mmpos.models.world.architectures import ARCHITECTURES, build_world_transformer
from mmpos.models.world.flux2 import flux2_conditioning, flux2_text_ids, flux2_tokens, flux2_vae
from mmpos.models.world.image import build_vae, load_world_pipeline, world_architecture
from mmpos.models.world.latents import encode_latents
from mmpos.pipelines import BandModulationFlux2KleinPipeline, BandModulationFlux2Pipeline
from mmpos.training.task_configs import WorldImageConfig
from mmpos.training.tasks.world_image import train
from mmpos.training.world.flux2_losses import flux2_flow_matching_inputs

TINY_VAE = dict(block_out_channels=(8, 16), norm_num_groups=4)
TINY_FLUX2 = dict(
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    axes_dims_rope=(4, 4, 4, 4),
    joint_attention_dim=32,
    timestep_guidance_channels=16,
)
TINY_TEXT = dict(width=32, num_layers=1, num_heads=2)
SIZE = 32
CAPTIONS = ["a large red star at center", "a small blue circle at left", "a green square at right"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny world VAE (shift / scale not 0 / 1) and a FLUX.2 t2i model trained two steps by the real script path."""
    root = tmp_path_factory.mktemp("world_flux2")
    torch.manual_seed(0)
    vae = build_vae(**TINY_VAE)
    vae.register_to_config(shift_factor=0.25, scaling_factor=0.5)
    vae.save_pretrained(root / "world-vae")
    card = train(
        WorldImageConfig(
            **dict(
                task="t2i",
                architecture="flux2",
                image_size=SIZE,
                num_examples=16,
                batch_size=4,
                device="cpu",
                num_samples=2,
                sample_steps=2,
                log_every=1,
                warmup_steps=1,
                max_steps=2,
                vae_path=str(root),
                transformer=TINY_FLUX2,
                text_encoder=TINY_TEXT,
            )
        ),
        root,
        progress=False,
    )
    return root, card


def _pipe(cls, root):
    pipe = load_world_pipeline("t2i", root, pipeline_class=cls)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _world_vae(root):
    from diffusers import AutoencoderKL

    return AutoencoderKL.from_pretrained(root / "world-vae").eval()


def _images(pipe, captions=CAPTIONS, guidance=None, **kwargs):
    return pipe(
        height=SIZE,
        width=SIZE,
        num_inference_steps=2,
        output_type="pt",
        generator=torch.Generator().manual_seed(0),
        **flux2_conditioning(pipe, captions, guidance),
        **kwargs,
    ).images


def test_the_architecture_key_selects_the_transformer():
    assert set(ARCHITECTURES) == {"flux", "flux2"}
    assert type(build_world_transformer("flux2", "t2i", **TINY_FLUX2)).__name__ == "Flux2Transformer2DModel"
    with pytest.raises(ValueError, match="architecture"):
        build_world_transformer("flux3", "t2i")
    with pytest.raises(ValueError, match="t2i task only"):
        build_world_transformer("flux2", "fill")


def test_training_step_runs_and_exports_a_flux2_folder(trained):
    root, card = trained
    assert card["steps"] == 2 and np.isfinite(card["val_loss"]) and np.isfinite(card["final_train_loss"])
    index = json.loads((root / "world-t2i" / "model_index.json").read_text())
    assert index["_class_name"] == "Flux2KleinPipeline" and index["transformer"][1] == "Flux2Transformer2DModel"
    assert index["vae"][1] == "AutoencoderKLFlux2" and world_architecture(root, "t2i") == "flux2"
    stock = Flux2Pipeline.from_pretrained(root / "world-t2i")  # a diffusers FLUX.2 folder
    assert type(stock.transformer).__name__ == "Flux2Transformer2DModel"
    assert isinstance(load_world_pipeline("t2i", root), Flux2KleinPipeline)
    with pytest.raises(TypeError, match="FLUX.2 world model"):
        from diffusers import FluxPipeline

        load_world_pipeline("t2i", root, pipeline_class=FluxPipeline)


def test_training_inputs_are_the_pipelines_layout(trained):
    """Training tokens of an image == what Flux2Pipeline encodes for it (patchify + bn normalisation), and the ids
    are the pipeline's."""
    root, _ = trained
    pipe = _pipe(Flux2Pipeline, root)
    image = torch.randint(0, 256, (1, SIZE, SIZE, 3), dtype=torch.uint8)
    world = encode_latents(_world_vae(root), image)  # the world's (z - shift) * scale: what training uses
    with torch.no_grad():
        encoded = pipe._encode_vae_image(image.permute(0, 3, 1, 2).float() / 127.5 - 1, generator=None)
    torch.testing.assert_close(flux2_tokens(world), pipe._pack_latents(encoded), rtol=1e-4, atol=1e-5)

    class Data:  # one example, noise and sigma
        task, latents = "t2i", world

    sigma, noise = torch.tensor([0.3]), torch.randn_like(world)
    hidden, ids, target = flux2_flow_matching_inputs(Data, torch.tensor([0]), sigma, noise)
    torch.testing.assert_close(hidden, flux2_tokens(0.7 * world + 0.3 * noise))
    torch.testing.assert_close(target, flux2_tokens(noise - world))
    latents, pipe_ids = pipe.prepare_latents(1, world.shape[1], SIZE, SIZE, torch.float32, "cpu", None)
    assert latents.shape == hidden.shape and torch.equal(ids, pipe_ids[0].to(ids.dtype))
    embeds = torch.zeros(2, 7, 32)
    assert torch.equal(flux2_text_ids(embeds), pipe.encode_prompt(None, "cpu", prompt_embeds=embeds)[1][0])


def test_vae_conversion_keeps_the_decoder():
    vae = build_vae(**TINY_VAE).eval()
    converted = flux2_vae(vae)
    z = torch.randn(1, 4, 8, 8)
    torch.testing.assert_close(converted.decode(z).sample, vae.decode(z).sample, rtol=0, atol=0)


@pytest.mark.parametrize(
    "stock, band, guidance",
    [(Flux2Pipeline, BandModulationFlux2Pipeline, None), (Flux2KleinPipeline, BandModulationFlux2KleinPipeline, 3.0)],
)
def test_band_off_is_the_stock_pipeline_bit_for_bit(trained, stock, band, guidance):
    root, _ = trained
    plain = _images(_pipe(stock, root), guidance=guidance)
    off = _images(
        _pipe(band, root),
        guidance=guidance,
        band={"enabled": False},
        reference_image=np.zeros((SIZE, SIZE, 3), np.uint8),
    )
    assert torch.equal(plain, off)
    on = _images(_pipe(band, root), guidance=guidance, band={})
    assert torch.isfinite(on).all() and not torch.equal(on[1:], plain[1:])


def test_given_reference_is_what_element_0_sees(trained):
    """With ``reference_image`` the transformer's element 0 is the image's tokens noised to the forward's sigma."""
    root, _ = trained
    pipe = _pipe(BandModulationFlux2KleinPipeline, root)
    image = np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    x0 = flux2_tokens(encode_latents(_world_vae(root), torch.from_numpy(image)[None]))
    sigmas, seen = [], []  # the forward's sigma; the tokens its input projection gets (after the edit's rewrite)
    hooks = [
        pipe.transformer.register_forward_pre_hook(
            lambda module, args, kwargs: sigmas.append(float(kwargs["timestep"][0])), with_kwargs=True
        ),
        pipe.transformer.x_embedder.register_forward_pre_hook(lambda module, args: seen.append(args[0][0])),
    ]
    try:
        _images(pipe, CAPTIONS[:2], band={}, reference_image=image, reference_seed=5)
    finally:
        for hook in hooks:
            hook.remove()
    noise = torch.randn(x0.shape, generator=torch.Generator("cpu").manual_seed(5))
    assert len(seen) == len(sigmas) == 2
    for hidden, sigma in zip(seen, sigmas):
        torch.testing.assert_close(hidden, ((1 - sigma) * x0 + sigma * noise)[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="reference_mode"):
        _images(pipe, CAPTIONS[:2], band={}, reference_image=image, reference_mode="invert")
