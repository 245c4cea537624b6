"""Camera-controlled video pipelines: a diffusers pipeline of a family that takes camera adapters
(:func:`~mmpos.integrations.diffusers.camera_adapter.camera_families`: Wan, HunyuanVideo 1.5, LTX-2, SkyReels-V2,
Cosmos) with a camera adapter (:class:`~mmpos.integrations.diffusers.camera_adapter.CameraAdapter`) on the
transformer's self-attention for the duration of a call: ``CameraControlWanPipeline`` /
``CameraControlWanImageToVideoPipeline``, and :func:`camera_control` for any other such pipeline class.

Calls are the stock ones (same positional order, outputs, ``return_dict``) plus keyword-only ``camera`` and
``camera_scale``. Without ``camera`` (or without an adapter) the call is the stock pipeline's. The camera path is
resampled to the latent frame count (``(num_frames - 1) // 4 + 1`` for Wan) and its intrinsics follow the output
size; the adapter's processors are removed after the call, also when it raises.

    pipe = CameraControlWanPipeline.from_pretrained("Wan-AI/Wan2.1-T2V-1.3B-Diffusers", torch_dtype=torch.bfloat16)
    load_camera_adapter(pipe, "path/to/adapter")                     # save_pretrained output
    video = pipe("a slow orbit around a house", num_frames=49, camera=preset_trajectory("orbit", 49)).frames[0]

    pipe = camera_control(SkyReelsV2Pipeline).from_pretrained(...)   # any camera family's pipeline, the same call
"""

from __future__ import annotations

import inspect
from typing import Optional

import torch
from diffusers import DiffusionPipeline, WanImageToVideoPipeline, WanPipeline

from mmpos._validation import check_finite_number
from mmpos.camera.video import video_cameras
from mmpos.integrations.diffusers.camera_adapter import (
    CameraAdapter,
    camera_conditioning,
    camera_families,
    check_adapter_fits,
    placed_like,
    without_camera,
)
from mmpos.integrations.diffusers.families import family_for_pipeline

from ..edits.pipeline import one_call

__all__ = [
    "CameraControlWanPipeline",
    "CameraControlWanImageToVideoPipeline",
    "camera_control",
    "load_camera_adapter",
]


def load_camera_adapter(pipe, path, **from_pretrained_kwargs) -> CameraAdapter:
    """Load a saved :class:`CameraAdapter` (folder or Hub id) onto ``pipe`` (its transformer's device and
    dtype) and return it; ``pipe.camera_adapter = None`` unloads."""
    adapter = CameraAdapter.from_pretrained(path, **from_pretrained_kwargs)
    check_adapter_fits(pipe.transformer, adapter)  # a mismatched adapter: a ValueError now, before placing it
    pipe.camera_adapter = placed_like(adapter, pipe.transformer).eval()
    return pipe.camera_adapter


class _CameraControl:
    """The camera part of every camera-controlled pipeline (a mixin in front of the diffusers class)."""

    @property
    def camera_adapter(self) -> Optional[CameraAdapter]:
        """The :class:`CameraAdapter` a call with ``camera`` uses (``None``: none loaded)."""
        return self.__dict__.get("_camera_adapter")

    @camera_adapter.setter
    def camera_adapter(self, adapter: Optional[CameraAdapter]) -> None:
        """Checked now, as :func:`load_camera_adapter` checks it: a mismatched adapter fails here, not deep inside
        the first call."""
        if adapter is not None:
            if not isinstance(adapter, CameraAdapter):
                raise TypeError(
                    "camera_adapter must be a CameraAdapter (load_camera_adapter(pipe, path) loads a saved one) "
                    f"or None, got {type(adapter).__name__}"
                )
            if getattr(self, "transformer", None) is not None:
                check_adapter_fits(self.transformer, adapter)
        self.__dict__["_camera_adapter"] = adapter

    def __call__(self, *args, camera=None, camera_scale: float = 1.0, **kwargs):
        r"""The stock call (see the diffusers pipeline's ``__call__``) with a camera.

        Args:
            camera (`mmpos.camera.Trajectory`, `CameraPath` or `(c2w, camera_model)`, *optional*):
                the camera path of the video, any length; resampled to the latent frames, intrinsics scaled to
                the output size. ``None``: the stock pipeline.
            camera_scale (`float`, defaults to 1.0): multiplies what the adapter adds (0: stock output).
        Returns: what the stock pipeline returns (``WanPipelineOutput``, or a tuple with ``return_dict=False``).
        """
        if camera is None:
            with without_camera(self.transformer):  # another thread's camera call does not reach this one
                return super(_CameraControl, one_call(self)).__call__(*args, **kwargs)
        if self.camera_adapter is None:
            raise ValueError(
                "camera was given but the pipeline has no camera adapter; call "
                "load_camera_adapter(pipe, path) or set pipe.camera_adapter first"
            )
        check_finite_number("camera_scale", camera_scale)
        adapter = placed_like(self.camera_adapter, self.transformer)  # follows pipe.to(...)
        cameras = self._video_cameras(camera, args, kwargs)
        with camera_conditioning(self.transformer, adapter, cameras, camera_scale):
            return super(_CameraControl, one_call(self)).__call__(*args, **kwargs)

    def stock_signature(self) -> inspect.Signature:
        """The signature of the stock pipeline's ``__call__`` (the class after this mixin)."""
        return inspect.signature(super(_CameraControl, self).__call__)

    def _video_cameras(self, camera, args, kwargs):
        """The call's cameras: the camera path itself, put on each forward's video token grid by the transformer's
        family (:class:`~mmpos.integrations.diffusers.camera_adapter.CameraPathConditioning`)."""
        return camera


