"""The mini-world's image-to-video pipeline: first frame (+ camera path) -> clip, on CPU in seconds.

Components: a small ``WanTransformer3DModel``, the world ``AutoencoderKL`` (2x spatial, one latent per frame)
and a ``FlowMatchEulerDiscreteScheduler``; conditioning as in :mod:`mmpos.models.world.video` (first latent given
clean at timestep 0, no prompt). With a camera adapter (``load_camera_adapter(pipe, folder)``) the call takes a
``camera`` path exactly as :class:`~mmpos.pipelines.CameraControlWanImageToVideoPipeline` does.

    pipe = WorldVideoPipeline.from_pretrained("assets/world-video")
    load_camera_adapter(pipe, "assets/world-video/camera-ucpe")
    clip = pipe(first_frame, num_frames=9, camera=trajectory, generator=torch.Generator().manual_seed(0)).frames[0]
"""

from __future__ import annotations

from typing import Optional

import torch
from diffusers import AutoencoderKL, DiffusionPipeline, FlowMatchEulerDiscreteScheduler, WanTransformer3DModel
from diffusers.pipelines.wan.pipeline_output import WanPipelineOutput
from diffusers.utils.torch_utils import randn_tensor
from diffusers.video_processor import VideoProcessor

from mmpos._validation import check_positive_int
from mmpos.models.world.video import empty_prompt, latent_normalisation, token_timesteps, with_first_frame

from .camera import _WanCameraControl

__all__ = ["WorldVideoPipeline"]


class _WorldImageToVideo(DiffusionPipeline):
    model_cpu_offload_seq = "transformer->vae"

    def __init__(
        self, transformer: WanTransformer3DModel, vae: AutoencoderKL, scheduler: FlowMatchEulerDiscreteScheduler
    ):
        super().__init__()
        self.register_modules(transformer=transformer, vae=vae, scheduler=scheduler)
        self.vae_scale_factor_spatial = 2 ** (len(vae.config.block_out_channels) - 1)
        self.vae_scale_factor_temporal = 1
        self.video_processor = VideoProcessor(vae_scale_factor=self.vae_scale_factor_spatial)

    @torch.no_grad()
    def __call__(
        self,
        image,
        num_frames: int = 9,
        height: int = 32,
        width: int = 32,
        num_inference_steps: int = 24,
        generator: Optional[torch.Generator] = None,
        latents: Optional[torch.Tensor] = None,
        output_type: str = "np",
        return_dict: bool = True,
    ):
        r"""Generate a clip that starts at ``image``.

        Args:
            image (`PIL.Image.Image`, `np.ndarray`, `torch.Tensor` or a list): first frame(s), resized to
                ``height x width``; a batch gives one clip each.
            num_frames (`int`, defaults to 9): frames of the clip, the first one included.
            height, width (`int`, defaults to 32): output size in pixels, multiples of 4.
            num_inference_steps (`int`, defaults to 24): Euler steps of the flow.
            generator (`torch.Generator`, *optional*): for reproducible noise.
            latents (`torch.Tensor`, *optional*): initial noise ``[B, C, F, H / 2, W / 2]``.
            output_type (`str`, defaults to ``"np"``): ``"np"``, ``"pil"``, ``"pt"`` or ``"latent"``.
        Returns: `WanPipelineOutput` with ``frames`` (``np``: ``[B, F, H, W, 3]`` in [0, 1]), or a tuple.
        """
        check_positive_int("num_frames", num_frames)
        check_positive_int("num_inference_steps", num_inference_steps)
        multiple = self.vae_scale_factor_spatial * self.transformer.config.patch_size[1]
        if height % multiple or width % multiple:
            raise ValueError(f"height and width must be multiples of {multiple}, got {height}x{width}")
        device, dtype = self._execution_device, self.transformer.dtype
        pixels = self.video_processor.preprocess(image, height=height, width=width).to(device, self.vae.dtype)
        shift, scale = latent_normalisation(self.vae)
        first = ((self.vae.encode(pixels).latent_dist.mode() - shift) * scale).to(dtype)[:, :, None]
        shape = (len(pixels), self.transformer.config.in_channels, num_frames, *first.shape[-2:])
        if latents is None:
            latents = randn_tensor(shape, generator=generator, device=device, dtype=dtype)
        elif tuple(latents.shape) != shape:
            raise ValueError(f"latents must have shape {shape}, got {tuple(latents.shape)}")
        prompt = empty_prompt(self.transformer, len(pixels))
        self.scheduler.set_timesteps(num_inference_steps, device=device)
        for t in self.progress_bar(self.scheduler.timesteps):
            noisy = with_first_frame(latents, first)
            timestep = token_timesteps(t.expand(len(pixels)), noisy.shape, self.transformer.config.patch_size)
            velocity = self.transformer(
                hidden_states=noisy, timestep=timestep, encoder_hidden_states=prompt, return_dict=False
            )[0]
            latents = self.scheduler.step(velocity, t, latents, return_dict=False)[0]
        latents = with_first_frame(latents, first)
        if output_type == "latent":
            video = latents
        else:
            flat = latents.transpose(1, 2).flatten(0, 1) / scale + shift
            decoded = self.vae.decode(flat.to(self.vae.dtype)).sample.float()
            video = decoded.unflatten(0, (len(pixels), num_frames)).transpose(1, 2)
            video = self.video_processor.postprocess_video(video, output_type=output_type)
        self.maybe_free_model_hooks()
        return WanPipelineOutput(frames=video) if return_dict else (video,)


class WorldVideoPipeline(_WanCameraControl, _WorldImageToVideo):
    """Image-to-video on the mini-world: ``pipe(image, num_frames=9, camera=trajectory)`` (``camera`` needs a
    loaded camera adapter; see :func:`~mmpos.pipelines.load_camera_adapter`)."""
