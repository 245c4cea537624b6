"""``set_pe`` / ``restore`` / ``position_module`` for diffusers' Flux and Wan transformers: the model's encodings.

Processors go through the one installer (:mod:`.installer`, the ``"encoding"`` level of each layer's slot);
PE-parameter training is in :mod:`.pe_training`, backend names in :mod:`.backends`, model checks in :mod:`.checks`.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from ...encodings.base import PEKind
from ...encodings.per_block import check_model_coordinates, create_block_pes
from ...encodings.registry import pe_class, pe_options
from ...encodings.rotary_base import RotaryPE
from ...ops.tables import RotaryTable
from ..pe_parameters import restore_requires_grad
from .backends import resolve_attention_backend
from .checks import check_coord_axes, check_no_sharded_seam, check_stock_processors, pe_pre_forward_hook
from .installer import ENCODING, ProcessorInstaller
from .models import ModelSpec, spec_for
from .positions import FluxPositions, WanPositions
from .qwen import QwenPositions
from .processors import (EncodingRotation, FluxPEAttnProcessor, WanPEAttnProcessor, flux_stock_rotation,
                         wan_stock_rotation)

NATIVE = "native"
# rope_axial options that keep the stock operator meaningful for pe="native" (spectrum changes only)
NATIVE_OPTIONS = ("theta", "extrapolation", "pair_scale", "table_precision")


@dataclass
class _Installed:
    """What ``set_pe`` replaced besides the processors (those are in the installer), for ``restore``."""

    pe: str
    position_module: nn.Module


def set_pe(transformer: nn.Module, pe: str = NATIVE, *, per_layer: bool = False, coord_axes=None,
           attention_backend: str | None = None, **options) -> nn.Module:
    """Give a diffusers ``FluxTransformer2DModel``, ``WanTransformer3DModel`` or ``QwenImageTransformer2DModel``
    an mmpos positional encoding (Qwen-Image: ``"native"`` or encodings with one shared table, see :mod:`.qwen`).

    Args:
        transformer: the model, changed in place (and returned).
        pe: ``"native"`` (the model's own RoPE rebuilt by mmpos, stock arithmetic: bit-identical to the stock
            model; accepts the spectrum options ``theta``, ``extrapolation``, ``pair_scale``), any registered
            rotary encoding (``"rope_axial"``, ``"rope_mixed"``, ...) or ``"nope"``.
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
    spec = spec_for(transformer)
    check_no_sharded_seam(transformer, spec)
    if getattr(transformer, "_mmpos_installed", None) is not None:
        restore(transformer)
    num_axes = len(spec.axis_names)
    coord_axes = check_coord_axes(coord_axes, spec)
    backend = None if attention_backend is None else resolve_attention_backend(attention_backend)
    heads, head_dim = spec.num_heads(transformer), spec.head_dim(transformer)
    beneath = _processors_beneath_encoding(transformer, spec)
    check_stock_processors(beneath, spec)
    encodings = _build_encodings(transformer, spec, pe, options, coord_axes, per_layer, len(beneath))
    group_sizes = [_check_fits(e, spec, head_dim, heads, coord_axes or tuple(range(num_axes))) for e in encodings]

    native = pe == NATIVE
    stock_position = getattr(transformer, spec.position_attr)
    seam = _make_seam(spec, transformer, stock_position, encodings, native, coord_axes)
    processors = {} if spec.family == "qwen" else _processors(spec, beneath, encodings, native, per_layer,
                                                               group_sizes)
    ProcessorInstaller.of(transformer).fill(ENCODING, processors, hook=pe_pre_forward_hook(spec))
    setattr(transformer, spec.position_attr, seam)
    transformer._mmpos_installed = _Installed(pe=pe, position_module=stock_position)
    if backend is not None:
        transformer.set_attention_backend(backend)
    return transformer


def _processors(spec, beneath, encodings, native, per_layer, group_sizes) -> dict:
    """Flux and Wan: an mmpos processor per layer (Qwen-Image's stock processors read mmpos tables as they are)."""
    if native:
        rotation = flux_stock_rotation if spec.family == "flux" else wan_stock_rotation
    else:
        rotation = EncodingRotation(encodings, per_layer, group_sizes)
    processor_cls = FluxPEAttnProcessor if spec.family == "flux" else WanPEAttnProcessor
    return {layer: processor_cls(rotation, layer, getattr(stock, "_attention_backend", None),
                                 getattr(stock, "_parallel_config", None))
            for layer, (_, stock) in enumerate(beneath)}


