"""mmpos encodings inside diffusers' Flux, Wan and Qwen-Image transformers.

    from mmpos.integrations.diffusers import set_pe, restore, train_only_pe
    set_pe(pipe.transformer, "native", extrapolation={"type": "ntk", "factor": 2})  # stock RoPE + NTK
    set_pe(pipe.transformer, "native",                                              # DyPE above 1024 px
           extrapolation=model_extrapolation(pipe.transformer, "dype", trained_grid=(64, 64)))
    set_pe(pipe.transformer, "rope_mixed", coord_axes=(1, 2))                       # learned 2D RoPE-Mixed
    params = train_only_pe(pipe.transformer)                                        # fine-tune only the PE
    restore(pipe.transformer)                                                       # back to stock

The same as diffusers hooks (:mod:`.hooks`): ``apply_pe(transformer, PEConfig(...))``, ``apply_dype(transformer,
DyPEConfig(trained_grid=(64, 64)))``; removed by ``restore`` or the model's ``HookRegistry``.

Camera adapters on Wan (``ucpe``, ``prope``, ``plucker``): :class:`CameraAdapter`, :func:`camera_conditioning`,
:func:`video_cameras` (from :mod:`mmpos.camera.video`; see ``docs/video.md``).
"""

from ...camera.video import CameraPath, VideoCameras, video_cameras  # re-exported (home: mmpos.camera.video)
from .api import position_module, restore, set_pe
from .attention_rules import clear_attention_rule, set_attention_rule
from .backends import resolve_attention_backend
from .camera_adapter import CameraAdapter, camera_conditioning
from .context_parallel import shard_like_context_parallel
from .extrapolation import model_extrapolation
from .families import supported_classes
from .families.flux import FluxPEAttnProcessor
from .families.wan import WanPEAttnProcessor
from .hooks import PE_HOOK, DyPEConfig, PEConfig, PEHook, apply_dype, apply_dype_to_pipeline, apply_pe
from .installer import CAMERA, EDIT, ENCODING, AttentionSlot, ProcessorInstaller
from .layer_rotation import LayerRotation
from .noise_shift import NoiseShift, apply_noise_shift
from .pe_training import cast_keeping_pe_fp32, pe_parameters, train_only_pe
from .processors import EncodingRotation
from .ucpe_checkpoint import load_ucpe_checkpoint

__all__ = [
    "set_pe",
    "restore",
    "apply_pe",
    "apply_dype",
    "apply_dype_to_pipeline",
    "NoiseShift",
    "apply_noise_shift",
    "PEConfig",
    "DyPEConfig",
    "PEHook",
    "PE_HOOK",
    "model_extrapolation",
    "set_attention_rule",
    "clear_attention_rule",
    "cast_keeping_pe_fp32",
    "position_module",
    "pe_parameters",
    "train_only_pe",
    "resolve_attention_backend",
    "shard_like_context_parallel",
    "supported_classes",
    "EncodingRotation",
    "FluxPEAttnProcessor",
    "WanPEAttnProcessor",
    "ProcessorInstaller",
    "AttentionSlot",
    "ENCODING",
    "EDIT",
    "LayerRotation",
    "CAMERA",
    "CameraAdapter",
    "camera_conditioning",
    "CameraPath",
    "VideoCameras",
    "video_cameras",
    "load_ucpe_checkpoint",
]
