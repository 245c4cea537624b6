"""``set_pe`` / ``restore`` / ``pe_parameters`` / ``train_only_pe`` for diffusers' Flux and Wan transformers."""
from __future__ import annotations

import inspect

from dataclasses import dataclass, field

import torch
from torch import nn

from ...encodings.blockwise import check_model_coordinates, create_block_pes
from ...encodings.registry import pe_class, pe_options
from ...encodings.rotary_base import RotaryPE
from ..pe_parameters import pe_parameters as shared_pe_parameters
from ..pe_parameters import train_only_pe as shared_train_only_pe
from .models import ModelSpec, spec_for
from .positions import FluxPositions, IdsPrecisionCheck, WanPositions
from .processors import (EncodingRotation, FluxPEAttnProcessor, WanPEAttnProcessor, flux_stock_rotation,
                         wan_stock_rotation)

NATIVE = "native"
# rope_axial options that keep the stock operator meaningful for pe="native" (spectrum changes only)
NATIVE_OPTIONS = ("theta", "extrapolation", "pair_scale", "table_precision")
AUTO_BACKEND = "auto"


@dataclass
class _Installed:
    """What ``set_pe`` replaced, so that ``restore`` can put it back."""

    pe: str
    position_module: nn.Module
    processors: dict = field(default_factory=dict)  # attention module -> its stock processor
    hook_id: int = -1


def set_pe(transformer: nn.Module, pe: str = NATIVE, *, per_layer: bool = False, coord_axes=None,
           attention_backend: str | None = None, **options) -> nn.Module:
    """Give a diffusers ``FluxTransformer2DModel`` or ``WanTransformer3DModel`` an mmpos positional encoding.

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
            None]`` (Wan, longer videos), ``extrapolation={"type": "ntk", "factor": 2}`` (Flux at 2x size).

    Tables are built by the model's position module once per forward and cached across steps; see
    :func:`position_module` for the counters.
    """
    spec = spec_for(transformer)
    _check_no_sharded_seam(transformer, spec)
    if getattr(transformer, "_mmpos_installed", None) is not None:
        restore(transformer)
    num_axes = len(spec.axis_names)
    coord_axes = _check_coord_axes(coord_axes, spec)
    backend = None if attention_backend is None else resolve_attention_backend(attention_backend)
    heads, head_dim = spec.num_heads(transformer), spec.head_dim(transformer)
    attention = spec.attention_modules(transformer)
    _check_stock_processors(attention, spec)
    encodings = _build_encodings(transformer, spec, pe, options, coord_axes, per_layer, len(attention))
    group_sizes = [_check_fits(e, spec, head_dim, heads, coord_axes or tuple(range(num_axes))) for e in encodings]

    native = pe == NATIVE
    stock_position = getattr(transformer, spec.position_attr)
    seam = _make_seam(spec, transformer, stock_position, encodings, native, coord_axes)
    if native:
        rotation = flux_stock_rotation if spec.family == "flux" else wan_stock_rotation
    else:
        rotation = EncodingRotation(encodings, per_layer, group_sizes)
    processor_cls = FluxPEAttnProcessor if spec.family == "flux" else WanPEAttnProcessor

    installed = _Installed(pe=pe, position_module=stock_position)
    for layer, (_, module) in enumerate(attention):
        stock = module.processor
        installed.processors[module] = stock
        module.set_processor(processor_cls(rotation, layer, getattr(stock, "_attention_backend", None),
                                           getattr(stock, "_parallel_config", None)))
    setattr(transformer, spec.position_attr, seam)
    installed.hook_id = transformer.register_forward_pre_hook(_pre_forward_hook(spec), with_kwargs=True).id
    transformer._mmpos_installed = installed
    if backend is not None:
        transformer.set_attention_backend(backend)
    return transformer


