"""``convert(model, pe=NAME, **options)``: switch a timm ViT to an mmpos positional encoding, in place.

Supported models: ``VisionTransformer`` (ViT, DeiT, DeiT-III, CLIP/SigLIP towers), ``Eva`` (EVA-02,
rope-vit ports, Perception Encoder, DINOv3) and ``NaFlexVit``. What changes:

* rotary encodings (``kind == "rotary"``): every block's attention gets the encoding (see
  :mod:`.attention`), whose table is built once per forward right before the blocks (``norm_pre``);
  timm's own rope (Eva, NaFlexVit) is removed;
* absolute encodings (``ape_sincos``, ``ape_learned``): added to the patch tokens right before
  ``norm_pre`` (where timm adds its own), from the tokens' coordinates;
* ``nope``: positions are removed;
* timm's learned ``pos_embed`` is removed (``abs_pos="remove"``, default) or kept (``abs_pos="keep"``).
  ``ape_learned`` takes its values over, so the converted model computes the same function.

Every other weight is kept with its name, so APE-pretrained checkpoints load before or after conversion.
Coordinates follow ``dynamic_img_size``, NaFlex ``patch_coord`` and PatchDropout's kept tokens.
"""

from __future__ import annotations

import functools

import torch
from timm.layers import Format
from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, RotaryEmbeddingMixed, get_mixed_grid
from timm.models._features import FeatureGetterNet
from timm.models.eva import Eva
from timm.models.naflexvit import NaFlexVit
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from ..._validation import check_choice
from ...coords.grids import image_grid
from ...encodings.absolute import LearnedAPE
from ...encodings.base import PEKind
from ...encodings.per_block import check_fits, create_block_pes, no_weight_decay_names
from ...encodings.registry import pe_class
from ...encodings.rope_mixed import MixedRoPE
from .attention import check_convertible, make_positional
from .positions import (
    AddAbsoluteHook,
    BlockTablesHook,
    ConvGridHook,
    NaFlexEmbedsHook,
    PatchGridHook,
    PositionalPatchDropout,
    TokenPositions,
)
from .restore import OriginalState

SUPPORTED_MODELS = (VisionTransformer, Eva, NaFlexVit)
ABS_POS = ("remove", "keep")


