"""Named encodings assembled from coordinates, spectrum and operator, and their registry.

Every registered encoding has a :class:`PEKind`, :class:`Capabilities` and ``example_options``
(see ``docs/adding_an_encoding.md``). Camera encodings (``plucker``, ``prope``, ``rayrope``, ``ucpe``) share one
contract, ``geometry = pe.prepare(cameras)`` of a :class:`mmpos.camera.Cameras` then ``pe.attention(q, k, v,
geometry)`` (:class:`CameraPE`, ``docs/cameras.md``).
"""

from .absolute import AbsolutePE, LearnedAPE, SinCosAPE
from .base import CameraPE, Capabilities, PEKind, PositionalEncoding, parameters_key
from .comrope import ComRoPE, ComRoPEAP, ComRoPELD
from .harope import HARoPE
from .liere import LieRE
from .nope import NoPE
from .plucker import PluckerRays
from .projective_base import CameraTransforms, ProjectiveRoPE
from .prope import PRoPE
from .rayrope import RayDepthHead, RayRoPE, RaySide, sample_ray_depths
from .registry import create_pe, list_pes, pe_capabilities, pe_class, pe_description, pe_options, register_pe
from .rope_axial import AxialRoPE, RoPE1D
from .rope_mixed import MixedRoPE, init_mixed_freqs
from .rope_multimodal import LadderRoPE, MHRoPE, MRoPE, MRoPEInterleave, VRoPE
from .rotary_base import RotaryPE
from .spectrum_rope import SpectrumRoPE
from .ucpe import UCPE, ParallelAdapter, UCPEAdapter

__all__ = [
    "AbsolutePE",
    "LearnedAPE",
    "NoPE",
    "SinCosAPE",
    "Capabilities",
    "CameraPE",
    "PositionalEncoding",
    "PEKind",
    "parameters_key",
    "CameraTransforms",
    "ParallelAdapter",
    "PluckerRays",
    "PRoPE",
    "ProjectiveRoPE",
    "RayDepthHead",
    "RayRoPE",
    "RaySide",
    "UCPE",
    "UCPEAdapter",
    "sample_ray_depths",
    "ComRoPE",
    "ComRoPEAP",
    "ComRoPELD",
    "HARoPE",
    "LieRE",
    "create_pe",
    "list_pes",
    "pe_capabilities",
    "pe_class",
    "pe_description",
    "pe_options",
    "register_pe",
    "AxialRoPE",
    "RoPE1D",
    "MixedRoPE",
    "init_mixed_freqs",
    "LadderRoPE",
    "MHRoPE",
    "MRoPE",
    "MRoPEInterleave",
    "VRoPE",
    "RotaryPE",
    "SpectrumRoPE",
]
