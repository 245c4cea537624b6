"""What ``set_pe`` installs on a diffusers transformer, and how it comes off: the seam (the model's position module
replaced), the mmpos processors (the ``"encoding"`` level of :mod:`.installer`), the per-forward hooks and the
attention backend. :class:`~.hooks.PEHook` calls :func:`install_encoding` when it is registered in the model's
``HookRegistry`` and :func:`remove_encoding` when it is removed (:func:`~.hooks.apply_pe`, ``set_pe``, ``restore``).
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
from ..pe_parameters import restore_requires_grad
from .backends import resolve_attention_backend
from .checks import check_coord_axes, check_model, check_stock_processors, pe_pre_forward_hook
from .families import Family, SpectrumSeam, family_for, get_family, list_families
from .families.base import CastFollowingSeam
from .global_extents import GlobalExtents
from .global_extents import remove as remove_global_extents
from .installer import ENCODING, ProcessorInstaller
from .parallelism import check_parallelism
from .processors import EncodingRotation
from .xdit import check_no_xdit_processors

NATIVE = "native"
# rope_axial options that keep the stock operator meaningful for pe="native" (spectrum changes only)
NATIVE_OPTIONS = ("theta", "extrapolation", "pair_scale", "table_precision")
TIER1_OPTIONS = NATIVE_OPTIONS[:3]  # tier-1 seams compute in the stock precision


@dataclass
class InstalledEncoding:
    """What ``set_pe`` replaced besides the processors (those are in the installer), for ``restore``."""

    pe: str
    position_module: object
    hook: object = None  # tier 1: the pre-forward hook's handle (tier 2: the installer holds it)
    extents_hooks: tuple = ()  # the ids of the global-extents hooks (:mod:`.global_extents`)
    companions: tuple = ()  # (attr, stock module) of the family's companion position modules


def install_encoding(
    transformer: nn.Module, pe: str, per_layer: bool, coord_axes, attention_backend: str | None, options: dict
) -> InstalledEncoding:
    """Install encoding ``pe`` (the fields of :class:`~.hooks.PEConfig`; checked before anything changes) on a
    transformer that has none; returns the record :func:`remove_encoding` takes."""
    family = family_for(transformer)
    check_model(transformer, family)
    check_no_xdit_processors(getattr(transformer, "attn_processors", {}).items())
    check_parallelism(transformer, "set_pe", family)
    coord_axes = check_coord_axes(coord_axes, family)
    backend = None if attention_backend is None else resolve_attention_backend(attention_backend)
    stock_position = getattr(transformer, family.position_attr, None)  # None: a rotary-input family adds its seam
    if family.tier == 1 or (pe == NATIVE and family.has_tables):  # the stock processors stay
        seam = _spectrum_seam(transformer, family, stock_position, pe, options, coord_axes, per_layer)
        hook = transformer.register_forward_pre_hook(pe_pre_forward_hook(family), with_kwargs=True)
    else:
        seam = _tier2_seam(transformer, family, stock_position, pe, options, coord_axes, per_layer)
        hook = None
    _install_position(transformer, family.position_attr, seam)
    companions = tuple((attr, getattr(transformer, attr)) for attr in family.companion_attrs)
    for attr in family.companion_attrs:
        setattr(transformer, attr, seam.companions[attr])
    scheduled = any(getattr(e, "schedule", None) is not None for e in getattr(seam, "encodings", ()))
    extents_hooks = (
        GlobalExtents(family).install(transformer)
        if scheduled and (family.global_coords or family.image_extents)
        else ()
    )
    installed = InstalledEncoding(
        pe=pe, position_module=stock_position, hook=hook, extents_hooks=extents_hooks, companions=companions
    )
    transformer._mmpos_installed = installed
    if backend is not None:
        transformer.set_attention_backend(backend)
    return installed


def remove_encoding(transformer: nn.Module, installed: InstalledEncoding) -> None:
    """Undo :func:`install_encoding`: the stock position module and processors come back (the mmpos ones, and any
    PE parameters, are dropped), and every parameter gets back the ``requires_grad`` it had before
    ``train_only_pe``. The model then computes what the stock model computes, bit for bit."""
    family = family_for(transformer)
    check_model(transformer, family)
    seam = getattr(transformer, family.position_attr)
    probe = getattr(seam, "native_dtype_probe", None)
    if probe is not None:  # the stock module missed the .to() calls made while the seam was installed
        installed.position_module.to(probe.device, probe.dtype)
    _restore_position(transformer, family.position_attr, installed.position_module)
    for attr, stock in installed.companions:
        setattr(transformer, attr, stock)
    remove_global_extents(transformer, installed.extents_hooks)
    if installed.hook is not None:
        installed.hook.remove()
    else:
        ProcessorInstaller.find(transformer).clear(transformer, ENCODING)
    transformer._mmpos_installed = None
    restore_requires_grad(transformer)


def _tier2_seam(transformer, family, stock_position, pe, options, coord_axes, per_layer):
    """The encodings, the seam and the mmpos processors (installed at the ``encoding`` level)."""
    num_axes = len(family.axis_names)
    heads, head_dim = family.num_heads(transformer), family.head_dim(transformer)
    beneath = _processors_beneath_encoding(transformer, family)
    check_stock_processors(beneath, family)
    encodings = _build_encodings(transformer, family, pe, options, coord_axes, per_layer, len(beneath))
    group_sizes = [_check_fits(e, family, head_dim, heads, coord_axes or tuple(range(num_axes))) for e in encodings]
    seam = _on_model(family.make_seam(transformer, stock_position, encodings, pe == NATIVE, coord_axes), transformer)
    rotation = EncodingRotation(encodings, per_layer, group_sizes)
    processors = family.make_processors(beneath, rotation, pe == NATIVE)
    ProcessorInstaller.of(transformer).fill(ENCODING, processors, hook=pe_pre_forward_hook(family))
    return seam


def _spectrum_seam(transformer, family, stock_position, pe, options, coord_axes, per_layer):
    """Tier 1: the native spectrum (with the caller's spectrum options) in a :class:`SpectrumSeam`."""
    if pe not in (NATIVE, "rope_axial") or coord_axes is not None or per_layer:
        tier2 = [name for name in list_families() if get_family(name).tier == 2]
        raise TypeError(
            f"{type(transformer).__name__} ({family.name}) is reached at tier 1: set_pe changes its "
            f"spectrum only (pe='native' with {TIER1_OPTIONS}), its stock processors stay; "
            f"pe={pe!r}, coord_axes and per_layer need mmpos processors (tier-2 families: {tier2})"
        )
    extra = sorted(set(options) - set(TIER1_OPTIONS) - set(family.seam_options))
    if extra:
        own = f" and its own {sorted(family.seam_options)}" if family.seam_options else ""
        raise TypeError(f"{family.name} (tier 1) takes only the spectrum options {TIER1_OPTIONS}{own}, got {extra}")
    choices = _seam_choices(family, options)
    axes_dims, theta = family.native_axes_dims(transformer), family.native_theta(transformer)
    check = family.extras.get("check_extrapolation")  # a family's own refusals (Mochi: RIFLEx)
    if check is not None:
        check(options.get("extrapolation"))
    encoding = pe_class("rope_axial")(
        head_dim=sum(axes_dims),
        axes_dims=axes_dims,
        theta=options.get("theta", theta),
        extrapolation=options.get("extrapolation"),
        pair_scale=options.get("pair_scale"),
        allocation=family.extras.get("allocation", "chunked"),  # "interleaved": MRoPE-I models (Ideogram 4)
    )
    custom = family.make_seam if family.tier == 1 else None  # a tier-2 family's make_seam is its mmpos seam
    if custom:
        seam = custom(transformer, stock_position, [encoding], True, None)
    elif family.cast_probe:
        seam = CastFollowingSeam(family, encoding, stock_position, axes_dims, theta, probe=family.cast_probe)
    else:
        seam = SpectrumSeam(family, encoding, stock_position, axes_dims, theta)
    for name, value in choices.items():
        setattr(seam, name, value)
    return _on_model(seam, transformer)


def _seam_choices(family: Family, options: dict) -> dict:
    """The family's own seam options (:attr:`Family.seam_options`), each given or its default (the first choice)."""
    choices = {}
    for name, allowed in family.seam_options.items():
        value = options.get(name, allowed[0])
        if value not in allowed:
            raise ValueError(f"{family.name}: {name}={value!r}; expected one of {list(allowed)}")
        choices[name] = value
    return choices


def _on_model(seam, transformer):
    """The seam on the model's device (where it is: weights on ``"meta"`` between forwards under accelerate's
    sequential CPU offload); until the first forward records the activations' dtype, tables are built for the model's
    dtype."""
    parameter = next(transformer.parameters())
    if parameter.device.type != "meta":
        seam = seam.to(parameter.device)
    seam.activation_dtype = parameter.dtype
    return seam


def _processors_beneath_encoding(transformer, family: Family) -> list[tuple[str, object]]:
    """Per attention layer, its name and the processor the encoding level sits on (an edit may be above it)."""
    installer = ProcessorInstaller.find(transformer)
    if installer is None:
        return [(name, module.processor) for name, module in family.attention_modules(transformer)]
    return [(slot.name, slot.below(ENCODING)) for slot in installer.slots]


def _build_encodings(transformer, family, pe, options, coord_axes, per_layer, num_layers):
    name = "rope_axial" if pe == NATIVE else pe
    if pe == NATIVE:
        extra = sorted(set(options) - set(NATIVE_OPTIONS))
        if extra:
            raise TypeError(
                f"pe='native' takes only the spectrum options {NATIVE_OPTIONS}, got {extra}; "
                "use pe='rope_axial' (the same defaults) to change the layout or allocation"
            )
        if coord_axes is not None:
            raise TypeError("pe='native' reads every coordinate axis; use pe='rope_axial' with coord_axes")
    kind = pe_class(name).kind
    if kind not in (PEKind.ROTARY, PEKind.NONE):
        raise TypeError(
            f"{name!r} is a {kind!r} encoding; the diffusers integration applies rotary encodings "
            "(or 'nope') inside attention"
        )
    kwargs = {**_model_defaults(transformer, family, name, options, coord_axes), **options}
    if isinstance(kwargs.get("base", "rope_axial"), str) and "base_options" in pe_options(name):
        kwargs["base_options"] = _wrapped_base_options(transformer, family, name, kwargs, coord_axes)
    if kwargs.get("seq_dim", -3) != -3:
        raise ValueError(
            f"seq_dim={kwargs['seq_dim']}: diffusers' processors hold q and k as [B, S, H, D] "
            "(seq_dim=-3); leave seq_dim unset"
        )
    count = num_layers if per_layer else 1
    if kind == PEKind.NONE:
        if options:
            raise TypeError(f"encoding {name!r} takes no options, got {sorted(options)}")
        return []
    # per layer: seeded encodings get seed + layer index, as in timm / DiT blocks
    return create_block_pes(name, count, {}, kwargs, share=count == 1, where=type(transformer).__name__)


def _model_defaults(transformer, family, name, options, coord_axes) -> dict:
    """The model's values for the options ``name`` has and the caller did not give."""
    valid = pe_options(name)
    num_axes = len(coord_axes) if coord_axes is not None else len(family.axis_names)
    defaults = {
        "head_dim": family.head_dim(transformer),
        "num_heads": family.num_heads(transformer),
        "layout": "interleaved",
        "seq_dim": -3,
    }
    native_spectrum = "axes_dims" in valid and coord_axes is None
    if native_spectrum and not {"axes_dims", "num_axes", "rotary_dim"} & set(options):
        defaults.update(axes_dims=family.native_axes_dims(transformer), theta=family.native_theta(transformer))
    else:
        defaults["num_axes"] = num_axes
    return {k: v for k, v in defaults.items() if k in valid}


def _wrapped_base_options(transformer, family, name, kwargs, coord_axes) -> dict:
    """For encodings that wrap a base encoding (HARoPE): the model's values for the base's options, under the
    caller's ``base_options``; options the wrapper takes itself (``head_dim``, ``num_heads``, ``seq_dim``, ...) stay
    the wrapper's, which passes them on."""
    base = kwargs.get("base", inspect.signature(pe_class(name)).parameters["base"].default)
    given = dict(kwargs.get("base_options") or {})
    defaults = _model_defaults(transformer, family, base, given, coord_axes)
    defaults = {k: v for k, v in defaults.items() if k not in pe_options(name)}
    return {**defaults, **given}


def _check_fits(encoding, family: Family, head_dim: int, heads: int, coord_axes) -> int:
    """Check ``encoding`` against the model; returns its table's group count (1 or ``heads``)."""
    kind = getattr(encoding, "kind", None)
    check_model_coordinates(encoding, f"the {family.name} model")
    if not isinstance(encoding, RotaryPE) and kind != PEKind.ROTARY:
        raise TypeError(
            f"{type(encoding).__name__} is a {kind!r} encoding; the diffusers integration applies "
            "rotary encodings (or 'nope') inside attention"
        )
    if encoding.head_dim != head_dim:
        raise ValueError(
            f"the encoding was built for head_dim={encoding.head_dim}, the {family.name} model has "
            f"attention_head_dim={head_dim}"
        )
    if encoding.num_axes != len(coord_axes):
        names = tuple(family.axis_names[a] for a in coord_axes)
        raise ValueError(
            f"the encoding reads {encoding.num_axes} coordinate axes; the {family.name} model gives "
            f"{len(coord_axes)} {names} (choose them with coord_axes)"
        )
    probe = encoding.table(torch.zeros(1, encoding.num_axes), torch.float32)
    lead = tuple(getattr(probe, "cis", torch.zeros(1, 1)).shape[:-2])
    groups = lead[-1] if lead else 1
    if len(lead) > 1 or groups not in (1, heads):
        raise ValueError(
            f"the encoding's tables have leading dims {lead}; expected none or one per head ({heads} heads)"
        )
    return groups


def _is_method_seam(transformer: nn.Module, name: str) -> bool:
    """The family's seam is a method of the model's class (JoyImage's ``get_rotary_pos_embed``)."""
    return inspect.isfunction(inspect.getattr_static(type(transformer), name, None))


def _install_position(transformer: nn.Module, name: str, seam) -> None:
    """Put ``seam`` where the model looks its position module up. A method of the class is shadowed through the
    instance's ``__dict__`` (a registered submodule would not shadow it; the checkpoint keeps the stock keys)."""
    if _is_method_seam(transformer, name):
        transformer.__dict__[name] = seam
    else:
        setattr(transformer, name, seam)


def _restore_position(transformer: nn.Module, name: str, stock) -> None:
    """Undo :func:`_install_position` with the stock module, plain object or method."""
    if _is_method_seam(transformer, name):
        transformer.__dict__.pop(name, None)  # the class's method is found again
        return
    if stock is None:  # a rotary-input family's seam was added (:mod:`.families.rotary_input`)
        delattr(transformer, name)
        return
    if not isinstance(stock, nn.Module):  # a plain stock object (Z-Image's RopeEmbedder):
        delattr(transformer, name)  # the seam is a submodule, which only a module may replace
    setattr(transformer, name, stock)