def convert(
    model: nn.Module,
    pe: str = "rope_axial",
    *,
    abs_pos: str = "remove",
    share_pe: bool | None = None,
    dynamic_img_size: bool | None = None,
    grid_mode: str = "index",
    grid_scale: float = 1.0,
    grid_indexing: str | None = None,
    **options,
) -> nn.Module:
    """Switch ``model`` to the encoding ``pe`` in place and return it.

    The converted model runs eagerly, under ``torch.compile`` and traced by ``torch.fx`` (timm's
    ``create_feature_extractor``), and as timm's ``features_only`` wrapper; ``torch.jit.script`` refuses it by name
    (deprecated in PyTorch; the tables of a forward come from a Python object, :mod:`.positions`).

    Args:
        model: a timm ``VisionTransformer``, ``Eva`` or ``NaFlexVit`` (pretrained or not), or timm's
            ``features_only`` wrapper of one (``FeatureGetterNet``: its ``model`` is converted, the wrapper returned).
        pe: registered encoding name (``mmpos.list_pes()``).
        abs_pos: ``"remove"`` or ``"keep"`` timm's learned absolute ``pos_embed``.
        share_pe: rotary encodings only: one instance for all blocks (``True``), one per block (``False``);
            default: per block for encodings with parameters (RoPE-Mixed, ...), shared otherwise.
        dynamic_img_size: ``True`` lets the model take any image size (timm's ``dynamic_img_size``), ``None``
            leaves the setting as built.
        grid_mode, grid_scale, grid_indexing: patch coordinates, see :class:`~.positions.TokenPositions`;
            ``grid_indexing`` (``"ij"``: (row, col), ``"xy"``: (col, row)) defaults to the timm rope's setting
            for rotary encodings, else ``"ij"``.
        **options: the encoding's options (``theta``, ``layout``, ``extrapolation``, ``seed``, ...). The model
            supplies ``head_dim``, ``num_heads``, ``num_prefix_tokens``, ``num_axes=2`` (and ``embed_dim``,
            ``grid_size`` for absolute encodings).
    Returns:
        ``model``, with ``model.mmpos_positions`` and an extended ``no_weight_decay()``. :func:`~.restore.restore`
        undoes the conversion.
    """
    if isinstance(model, FeatureGetterNet):  # timm's features_only: forward_intermediates of the model inside
        convert(
            model.model,
            pe,
            abs_pos=abs_pos,
            share_pe=share_pe,
            dynamic_img_size=dynamic_img_size,
            grid_mode=grid_mode,
            grid_scale=grid_scale,
            grid_indexing=grid_indexing,
            **options,
        )
        return model
    _check_model(model)
    check_choice("abs_pos", abs_pos, ABS_POS)
    kind = pe_class(pe).kind
    if kind == PEKind.CAMERA:
        raise TypeError(
            f"{pe!r} is a camera encoding (its inputs are cameras, not a patch grid); convert installs "
            "grid encodings: rotary, absolute or 'nope'. Use it through its own prepare/attention "
            "(docs/cameras.md) or a camera adapter"
        )
    if pe == "rope_axial":
        options = {**_timm_axial_rope_options(model, grid_mode, grid_scale), **options}
    if grid_indexing is None:  # rotary encodings follow a timm rope's axis order; tables are (rows, cols)
        timm_order = getattr(getattr(model, "rope", None), "grid_indexing", "ij")
        grid_indexing = timm_order if kind == PEKind.ROTARY else "ij"
    if pe == "ape_learned" and grid_indexing != "ij":
        raise ValueError("ape_learned looks up a (rows, cols) table: use grid_indexing='ij'")
    if pe == "ape_learned" and (grid_mode != "index" or grid_scale != 1.0):
        raise ValueError(
            f"ape_learned indexes its table by patch index: grid_mode='index' and grid_scale=1 "
            f"(got grid_mode={grid_mode!r}, grid_scale={grid_scale})"
        )
    positions = TokenPositions(model.num_prefix_tokens, grid_mode, grid_scale, grid_indexing)
    grid = _patch_grid(model)
    original = OriginalState(model)  # for restore(model)
    if kind == PEKind.ROTARY:
        _install_rotary(model, pe, positions, share_pe, options)
        _take_over_mixed_freqs(model, positions)
    elif kind == PEKind.ABSOLUTE:
        _install_absolute(model, pe, positions, grid, abs_pos, options)
    elif options:
        raise TypeError(f"encoding {pe!r} takes no options, got {sorted(options)}")
    if dynamic_img_size:
        _enable_dynamic_img_size(model)
    _remove_timm_rope(model)
    if abs_pos == "remove":
        _remove_learned_pos_embed(model)
    _install_position_hooks(model, positions)
    model.mmpos_positions = positions
    model.mmpos_pe = pe
    model.mmpos_original = original
    model.no_weight_decay = functools.partial(_no_weight_decay, model)  # a partial pickles (torch.save(model))
    model.__prepare_scriptable__ = functools.partial(_refuse_scripting, pe)  # torch.jit.script calls it first
    return model


def _refuse_scripting(pe: str):
    raise TypeError(
        f"torch.jit.script cannot compile a timm model converted to {pe!r} by mmpos: each forward's positions and "
        "tables live in a Python object (model.mmpos_positions) that TorchScript cannot hold, and TorchScript is "
        "deprecated in PyTorch. Use torch.compile, torch.export, or torch.fx (timm's create_feature_extractor)"
    )