def restore(transformer: nn.Module) -> nn.Module:
    """Undo :func:`set_pe`: the stock position module and processors come back (the mmpos ones, and any
    PE parameters, are dropped)."""
    installed = getattr(transformer, "_mmpos_installed", None)
    if installed is None:
        raise ValueError(f"{type(transformer).__name__} has no mmpos encoding installed (call set_pe first)")
    spec = spec_for(transformer)
    _check_no_sharded_seam(transformer, spec)
    seam = getattr(transformer, spec.position_attr)
    probe = getattr(seam, "native_dtype_probe", None)
    if probe is not None:  # the stock module missed the .to() calls made while the seam was installed
        installed.position_module.to(probe.device, probe.dtype)
    setattr(transformer, spec.position_attr, installed.position_module)
    for module, processor in installed.processors.items():
        module.set_processor(processor)
    transformer._forward_pre_hooks.pop(installed.hook_id, None)  # by id: a deep copy's hook too
    transformer._forward_pre_hooks_with_kwargs.pop(installed.hook_id, None)
    transformer._mmpos_installed = None
    return transformer


def position_module(transformer: nn.Module):
    """The installed seam (``FluxPositions`` / ``WanPositions``): ``table_builds``, ``forwards``, ``encodings``,
    ``coords_transform``."""
    installed = getattr(transformer, "_mmpos_installed", None)
    if installed is None:
        raise ValueError(f"{type(transformer).__name__} has no mmpos encoding installed (call set_pe first)")
    return getattr(transformer, spec_for(transformer).position_attr)


def pe_parameters(transformer: nn.Module) -> list[nn.Parameter]:
    """The parameters of the installed encodings (e.g. RoPE-Mixed frequencies, HARoPE's skew parameters);
    :func:`mmpos.integrations.pe_parameters.pe_parameters` after checking that ``set_pe`` was called."""
    position_module(transformer)  # raises when no encoding is installed
    return shared_pe_parameters(transformer)


def train_only_pe(transformer: nn.Module, also=()) -> list[nn.Parameter]:
    """Freeze every parameter except the encodings' (and ``also``); returns those (for the optimiser). See
    :func:`mmpos.integrations.pe_parameters.train_only_pe`."""
    position_module(transformer)  # raises when no encoding is installed
    return shared_train_only_pe(transformer, also)


