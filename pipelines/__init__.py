"""Training-free editing pipelines on diffusers, installed as ``mmpos.pipelines``.

Band modulation (Untwisting RoPE) on Flux and Kontext, PE transplant (PosBridge) on Fill, LooseRoPE on Kontext;
all share an explicit edit context set by a transformer pre-forward hook (:mod:`.context`).
"""
from .band import BandConfig
from .band_pipeline import BandModulationFluxPipeline, BandModulationKontextPipeline
from .context import EditContext, EditSession, TokenSegments
from .loose import LooseConfig
from .loose_pipeline import LooseRoPEKontextPipeline
from .transplant import TransplantConfig
from .transplant_pipeline import PosBridgeFillPipeline

__all__ = ["BandConfig", "BandModulationFluxPipeline", "BandModulationKontextPipeline", "EditContext", "EditSession",
           "TokenSegments", "LooseConfig", "LooseRoPEKontextPipeline", "TransplantConfig", "PosBridgeFillPipeline"]
