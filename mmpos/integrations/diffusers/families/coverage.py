"""Which rotary transformers of the installed diffusers the families reach, and why the others are left out.

A class is a **rotary transformer** when it is defined in a module of ``diffusers.models.transformers``, subclasses
diffusers' ``ModelMixin``, and its module's source names a rotary embedding: ``rotary`` anywhere, or ``rope`` as a
word or a name part (``rope``, ``RoPE``, ``apply_rope``, ``rope_theta``; not inside another word, as in
"proper"). :func:`rotary_transformer_classes` lists them at run time, so a new diffusers release shows at once what
it added: every one is either covered by a registered family or named in :data:`EXCLUDED` with its reason (the
conformance suite checks both ways).

    from mmpos.integrations.diffusers.families.coverage import EXCLUDED, rotary_transformer_classes, uncovered
    uncovered()    # [] when every rotary class is registered or excluded
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

# class name -> why set_pe does not reach it; one entry per line, sorted
EXCLUDED: dict[str, str] = {
    "AceStepTransformer1DModel": "audio-only: 1D rope over the audio latent frames, built in forward by the module function _ace_step_rotary_freqs (no position module or method to replace); the families target image/video grids",
    "AnyFlowFARTransformer3DModel": "FAR's frame-autoregressive context: the rope module pools the frequency table over compressed-frame chunks (avg_pool_complex per compressed_patch_size) and mixes compressed, full-frame and clean-frame tables per far_cfg; a replaced spectrum needs its own pooled ladder (the anyflow family reaches the uncompressed AnyFlowTransformer3DModel)",
    "LongCatAudioDiTTransformer": "audio-only: rotary_embed is a 1D rope (base 1e5) over audio latent frames and over the condition tokens; the families target image/video grids",
    "MiniMaxMusic3Transformer1DModel": "audio-only: rotary_emb is a partial 1D rope (first rotary_dim channels) over the music latent sequence; the families target image/video grids",
    "OmniGenTransformer2DModel": "1D positions: rope is Phi-3's su-scaled (LongRoPE short/long factors) rotary over position_ids the pipeline gives for the interleaved text and image sequence; no per-axis image grid for a spectrum to act on",
    "SanaWMLTX2RefinerTransformer3DModel": "the pipeline calls the transformer's build_rotary_emb_for_absolute_positions (its LTX-2 rope at the absolute frame positions of the AR window) for the active block and for the KV cache's sink_pe, and the forward receives only the finished video_rotary_emb: its frame positions are not in the forward's inputs, so the rotary-input seam cannot rebuild it; reachable by replacing the rope module with tests that drive the pipeline's AR loop (not yet reached, issue 43)",
    "StableAudio3DiTModel": "audio-only: rotary_pos_emb is a partial 1D rope over audio latent frames; the families target image/video grids",
    "StableAudioDiTModel": "audio-only: the pipeline builds a 1D rope over audio latent frames and passes it to forward(rotary_embedding=...); the families target image/video grids",
}

_ROTARY = re.compile(r"rotary|(?<![a-z])rope|rope(?![a-z])", re.IGNORECASE)


def rotary_transformer_classes() -> dict[str, type]:
    """The rotary transformer classes of the installed diffusers (see the module docstring), by class name."""
    import diffusers.models.transformers as transformers
    from diffusers.models.modeling_utils import ModelMixin

    found = {}
    for info in pkgutil.iter_modules(transformers.__path__):
        module = importlib.import_module(f"{transformers.__name__}.{info.name}")
        if not _ROTARY.search(inspect.getsource(module)):
            continue
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, ModelMixin) and value.__module__ == module.__name__:
                found[name] = value
    return dict(sorted(found.items()))


def registered_class_names() -> dict[str, str]:
    """Class name -> family name, for every class a registered family covers in this install."""
    from . import supported_classes

    return {cls.__name__: family.name for cls, family in supported_classes().items()}


def uncovered() -> list[str]:
    """Rotary transformer classes neither registered nor excluded (a new diffusers release's additions)."""
    registered = registered_class_names()
    return [name for name in rotary_transformer_classes() if name not in registered and name not in EXCLUDED]


def exclusions_table() -> str:
    """The docs' table of :data:`EXCLUDED` (``python -m mmpos.integrations.diffusers.families``)."""
    rows = ["| diffusers class | why set_pe does not reach it |", "|---|---|"]
    rows += [f"| `{name}` | {reason} |" for name, reason in sorted(EXCLUDED.items())]
    return "\n".join(rows)
