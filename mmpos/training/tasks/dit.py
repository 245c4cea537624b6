"""The reference DiT (:class:`mmpos.models.DiT`) as a scaffold task: class-conditional diffusion on pixels or VAE
latents with any mmpos encoding (``scripts/train_dit.py`` is its command line).

Data: ``shapes`` (:class:`~mmpos.models.ProceduralShapes`), ``random`` (256 seeded images) or ``folder`` (an
ImageFolder, resized and centre-cropped). Every random draw of a sample -- its noise, timestep, label dropout, the
VAE latent's sample and the horizontal flip of folder images -- comes from that sample's generator
(:class:`~..scaffold.loop.SampleNoise`), so N processes train as one process at N times the batch.
Outputs (main process): ``model/`` and ``model_ema/`` (``DiT.from_pretrained``) and ``samples.png``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..scaffold.loop import SampleNoise, TrainingTask
from ..task_configs import DiTConfig

TINY = dict(depth=2, hidden_size=64, num_heads=2, patch_size=2)


class DiTTask(TrainingTask):
    outputs = ("model", "model_ema", "samples.png")

    def __init__(self, config: DiTConfig):
        super().__init__(config)
        if config.data == "folder" and config.data_dir is None:
            from ..scaffold.config import ConfigError

            raise ConfigError("data_dir: --data folder needs --data-dir")
        self.vae, self.label_dropout, self.noise_scheduler = None, 0.0, None

    def dataset(self):
        c = self.config
        from ...models import ProceduralShapes

        if c.data == "shapes":
            return ProceduralShapes(c.resolution, 3, c.num_classes, length=c.samples)
        if c.data == "random":
            g = torch.Generator().manual_seed(c.seed)
            images = torch.randn(256, 3, c.resolution, c.resolution, generator=g).clamp(-1, 1)
            labels = torch.randint(0, c.num_classes, (256,), generator=g)
            return torch.utils.data.TensorDataset(images, labels)
        from torchvision import datasets, transforms

        tf = transforms.Compose(
            [
                transforms.Resize(c.resolution),
                transforms.CenterCrop(c.resolution),
                transforms.ToTensor(),
                transforms.Normalize([0.5] * 3, [0.5] * 3),
            ]
        )
        return datasets.ImageFolder(c.data_dir, transform=tf)  # flipped per sample in loss()

    def build_model(self):
        from ...models import DIT_PRESETS, DiT

        c = self.config
        vae_config = self._vae_config()
        in_channels = vae_config["latent_channels"] if vae_config else 3
        factor = 2 ** (len(vae_config["block_out_channels"]) - 1) if vae_config else 1
        if c.resolution % factor:
            from ..scaffold.config import ConfigError

            raise ConfigError(f"resolution: {c.resolution} must be divisible by the VAE factor {factor}")
        arch = dict(DIT_PRESETS[c.model], **(TINY if c.tiny else {}))
        model = DiT(
            **arch,
            sample_size=c.resolution // factor,
            in_channels=in_channels,
            num_classes=c.num_classes,
            pe=c.pe,
            pe_options=c.pe_options,
        )
        # label dropout drawn per sample in loss(), not from the model's global generator
        self.label_dropout, model.label_embed.dropout_prob = model.label_embed.dropout_prob, 0.0
        if c.gradient_checkpointing:
            model.enable_gradient_checkpointing()
        return model

    def _vae_config(self) -> dict | None:
        if not self.config.vae:
            return None
        from diffusers import AutoencoderKL

        return dict(AutoencoderKL.load_config(self.config.vae))

    def setup(self, accelerator) -> None:
        from ...models import make_noise_scheduler

        self.noise_scheduler = make_noise_scheduler(self.config.objective)
        if self.config.vae:
            from diffusers import AutoencoderKL

            self.vae = AutoencoderKL.from_pretrained(self.config.vae).to(accelerator.device).eval()
            self.vae.requires_grad_(False)

    def build_optimizer(self, model):
        no_decay = model.no_weight_decay()
        named = list(model.named_parameters())
        groups = [
            dict(params=[p for n, p in named if n not in no_decay], weight_decay=self.config.weight_decay),
            dict(params=[p for n, p in named if n in no_decay], weight_decay=0.0),
        ]
        return torch.optim.AdamW(groups, lr=self.config.lr)

    def loss(self, model, batch, noise: SampleNoise) -> torch.Tensor:
        from ...models import diffusion_loss

        images, labels = (part.to(noise.device) for part in batch)
        if self.config.data == "folder":
            flip = (noise.rand() < 0.5).view(-1, 1, 1, 1)
            images = torch.where(flip, images.flip(-1), images)
        x0 = self._encode(images, noise) if self.vae is not None else images
        drop = noise.rand() < self.label_dropout
        labels = torch.where(drop, torch.full_like(labels, self.config.num_classes), labels)
        eps = noise.randn(x0.shape[1:])
        steps = self.noise_scheduler.config.num_train_timesteps
        t = noise.rand() if self.config.objective == "flow" else noise.randint(steps)
        return diffusion_loss(model, x0, labels, self.config.objective, self.noise_scheduler, noise=eps, t=t)

    @torch.no_grad()
    def _encode(self, images, noise: SampleNoise) -> torch.Tensor:
        latent = self.vae.encode(images.to(self.vae.device, self.vae.dtype)).latent_dist
        sample = latent.mean + latent.std * noise.randn(latent.mean.shape[1:]).to(latent.mean.dtype)
        return sample * self.vae.config.scaling_factor

    @torch.no_grad()
    def finish(self, accelerator, model, ema) -> None:
        from ..._atomic import folder_written_atomically, written_atomically

        out = Path(self.config.out)
        for name, weights in (("model", model), ("model_ema", ema.model if ema is not None else model)):
            with folder_written_atomically(out / name) as folder:
                weights.save_pretrained(folder)
        if self.config.sample_steps > 0:
            image = self._samples(ema.model if ema is not None else model)
            from torchvision.utils import save_image

            with written_atomically(out / "samples.png") as temporary:
                save_image(image, temporary, nrow=int(math.sqrt(len(image))) + 1)

    def _samples(self, model) -> torch.Tensor:
        from ...models import make_noise_scheduler, sample_dit

        c = self.config
        labels = torch.arange(min(c.num_classes, 16), device=model.device).repeat_interleave(2)
        sampler = make_noise_scheduler(c.objective, sampler="ddim" if c.objective != "flow" else None)
        generator = torch.Generator(model.device).manual_seed(c.seed)
        x = sample_dit(model, sampler, labels, c.sample_steps, c.guidance_scale, generator=generator, progress=True)
        if self.vae is not None:
            x = self.vae.decode(x.to(self.vae.dtype) / self.vae.config.scaling_factor).sample
        return (x.float().clamp(-1, 1) + 1) / 2