class _WanCameraControl(_CameraControl):
    """Wan's pipelines: the cameras built before the call (bad cameras refused before any work)."""

    def _video_cameras(self, camera, args, kwargs):
        """Cameras on the grid the stock call will use (it rounds frames to ``4k + 1`` and sizes to 16 px)."""
        bound = self.stock_signature().bind(*args, **kwargs)
        bound.apply_defaults()
        height, width, num_frames = (bound.arguments[name] for name in ("height", "width", "num_frames"))
        _, patch_h, patch_w = self.transformer.config.patch_size
        spatial, temporal = self.vae_scale_factor_spatial, self.vae_scale_factor_temporal
        rows, cols = int(height) // (spatial * patch_h), int(width) // (spatial * patch_w)
        num_frames = int(num_frames)
        if temporal > 1 and num_frames % temporal != 1:  # the stock call rounds it to ``num_frames // 4 * 4 + 1``
            num_frames = num_frames // temporal * temporal + 1
        frames = (num_frames - 1) // temporal + 1
        geometry_dtype = torch.float64 if self.transformer.dtype == torch.float64 else torch.float32
        return video_cameras(
            camera,
            (frames, rows, cols),
            (rows * spatial * patch_h, cols * spatial * patch_w),
            dtype=geometry_dtype,
            device=self.transformer.device,
            offset=tuple(self.camera_adapter.config.ray_offset),
        )


class CameraControlWanPipeline(_WanCameraControl, WanPipeline):
    """Text-to-video Wan with camera control: ``pipe(prompt, ..., camera=trajectory, camera_scale=1.0)``."""


class CameraControlWanImageToVideoPipeline(_WanCameraControl, WanImageToVideoPipeline):
    """Image-to-video Wan with camera control: ``pipe(image, prompt, ..., camera=trajectory)``."""


_CONTROLLED: dict[type, type] = {
    WanPipeline: CameraControlWanPipeline,
    WanImageToVideoPipeline: CameraControlWanImageToVideoPipeline,
}


def camera_control(pipeline_class: type) -> type:
    """``pipeline_class`` (a diffusers pipeline whose transformer's family takes camera adapters) with camera control:
    the stock call plus keyword-only ``camera`` and ``camera_scale`` (as :class:`CameraControlWanPipeline`); the
    transformer's family puts the camera path on each forward's video token grid. One class per pipeline class."""
    if not (isinstance(pipeline_class, type) and issubclass(pipeline_class, DiffusionPipeline)):
        raise TypeError(f"pipeline_class must be a diffusers pipeline class, got {pipeline_class!r}")
    if issubclass(pipeline_class, _CameraControl):
        return pipeline_class
    controlled = _CONTROLLED.get(pipeline_class)
    if controlled is None:
        family = family_for_pipeline(pipeline_class.__name__)
        if family is None or family.camera is None:
            raise ValueError(
                f"{pipeline_class.__name__} is not a pipeline of a family that takes camera adapters "
                f"({', '.join(camera_families())})"
            )
        doc = f"{pipeline_class.__name__} with camera control: the stock call plus ``camera=`` and ``camera_scale=``."
        controlled = type(f"CameraControl{pipeline_class.__name__}", (_CameraControl, pipeline_class), {"__doc__": doc})
        _CONTROLLED[pipeline_class] = controlled
    return controlled
