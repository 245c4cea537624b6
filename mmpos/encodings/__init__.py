"""Named encodings assembled from coordinates, spectrum and operator, and their registry."""
from .absolute import AbsolutePE, LearnedAPE, NoPE, SinCosAPE
from .camera_encodings import (CameraTransforms, ParallelAdapter, PluckerRays, PRoPE, ProjectiveRoPE, RayDepthHead,
                               RayRoPE, RaySide, UCPE, UCPEAdapter, sample_ray_depths)
from .comrope import ComRoPE, ComRoPEAP, ComRoPELD
from .harope import HARoPE
from .liere import LieRE
from .registry import create_pe, list_pes, pe_class, pe_options, register_pe
from .rope_axial import AxialRoPE, RoPE1D
from .rope_mixed import MixedRoPE, init_mixed_freqs
from .rope_multimodal import MHRoPE, MRoPE, MRoPEInterleave, VRoPE
from .rotary_base import RotaryPE

__all__ = [
    "AbsolutePE", "LearnedAPE", "NoPE", "SinCosAPE",
    "CameraTransforms", "ParallelAdapter", "PluckerRays", "PRoPE", "ProjectiveRoPE", "RayDepthHead", "RayRoPE",
    "RaySide", "UCPE", "UCPEAdapter", "sample_ray_depths",
    "ComRoPE", "ComRoPEAP", "ComRoPELD", "HARoPE", "LieRE",
    "create_pe", "list_pes", "pe_class", "pe_options", "register_pe",
    "AxialRoPE", "RoPE1D", "MixedRoPE", "init_mixed_freqs", "MHRoPE", "MRoPE", "MRoPEInterleave", "VRoPE",
    "RotaryPE",
]