def restore(transformer: nn.Module) -> nn.Module:
    """Undo :func:`set_pe`: the stock position module and processors come back (the mmpos ones, and any
    PE parameters, are dropped), and every parameter gets back the ``requires_grad`` it had before
    :func:`train_only_pe`. The model then computes what the stock model computes, bit for bit."""
    installed = getattr(transformer, "_mmpos_installed", None)
    if installed is None:
        raise ValueError(f"{type(transformer).__name__} has no mmpos encoding installed (call set_pe first)")
    spec = spec_for(transformer)
    check_no_sharded_seam(transformer, spec)
    seam = getattr(transformer, spec.position_attr)
    probe = getattr(seam, "native_dtype_probe", None)
    if probe is not None:  # the stock module missed the .to() calls made while the seam was installed
        installed.position_module.to(probe.device, probe.dtype)
    setattr(transformer, spec.position_attr, installed.position_module)
    ProcessorInstaller.find(transformer).clear(transformer, ENCODING)
    transformer._mmpos_installed = None
    restore_requires_grad(transformer)
    return transformer


def position_module(transformer: nn.Module):
    """The installed seam (``FluxPositions`` / ``WanPositions``): ``table_builds``, ``forwards``, ``encodings``,
    ``coords_transform``."""
    installed = getattr(transformer, "_mmpos_installed", None)
    if installed is None:
        raise ValueError(f"{type(transformer).__name__} has no mmpos encoding installed (call set_pe first)")
    return getattr(transformer, spec_for(transformer).position_attr)


def _processors_beneath_encoding(transformer, spec: ModelSpec) -> list[tuple[str, object]]:
    """Per attention layer, its name and the processor the encoding level sits on (an edit may be above it)."""
    installer = ProcessorInstaller.find(transformer)
    if installer is None:
        return [(name, module.processor) for name, module in spec.attention_modules(transformer)]
    return [(slot.name, slot.below(ENCODING)) for slot in installer.slots]


def _build_encodings(transformer, spec, pe, options, coord_axes, per_layer, num_layers):
    name = "rope_axial" if pe == NATIVE else pe
    if pe == NATIVE:
        extra = sorted(set(options) - set(NATIVE_OPTIONS))
        if extra:
            raise TypeError(f"pe='native' takes only the spectrum options {NATIVE_OPTIONS}, got {extra}; "
                            "use pe='rope_axial' (the same defaults) to change the layout or allocation")
        if coord_axes is not None:
            raise TypeError("pe='native' reads every coordinate axis; use pe='rope_axial' with coord_axes")
    kind = pe_class(name).kind
    if kind not in (PEKind.ROTARY, PEKind.NONE):
        raise TypeError(f"{name!r} is a {kind!r} encoding; the diffusers integration applies rotary encodings "
                        "(or 'nope') inside attention")
    kwargs = {**_model_defaults(transformer, spec, name, options, coord_axes), **options}
    if isinstance(kwargs.get("base", "rope_axial"), str) and "base_options" in pe_options(name):
        kwargs["base_options"] = _wrapped_base_options(transformer, spec, name, kwargs, coord_axes)
    if kwargs.get("seq_dim", -3) != -3:
        raise ValueError(f"seq_dim={kwargs['seq_dim']}: diffusers' processors hold q and k as [B, S, H, D] "
                         "(seq_dim=-3); leave seq_dim unset")
    count = num_layers if per_layer else 1
    if kind == PEKind.NONE:
        if options:
            raise TypeError(f"encoding {name!r} takes no options, got {sorted(options)}")
        return []
    # per layer: seeded encodings get seed + layer index, as in timm / DiT blocks
    return create_block_pes(name, count, {}, kwargs, share=count == 1, where=type(transformer).__name__)


def _model_defaults(transformer, spec, name, options, coord_axes) -> dict:
    """The model's values for the options ``name`` has and the caller did not give."""
    valid = pe_options(name)
    num_axes = len(coord_axes) if coord_axes is not None else len(spec.axis_names)
    defaults = {"head_dim": spec.head_dim(transformer), "num_heads": spec.num_heads(transformer),
                "layout": "interleaved", "seq_dim": -3}
    native_spectrum = "axes_dims" in valid and coord_axes is None
    if native_spectrum and not {"axes_dims", "num_axes", "rotary_dim"} & set(options):
        defaults.update(axes_dims=spec.native_axes_dims(transformer), theta=spec.native_theta(transformer))
    else:
        defaults["num_axes"] = num_axes
    return {k: v for k, v in defaults.items() if k in valid}