def cast_keeping_pe_fp32(transformer: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``transformer.to(dtype)`` except the installed encodings' parameters, which keep their fp32 values
    (learned frequencies rounded to bf16 would move every position's phase)."""
    encodings = position_module(transformer).encodings
    saved = {k: v.detach().clone() for k, v in encodings.state_dict().items()}
    transformer.to(dtype)
    encodings.float()
    encodings.load_state_dict(saved)
    return transformer


def resolve_attention_backend(backend: str) -> str:
    """A diffusers dispatch backend name, checked (known name, installed requirements); ``"auto"`` is xformers
    on CUDA when it imports, else SDPA (``"native"``)."""
    from diffusers.models.attention_dispatch import AttentionBackendName, _check_attention_backend_requirements

    if backend == AUTO_BACKEND:
        return "xformers" if torch.cuda.is_available() and _xformers_importable() else "native"
    names = sorted(b.value for b in AttentionBackendName)
    if backend not in names:
        raise ValueError(f"attention_backend={backend!r} must be one of {names} or {AUTO_BACKEND!r}")
    _check_attention_backend_requirements(AttentionBackendName(backend))
    return backend


def _xformers_importable() -> bool:
    try:
        import xformers.ops  # noqa: F401
    except Exception:  # ImportError, or a build that does not match the installed torch
        return False
    return True


def _check_no_sharded_seam(transformer, spec: ModelSpec) -> None:
    """Wan's context-parallel plan hooks the position module itself: swapping it afterwards would drop the hook
    (tables unsharded while tokens are). Flux's plan shards the model inputs, so it does not matter there."""
    if spec.family == "wan" and getattr(transformer, "_parallel_config", None) is not None:
        raise RuntimeError("WanTransformer3DModel: call set_pe/restore before enable_parallelism (its context-"
                           "parallel plan hooks the `rope` module that set_pe replaces)")


def _check_stock_processors(attention, spec: ModelSpec) -> None:
    """Refuse to replace processors that carry more than the stock one (IP-Adapter, custom code)."""
    stock_cls = spec.stock_processor()
    for name, module in attention:
        if type(module.processor) is not stock_cls:
            raise TypeError(f"{name} uses {type(module.processor).__name__}; set_pe replaces only the stock "
                            f"{stock_cls.__name__} (its extra behaviour would be lost). Reset it first, e.g. "
                            "transformer.set_attn_processor(...) with the stock processors")


def _check_coord_axes(coord_axes, spec: ModelSpec):
    if coord_axes is None:
        return None
    num_axes = len(spec.axis_names)
    axes = tuple(coord_axes)
    if not axes or any(not isinstance(a, int) or not 0 <= a < num_axes for a in axes) or len(set(axes)) != len(axes):
        raise ValueError(f"coord_axes={coord_axes!r}: expected distinct indices into the {spec.family} coordinate "
                         f"axes {spec.axis_names}")
    return axes


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
    if kind not in ("rotary", "none"):
        raise TypeError(f"{name!r} is a {kind!r} encoding; the diffusers integration applies rotary encodings "
                        "(or 'nope') inside attention")
    kwargs = {**_model_defaults(transformer, spec, name, options, coord_axes), **options}
    if isinstance(kwargs.get("base", "rope_axial"), str) and "base_options" in pe_options(name):
        kwargs["base_options"] = _wrapped_base_options(transformer, spec, name, kwargs, coord_axes)
    if kwargs.get("seq_dim", -3) != -3:
        raise ValueError(f"seq_dim={kwargs['seq_dim']}: diffusers' processors hold q and k as [B, S, H, D] "
                         "(seq_dim=-3); leave seq_dim unset")
    count = num_layers if per_layer else 1
    if kind == "none":
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
    caller's ``base_options``; the wrapper's own ``head_dim``/``num_heads`` stay the wrapper's."""
    base = kwargs.get("base", inspect.signature(pe_class(name)).parameters["base"].default)
    given = dict(kwargs.get("base_options") or {})
    defaults = _model_defaults(transformer, spec, base, given, coord_axes)
    defaults = {k: v for k, v in defaults.items() if k not in ("head_dim", "num_heads")}
    return {**defaults, **given}


def _check_fits(encoding, spec: ModelSpec, head_dim: int, heads: int, coord_axes) -> int:
    """Check ``encoding`` against the model; returns its table's group count (1 or ``heads``)."""
    kind = getattr(encoding, "kind", None)
    check_model_coordinates(encoding, f"the {spec.family} model")
    if not isinstance(encoding, RotaryPE) and kind != "rotary":
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
    """The seam, on the model's device; learned PE parameters stay fp32 whatever the model's dtype."""
    device = next(transformer.parameters()).device
    if spec.family == "flux":
        return FluxPositions(encodings, native, coord_axes).to(device)
    probe = getattr(stock_position, "freqs_cos", None)
    native_dtype = probe.dtype if probe is not None else torch.float32
    return WanPositions(encodings, native, coord_axes, transformer.config.patch_size, native_dtype).to(device)


def _pre_forward_hook(spec: ModelSpec):
    """Record the activation dtype for the seam and, on Flux, check that the ids match the tokens."""
    check_precision = IdsPrecisionCheck()

    def hook(module, args, kwargs):
        hidden_states = kwargs.get("hidden_states", args[0] if args else None)
        if isinstance(hidden_states, torch.Tensor):
            getattr(module, spec.position_attr).activation_dtype = hidden_states.dtype
        if spec.family == "flux":
            _check_flux_ids(hidden_states, kwargs.get("encoder_hidden_states", _positional(args, 1)),
                            kwargs.get("img_ids", _positional(args, 4)), kwargs.get("txt_ids", _positional(args, 5)),
                            check_precision)
        return None

    return hook


def _positional(args, index):
    return args[index] if len(args) > index else None


def _check_flux_ids(hidden_states, encoder_hidden_states, img_ids, txt_ids, check_precision):
    pairs = (("img_ids", img_ids, "hidden_states", hidden_states),
             ("txt_ids", txt_ids, "encoder_hidden_states", encoder_hidden_states))
    for ids_name, ids, tokens_name, tokens in pairs:
        if not isinstance(ids, torch.Tensor) or not isinstance(tokens, torch.Tensor):
            continue
        check_precision(ids_name, ids)
        count = ids.shape[-2] if ids.dim() >= 2 else -1
        if count != tokens.shape[1]:
            raise ValueError(f"{ids_name} has shape {tuple(ids.shape)} ({count} positions) but {tokens_name} has "
                             f"{tokens.shape[1]} tokens; expected [{tokens.shape[1]}, 3]")
