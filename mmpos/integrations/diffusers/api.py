"""``set_pe`` / ``restore`` / ``position_module`` for diffusers transformers of the registered families: thin
wrappers over :func:`~.hooks.apply_pe` and the ``"mmpos_pe"`` hook of the model's ``HookRegistry`` (:mod:`.hooks`;
what is installed: :mod:`.pe_install`). PE-parameter training is in :mod:`.pe_training`, backend names in
:mod:`.backends`, model checks in :mod:`.checks`.
"""

from __future__ import annotations

from torch import nn

from .families import family_for
from .hooks import PEConfig, apply_pe, installed_hook, remove_pe
from .pe_install import NATIVE


def set_pe(
    transformer: nn.Module,
    pe: str = NATIVE,
    *,
    per_layer: bool = False,
    coord_axes=None,
    attention_backend: str | None = None,
    **options,
) -> nn.Module:
    """Give a diffusers transformer of any registered family (:func:`~.families.list_families`) an mmpos
    positional encoding.

    Tier-1 families (the seam is replaced, the stock processors stay) take ``pe="native"`` with the spectrum
    options; tier-2 families (FLUX.1, FLUX.2, Chroma, Wan, Qwen-Image, Z-Image: mmpos processors) take any rotary encoding.

    Args:
        transformer: the model, changed in place (and returned).
        pe: ``"native"`` (the model's own RoPE rebuilt by mmpos, stock arithmetic: bit-identical to the stock
            model; accepts the spectrum options ``theta``, ``extrapolation``, ``pair_scale``), any registered
            rotary encoding (``"rope_axial"``, ``"rope_mixed"``, ...) or ``"nope"`` (tier 2).
        per_layer: one encoding instance per attention layer (encodings with per-layer parameters).
        coord_axes: indices of the model's coordinate axes the encoding reads (Flux ``(index, row, col)``,
            Wan ``(t, row, col)``); default all. E.g. ``(1, 2)`` runs a 2D encoding on Flux's image grid.
        attention_backend: a diffusers dispatch backend name (``"native"`` = SDPA, ``"xformers"``,
            ``"flash"``, ``"_native_cudnn"``, ...), ``"auto"`` (xformers on CUDA when importable, else SDPA), or
            ``None`` (keep the model's).
        **options: options of the encoding; the model fills ``head_dim``, ``num_heads``, ``num_axes``,
            ``axes_dims`` and ``theta`` (its native spectrum), ``layout="interleaved"`` and ``seq_dim=-3``
            where the encoding has them and they are not given. Examples: ``allocation="interleaved"``
            (MRoPE-I-style on Wan), ``extrapolation=[{"type": "riflex", "k": 4, "target_length": 32}, None,
            None]`` (Wan, longer videos), ``extrapolation={"type": "ntk", "factor": 2}`` (Flux at 2x size),
            ``extrapolation=model_extrapolation(transformer, "dype", (64, 64))`` (DyPE above FLUX.1's 1024 px:
            the spectrum follows the output size and the denoising step, see ``docs/extrapolation.md``).

    Tables are built by the model's position module once per forward and cached across steps; see
    :func:`position_module` for the counters.
    """
    apply_pe(transformer, PEConfig(pe, per_layer, coord_axes, attention_backend, options))
    return transformer


def restore(transformer: nn.Module) -> nn.Module:
    """Undo :func:`set_pe` (remove its hook from the model's ``HookRegistry``): the stock position module and
    processors come back (the mmpos ones, and any PE parameters, are dropped), and every parameter gets back the
    ``requires_grad`` it had before :func:`train_only_pe`. The model then computes what the stock model computes,
    bit for bit."""
    remove_pe(transformer)
    return transformer


def position_module(transformer: nn.Module):
    """The installed seam (``FluxPositions`` / ``WanPositions``): ``table_builds``, ``forwards``, ``encodings``,
    ``coords_transform``."""
    if installed_hook(transformer) is None:
        raise ValueError(f"{type(transformer).__name__} has no mmpos encoding installed (call set_pe first)")
    return getattr(transformer, family_for(transformer).position_attr)