def _check_model(model):
    if not isinstance(model, SUPPORTED_MODELS):
        names = ", ".join(c.__name__ for c in SUPPORTED_MODELS)
        raise TypeError(
            f"cannot convert a {type(model).__module__}.{type(model).__name__}; "
            f"mmpos.integrations.timm.convert supports timm {names}"
        )
    if hasattr(model, "mmpos_positions"):
        raise ValueError(f"this model is already converted to {model.mmpos_pe!r}; convert a fresh model")


def _patch_grid(model) -> tuple[int, int] | None:
    embed = model.embeds if isinstance(model, NaFlexVit) else model.patch_embed
    grid = getattr(embed, "grid_size", None) or getattr(embed, "pos_embed_grid_size", None)
    return None if grid is None else tuple(int(g) for g in grid)


def _install_rotary(model, pe, positions, share_pe, options):
    blocks = list(model.blocks)
    first = blocks[0].attn
    facts = dict(
        head_dim=first.head_dim,
        num_heads=first.num_heads,
        num_prefix_tokens=model.num_prefix_tokens,
        num_axes=2,
        seq_dim=-2,
        layout="half" if getattr(first, "rotate_half", False) else "interleaved",
    )
    where = f"{type(model).__name__} attention (head_dim={first.head_dim}, num_heads={first.num_heads})"
    pes = create_block_pes(pe, len(blocks), facts, options, share=share_pe, where=where)
    for index, (block, block_pe) in enumerate(zip(blocks, pes)):  # check everything before changing anything
        check_fits(block_pe, block.attn.head_dim, 2, f"block {index}'s attention")
        if getattr(block_pe, "num_prefix_tokens", model.num_prefix_tokens) != model.num_prefix_tokens:
            raise ValueError(
                f"encoding num_prefix_tokens={block_pe.num_prefix_tokens} but the model has "
                f"{model.num_prefix_tokens} prefix token(s) (cls + registers)"
            )
        check_convertible(block.attn, f"blocks[{index}].attn")
    for index, (block, block_pe) in enumerate(zip(blocks, pes)):
        make_positional(block.attn, block_pe, positions, f"blocks[{index}].attn")
    model.norm_pre.register_forward_pre_hook(BlockTablesHook(positions, pes))  # tables once per forward


def _timm_axial_rope_options(model, grid_mode, grid_scale) -> dict:
    """``rope_axial`` options that reproduce a timm axial rope (``RotaryEmbeddingCat`` on index coordinates:
    EVA-style 'cat' without ``ref_feat_shape``, the rope-vit axial ports): its temperature as ``theta``."""
    rope = getattr(model, "rope", None)
    if type(rope) is not RotaryEmbeddingCat or grid_mode != "index" or grid_scale != 1:
        return {}
    if rope.in_pixels or rope.ref_feat_shape is not None or rope.grid_offset or getattr(rope, "aug_active", False):
        return {}
    return dict(theta=float(rope.temperature))


def _take_over_mixed_freqs(model, positions):
    """Copy timm's RoPE-Mixed ``rope.freqs`` ``[2, depth, heads, head_dim / 2]`` (rope-vit ports, NaFlexVit
    ``rope_type='mixed'``) into per-block mmpos ``rope_mixed`` encodings, so the model keeps its function."""
    rope = getattr(model, "rope", None)
    if not isinstance(rope, RotaryEmbeddingMixed) or positions.grid_mode != "index" or positions.grid_scale != 1:
        return
    pes = [block.attn.pe for block in model.blocks]
    if not all(isinstance(pe, MixedRoPE) for pe in pes) or len({id(pe) for pe in pes}) != len(pes):
        return
    t_x, t_y = get_mixed_grid([2, 3], grid_indexing=rope.grid_indexing)
    rows, cols = image_grid(2, 3).unbind(-1)
    if positions.grid_indexing == "xy":
        rows, cols = cols, rows
    if torch.equal(t_x, rows) and torch.equal(t_y, cols):
        order = (0, 1)
    elif torch.equal(t_x, cols) and torch.equal(t_y, rows):
        order = (1, 0)
    else:
        return
    with torch.no_grad():
        for depth, pe in enumerate(pes):
            timm_freqs = rope.freqs[:, depth]  # [2 (x, y), heads, P]
            if timm_freqs.shape[1:] != (pe.freqs.shape[0], pe.freqs.shape[2]):
                return
            pe.freqs.copy_(torch.stack([timm_freqs[order[0]], timm_freqs[order[1]]], dim=1))


