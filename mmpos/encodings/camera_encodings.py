"""Camera encodings in the registry: ``plucker``, ``prope``, ``rayrope``, ``ucpe``."""
from .plucker import PluckerRays
from .projective_base import CameraTransforms, ProjectiveRoPE
from .prope import PRoPE
from .rayrope import RayDepthHead, RayRoPE, RaySide, sample_ray_depths
from .ucpe import UCPE, ParallelAdapter, UCPEAdapter

__all__ = ["PluckerRays", "CameraTransforms", "ProjectiveRoPE", "PRoPE", "RayDepthHead", "RayRoPE", "RaySide",
           "sample_ray_depths", "UCPE", "ParallelAdapter", "UCPEAdapter"]
