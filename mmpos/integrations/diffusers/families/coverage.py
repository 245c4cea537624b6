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

NOT_YET = "not yet reached (issue 43)"

# class name -> why set_pe does not reach it; one entry per line, sorted
EXCLUDED: dict[str, str] = {
    "AceStepTransformer1DModel": NOT_YET,
    "AllegroTransformer3DModel": NOT_YET,
    "AnyFlowFARTransformer3DModel": NOT_YET,
    "CogVideoXTransformer3DModel": NOT_YET,
    "ConsisIDTransformer3DModel": NOT_YET,
    "Cosmos3OmniTransformer": NOT_YET,
    "EasyAnimateTransformer3DModel": NOT_YET,
    "HunyuanDiT2DModel": NOT_YET,
    "LongCatAudioDiTTransformer": NOT_YET,
    "LuminaNextDiT2DModel": NOT_YET,
    "MiniMaxMusic3Transformer1DModel": NOT_YET,
    "MochiTransformer3DModel": NOT_YET,
    "OmniGenTransformer2DModel": NOT_YET,
    "SanaWMLTX2RefinerTransformer3DModel": NOT_YET,
    "StableAudio3DiTModel": NOT_YET,
    "StableAudioDiTModel": NOT_YET,
    "WanAnimate2Transformer3DModel": "no position module: the method _rope_freqs builds complex tables over 512 fixed positions per reference offset (cached in rope_freqs_cache), applied by rope_apply inside the KV-cache processors; a seam must replace the method (not yet reached, issue 43)",
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