def _wrapped_base_options(transformer, spec, name, kwargs, coord_axes) -> dict:
    """For encodings that wrap a base encoding (HARoPE): the model's values for the base's options, under the
    caller's ``base_options``; options the wrapper takes itself (``head_dim``, ``num_heads``, ``seq_dim``, ...) stay
    the wrapper's, which passes them on."""
    base = kwargs.get("base", inspect.signature(pe_class(name)).parameters["base"].default)
    given = dict(kwargs.get("base_options") or {})
    defaults = _model_defaults(transformer, spec, base, given, coord_axes)
    defaults = {k: v for k, v in defaults.items() if k not in pe_options(name)}
    return {**defaults, **given}


def _check_fits(encoding, spec: ModelSpec, head_dim: int, heads: int, coord_axes) -> int:
    """Check ``encoding`` against the model; returns its table's group count (1 or ``heads``)."""
    kind = getattr(encoding, "kind", None)
    check_model_coordinates(encoding, f"the {spec.family} model")
    if not isinstance(encoding, RotaryPE) and kind != PEKind.ROTARY:
        raise TypeError(f"{type(encoding).__name__} is a {kind!r} encoding; the diffusers integration applies "
                        "rotary encodings (or 'nope') inside attention")
    if encoding.head_dim != head_dim:
        raise ValueError(f"the encoding was built for head_dim={encoding.head_dim}, the {spec.family} model has "
                         f"attention_head_dim={head_dim}")
    if encoding.num_axes != len(coord_axes):
        names = tuple(spec.axis_names[a] for a in coord_axes)
        raise ValueError(f"the encoding reads {encoding.num_axes} coordinate axes; the {spec.family} model gives "
                         f"{len(coord_axes)} {names} (choose them with coord_axes)")
    probe = encoding.table(torch.zeros(1, encoding.num_axes), torch.float32)
    lead = tuple(getattr(probe, "cis", torch.zeros(1, 1)).shape[:-2])
    groups = lead[-1] if lead else 1
    if len(lead) > 1 or groups not in (1, heads):
        raise ValueError(f"the encoding's tables have leading dims {lead}; expected none or one per head "
                         f"({heads} heads)")
    return groups


def _make_seam(spec, transformer, stock_position, encodings, native, coord_axes):
    """The seam, on the model's device; learned PE parameters stay fp32 whatever the model's dtype. Until the
    first forward records the activations' dtype, tables are built for the model's dtype."""
    seam = _new_seam(spec, transformer, stock_position, encodings, native, coord_axes)
    seam.activation_dtype = next(transformer.parameters()).dtype
    return seam


def _new_seam(spec, transformer, stock_position, encodings, native, coord_axes):
    device = next(transformer.parameters()).device
    if spec.family == "flux":
        return FluxPositions(encodings, native, coord_axes).to(device)
    if spec.family == "qwen":
        _check_qwen(encodings, stock_position)
        return QwenPositions(encodings, native, coord_axes, spec.native_theta(transformer)).to(device)
    probe = getattr(stock_position, "freqs_cos", None)
    native_dtype = probe.dtype if probe is not None else torch.float32
    return WanPositions(encodings, native, coord_axes, transformer.config.patch_size, native_dtype).to(device)


def _check_qwen(encodings, stock_position) -> None:
    """Qwen-Image's stock processors multiply complex ``[S, P]`` tables into interleaved pairs: one encoding with
    such tables, shared by the layers."""
    from diffusers.models.transformers.transformer_qwenimage import QwenEmbedRope

    if type(stock_position) is not QwenEmbedRope:
        raise TypeError(f"set_pe supports Qwen-Image's QwenEmbedRope, got {type(stock_position).__name__} "
                        "(use_layer3d_rope=True is not supported)")
    if len(encodings) > 1:
        raise ValueError("Qwen-Image: per_layer encodings are not supported (its stock processors read one table)")
    for encoding in encodings:
        probe = encoding.table(torch.zeros(1, encoding.num_axes), torch.float32)
        if getattr(encoding, "layout", None) != "interleaved" or not isinstance(probe, RotaryTable) \
                or probe.cis.dim() != 2:
            raise ValueError(f"Qwen-Image applies one complex [S, P] table in the interleaved layout; "
                             f"{type(encoding).__name__} does not give one (use 'native' or 'rope_axial')")
