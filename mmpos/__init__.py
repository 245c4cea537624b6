"""mmpos: positional encodings for vision and multimodal transformers and diffusion models.

    import mmpos
    pe = mmpos.create_pe("rope_axial", head_dim=128, axes_dims=(16, 56, 56), theta=10000, layout="interleaved")
    q, k = pe(q, k, ids)        # q, k: [B, H, L, D]; ids: [L, 3] float
"""
from .encodings import (Capabilities, PEKind, RotaryPE, create_pe, list_pes, pe_capabilities, pe_class,
                        register_pe)

__version__ = "0.1.0"
__all__ = ["create_pe", "list_pes", "pe_capabilities", "pe_class", "register_pe", "Capabilities", "PEKind",
           "RotaryPE", "__version__"]
