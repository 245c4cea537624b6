"""A camera adapter (ucpe | prope | plucker) on a frozen Wan transformer, flow matching, as a scaffold task
(``scripts/train_camera_adapter.py`` is its command line).

Only the adapter trains (the transformer, VAE and text encoder are frozen and held, not registered, so neither
checkpointed nor synced). Data: clip folders (:mod:`.camera_clips`: RealEstate10K pose files or
``mmpos world clip`` output), one clip per sample; the focal zoom, the lens model, the noise and the flow time of
a sample come from its own generator (:class:`~.scaffold.SampleNoise`). Each checkpoint also holds ``adapter/``
(``CameraAdapter.from_pretrained``).
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ...camera.lens_augment import LensAugmentation
from ...camera.video import stack_cameras, video_cameras
from ...integrations.diffusers.camera_adapter import CameraAdapter, camera_conditioning
from .. import camera_clips
from ..scaffold.config import ConfigError
from ..scaffold.loop import SampleNoise, TrainingTask
from ..task_configs import CameraAdapterConfig


class AdapterTraining(nn.Module):
    """The trainable module accelerate wraps: the adapter; the frozen transformer is held, not registered. The
    adapter reaches the transformer through its installed processors (:func:`camera_conditioning`, kept
    installed through the backward pass, which gradient checkpointing recomputes)."""

    def __init__(self, adapter: CameraAdapter, transformer):
        super().__init__()
        self.adapter = adapter
        self.__dict__["transformer"] = transformer  # not a submodule: not in the state dict, not DDP-synced

    def forward(self, noisy, timestep, text):
        return self.transformer(hidden_states=noisy, timestep=timestep, encoder_hidden_states=text, return_dict=False)[
            0
        ]


def load_parts(model: str, dtype):
    """The frozen parts as diffusers' stock ``WanPipeline`` (training needs its components and ``encode_prompt``,
    not the camera call of ``mmpos.pipelines.CameraControlWanPipeline``): ``"tiny"`` builds
    :func:`~mmpos.models.tiny_wan.tiny_wan_components` offline, anything else is a diffusers folder or hub id."""
    from diffusers import WanPipeline

    if model == "tiny":
        from ...models.tiny_wan import tiny_wan_components

        return WanPipeline(**tiny_wan_components())
    return WanPipeline.from_pretrained(model, torch_dtype=dtype)


class ClipIndex(torch.utils.data.Dataset):
    """Sample ``i`` is clip ``i`` (loaded in :meth:`CameraAdapterTask.loss`, where its generator draws the zoom)."""

    def __init__(self, clips):
        self.clips = clips

    def __len__(self):
        return len(self.clips)

    def __getitem__(self, index):
        return int(index)


class CameraAdapterTask(TrainingTask):
    def __init__(self, config: CameraAdapterConfig):
        if config.data is None:
            raise ConfigError("data: required (a folder of clip folders, --data)")
        if config.bf16:
            config.mixed_precision = "bf16"
        super().__init__(config)
        self.pipe, self.clips, self._scope = None, None, None

    def dataset(self):
        self.clips = camera_clips.find_clips(self.config.data)
        return ClipIndex(self.clips)

    def collate(self, items):
        return list(items)

    def build_model(self):
        c = self.config
        self.pipe = load_parts(c.model, torch.bfloat16 if c.bf16 else torch.float32)
        for part in (self.pipe.transformer, self.pipe.vae, self.pipe.text_encoder):
            part.requires_grad_(False)
        if c.gradient_checkpointing:
            self.pipe.transformer.enable_gradient_checkpointing()
        options = {} if c.head_dim is None else dict(head_dim=c.head_dim)
        adapter = CameraAdapter.for_transformer(self.pipe.transformer, c.kind, **options)
        if adapter.dtype != torch.float32:
            adapter = adapter.to(dtype=torch.float32)  # fp32 master weights; bf16 only inside autocast
        return AdapterTraining(adapter, self.pipe.transformer)

    def setup(self, accelerator) -> None:
        self.pipe.to(accelerator.device)
        if self.config.bf16:
            for part in (self.pipe.transformer, self.pipe.text_encoder):
                part.to(dtype=torch.bfloat16)

    def step_scope(self):
        self._scope = ExitStack()
        return self._scope

    def loss(self, model, batch, noise: SampleNoise) -> torch.Tensor:
        adapter = getattr(model, "module", model).adapter
        latents, text, cameras = self._batch(batch, adapter, noise)
        eps = noise.randn(latents.shape[1:])
        sigma = noise.rand()
        noisy = (1 - sigma.view(-1, 1, 1, 1, 1)) * latents + sigma.view(-1, 1, 1, 1, 1) * eps
        self._scope.enter_context(camera_conditioning(self.pipe.transformer, adapter, cameras))
        prediction = model(noisy.to(self.pipe.transformer.dtype), sigma * 1000, text)
        return F.mse_loss(prediction.float(), (eps - latents).float())

    def _samples(self, batch, noise: SampleNoise) -> list:
        c = self.config
        size = (c.height, c.width)
        if c.lens_models:
            augmentation = LensAugmentation(tuple(c.lens_models), c.max_zoom)
            return [
                camera_clips.load_sample(self.clips[i], c.frames, size, lens=augmentation.sample(g))
                for i, g in zip(batch, noise.generators)
            ]
        zooms = [1 + (c.max_zoom - 1) * float(torch.rand((), generator=g)) for g in noise.generators]
        return [camera_clips.load_sample(self.clips[i], c.frames, size, z) for i, z in zip(batch, zooms)]

    def _batch(self, batch, adapter, noise: SampleNoise):
        """Clips -> normalised latents, captions -> text embeddings, paths -> cameras on the latent grid."""
        c, pipe, device = self.config, self.pipe, noise.device
        samples = self._samples(batch, noise)
        video = torch.stack([s[0] for s in samples]).to(device, pipe.vae.dtype)
        with torch.no_grad():
            latents = pipe.vae.encode(video).latent_dist.mode()
            mean = torch.tensor(pipe.vae.config.latents_mean, device=device).view(1, -1, 1, 1, 1)
            std = torch.tensor(pipe.vae.config.latents_std, device=device).view(1, -1, 1, 1, 1)
            latents = (latents.float() - mean) / std
            text, _ = pipe.encode_prompt(
                [s[2] for s in samples],
                do_classifier_free_guidance=False,
                max_sequence_length=c.max_sequence_length,
                device=device,
            )
        _, _, frames, rows, cols = latents.shape
        patch = pipe.transformer.config.patch_size
        grid = (frames, rows // patch[1], cols // patch[2])
        offset = tuple(adapter.config.ray_offset)
        cameras = stack_cameras(
            [video_cameras(s[1], grid, (c.height, c.width), device=device, offset=offset) for s in samples]
        )
        return latents, text, cameras

    def checkpoint_extras(self, folder: Path, model, ema) -> None:
        model.adapter.save_pretrained(folder / "adapter")
