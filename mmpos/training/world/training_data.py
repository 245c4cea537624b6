"""The examples one world model trains on, on the training device, and per-step caption dropout."""

from __future__ import annotations

import torch

from ...models.world.image import vae_scale_factor
from ...models.world.latents import encode_latents
from ...world.data import build_arrays


class TrainingData:
    """The task's examples on the training device, with per-step batch assembly."""

    def __init__(self, config, device, vae=None, text_encoder=None):
        task = config.task
        data_task = {"vae": "scenes", "t2i": "scenes", "fill": "fill", "kontext": "kontext"}[task]
        arrays = build_arrays(data_task, config.num_examples, config.data_seed, config.image_size, config.workers)
        self.task, self.device, self.num = task, device, len(arrays["image"])
        self.images = torch.from_numpy(arrays["image"]).to(device)
        if task == "vae":
            return
        self.tokens = text_encoder.tokenize(arrays["caption"]).to(device)
        content = arrays.get("content_caption")
        self.content_tokens = text_encoder.tokenize(content).to(device) if content else self.tokens
        self.empty_tokens = text_encoder.tokenize([""]).to(device)
        self.latents = encode_latents(vae, self.images)
        self.scale_factor = vae_scale_factor(vae)
        if task == "fill":
            self.masks = torch.from_numpy(arrays["mask"]).to(device)
            self.masked_latents = encode_latents(vae, self.images, self.masks)
        if task == "kontext":
            self.context_latents = encode_latents(vae, torch.from_numpy(arrays["context"]).to(device))

    def tokens_for(self, index: torch.Tensor, generator, caption_dropout: float, style_dropout: float):
        tokens = self.tokens[index]
        u = torch.rand(len(index), 1, device=self.device, generator=generator)
        tokens = torch.where(u < style_dropout, self.content_tokens[index], tokens)
        return torch.where(u > 1 - caption_dropout, self.empty_tokens, tokens)