def _install_absolute(model, pe, positions, grid, abs_pos, options):
    facts = dict(embed_dim=model.embed_dim, num_axes=2, num_prefix_tokens=model.num_prefix_tokens, grid_size=grid)
    where = f"{type(model).__name__} tokens (embed_dim={model.embed_dim}, grid={grid})"
    (ape,) = create_block_pes(pe, 1, facts, options, share=True, where=where)
    if isinstance(ape, LearnedAPE) and abs_pos == "remove":
        _take_over_learned_pos_embed(model, ape)
    model.mmpos_ape = ape
    model.norm_pre.register_forward_pre_hook(AddAbsoluteHook(ape, positions))


def _take_over_learned_pos_embed(model, ape):
    """Move timm's learned ``pos_embed`` into ``ape`` (and its prefix rows into cls/register tokens)."""
    pos_embed = getattr(model, "pos_embed", None)
    if pos_embed is None or isinstance(model, NaFlexVit):
        return
    with torch.no_grad():
        n_prefix = 0 if getattr(model, "no_embed_class", False) else model.num_prefix_tokens
        patch_rows = pos_embed[0, n_prefix:]
        if patch_rows.shape[0] != ape.weight[..., 0].numel():
            return
        ape.weight.copy_(patch_rows.reshape(ape.weight.shape))
        prefix = [t for t in (getattr(model, "cls_token", None), getattr(model, "reg_token", None)) if t is not None]
        offset = 0
        for token in prefix:
            if n_prefix:
                token.add_(pos_embed[:, offset : offset + token.shape[1]])
            offset += token.shape[1]


def _remove_timm_rope(model):
    if getattr(model, "rope", None) is not None:
        model.rope = None
    for flag in ("rope_mixed", "rope_is_mixed"):
        if hasattr(model, flag):
            setattr(model, flag, False)


def _remove_learned_pos_embed(model):
    if isinstance(model, NaFlexVit):
        embeds = model.embeds
        embeds.pos_embed = embeds.pos_embed_y = embeds.pos_embed_x = None
        embeds.pos_embed_type = "none"
    else:
        model.pos_embed = None


def _enable_dynamic_img_size(model):
    if isinstance(model, NaFlexVit):
        return  # NaFlexVit takes any size already
    model.dynamic_img_size = True
    embed = model.patch_embed
    embed.strict_img_size = False
    embed.flatten = False
    embed.output_fmt = Format.NHWC


def _install_position_hooks(model, positions):
    """Steps 1 and 2 of a forward (:mod:`.positions`): the patch embedding starts it, PatchDropout reports the
    kept tokens."""
    if isinstance(model, NaFlexVit):
        model.embeds.register_forward_hook(NaFlexEmbedsHook(positions), with_kwargs=True)
    elif isinstance(getattr(model.patch_embed, "proj", None), nn.Conv2d):
        model.patch_embed.proj.register_forward_hook(ConvGridHook(positions))
    else:
        model.patch_embed.register_forward_hook(PatchGridHook(positions))
    if isinstance(getattr(model, "patch_drop", None), nn.Module) and not isinstance(model.patch_drop, nn.Identity):
        model.patch_drop = PositionalPatchDropout(model.patch_drop, positions)


def _no_weight_decay(self) -> set[str]:
    """timm's names plus the mmpos encodings' (e.g. ``blocks.0.attn.pe.freqs``)."""
    return type(self).no_weight_decay(self) | no_weight_decay_names(self)
