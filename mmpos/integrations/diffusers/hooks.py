"""mmpos' encodings as diffusers hooks: a config dataclass per feature, an ``apply_*`` function, and one
:class:`PEHook` registered in the model's ``HookRegistry`` (diffusers' ``FirstBlockCacheConfig`` +
``apply_first_block_cache`` pattern). ``set_pe`` and ``restore`` are thin wrappers over these.

    from diffusers.hooks import HookRegistry
    from mmpos.integrations.diffusers import DyPEConfig, PEConfig, apply_dype, apply_pe

    apply_pe(pipe.transformer, PEConfig("rope_axial", options={"theta": 500.0}))
    apply_dype(pipe.transformer, DyPEConfig(trained_grid=(64, 64)))  # replaces the encoding above
    HookRegistry.check_if_exists_or_initialize(pipe.transformer).remove_hook("mmpos_pe")  # == restore(...)

The hook installs the encoding when the registry registers it (``initialize_hook``: the seam, the mmpos processors,
the attention backend) and removes it when the registry removes it (``deinitalize_hook``), so it stacks with
diffusers' own hooks (caches on the blocks, layerwise casting and group offloading on the layers) and comes off
like them. Its ``pre_forward`` passes the inputs through: the per-forward work (the activation dtype, the step's
sigma, the checks of the inputs, a schedule's whole-sequence extents) runs in torch forward pre-hooks, which run
before every registry hook's wrapper and so see the whole sequence before a context-parallel plan shards it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Optional

from diffusers.hooks import HookRegistry, ModelHook
from torch import nn

from .extrapolation import model_extrapolation
from .noise_shift import NoiseShift, apply_noise_shift
from .pe_install import NATIVE, InstalledEncoding, install_encoding, remove_encoding

PE_HOOK = "mmpos_pe"
DYPE_METHODS = {"vision_yarn": "dype", "yarn": "dype_yarn", "ntk": "dype_ntk"}  # method -> extrapolation preset


@dataclass
class PEConfig:
    """An mmpos positional encoding on a diffusers transformer (the arguments of ``set_pe``).

    Args:
        pe: ``"native"`` (the model's own RoPE rebuilt by mmpos, bit-identical to the stock model), any registered
            rotary encoding (``"rope_axial"``, ``"rope_mixed"``, ...) or ``"nope"`` (tier-2 families).
        per_layer: one encoding instance per attention layer.
        coord_axes: the model's coordinate axes the encoding reads (default all).
        attention_backend: a diffusers dispatch backend name, ``"auto"``, or ``None`` (keep the model's).
        options: the encoding's options (``theta``, ``extrapolation``, ``allocation``, ...).
    """

    pe: str = NATIVE
    per_layer: bool = False
    coord_axes: Optional[tuple[int, ...]] = None
    attention_backend: Optional[str] = None
    options: dict = field(default_factory=dict)


@dataclass
class DyPEConfig:
    """DyPE (Issachar et al. 2025): the model's own spectrum, extrapolated on the image rows and columns by a
    schedule that follows the output size and the denoising step (``docs/extrapolation.md``).

    Args:
        trained_grid: ``(rows, cols)`` tokens at the training resolution (FLUX.1 at 1024 px: ``(64, 64)``).
        method: ``"vision_yarn"`` (the paper's FLUX default), ``"yarn"`` or ``"ntk"``.
        lambda_s, lambda_t, start_sigma, schedule_magnitude: the schedule's options
            (:class:`~mmpos.spectrum.schedule.ExtrapolationSchedule`; ``lambda_s=None``: the method's default).
        time: video families: the time axis' policy (``{"type": "riflex", "k": 4, "target_length": 32}``).
        pe: ``"native"`` (stock processors where the family allows) or ``"rope_axial"`` (mmpos processors).
        attention_backend: as in :class:`PEConfig`.
        convention: ``"authors"`` (the DyPE authors' code) or ``"comfyui"`` (ComfyUI-DyPE's vision YaRN:
            ``docs/extrapolation.md``; ``lambda_s=None`` is then its 2).
        shift: the noise-schedule shift a pipeline gets with it (:func:`apply_dype_to_pipeline`):
            ``NoiseShift("authors")`` (default), ``NoiseShift("comfyui")``, or ``None`` (off: the pipeline's ``mu``).
    """

    trained_grid: tuple[float, float]
    method: str = "vision_yarn"
    lambda_s: Optional[float] = None
    lambda_t: float = 2.0
    start_sigma: float = 1.0
    schedule_magnitude: bool = True
    time: Optional[dict] = None
    pe: str = NATIVE
    attention_backend: Optional[str] = None
    convention: str = "authors"
    shift: Optional[NoiseShift] = NoiseShift("authors")

    def pe_config(self, transformer: nn.Module) -> PEConfig:
        """The :class:`PEConfig` this DyPE config installs on ``transformer``."""
        if self.method not in DYPE_METHODS:
            raise ValueError(
                f"DyPEConfig.method={self.method!r} is not supported; expected one of {list(DYPE_METHODS)}"
            )
        extrapolation = model_extrapolation(
            transformer,
            DYPE_METHODS[self.method],
            self.trained_grid,
            time=self.time,
            lambda_s=self.lambda_s,
            lambda_t=self.lambda_t,
            start_sigma=self.start_sigma,
            schedule_magnitude=self.schedule_magnitude,
            convention=self.convention,
        )
        return PEConfig(self.pe, attention_backend=self.attention_backend, options={"extrapolation": extrapolation})


class PEHook(ModelHook):
    """Installs ``config`` when registered, removes it when the registry removes the hook (see the module
    docstring); ``installed`` is what it replaced."""

    def __init__(self, config: PEConfig):
        super().__init__()
        self.config = config
        self.installed: Optional[InstalledEncoding] = None

    def initialize_hook(self, module: nn.Module) -> nn.Module:
        config = self.config
        options = dict(config.options)
        self.installed = install_encoding(
            module, config.pe, config.per_layer, config.coord_axes, config.attention_backend, options
        )
        return module

    def deinitalize_hook(self, module: nn.Module) -> nn.Module:  # diffusers' spelling
        if self.installed is not None:
            remove_encoding(module, self.installed)
            self.installed = None
        return module

    def __repr__(self) -> str:
        return f"PEHook(pe={self.config.pe!r})"


def apply_pe(transformer: nn.Module, config: PEConfig) -> None:
    """Install an mmpos encoding on ``transformer`` as the ``"mmpos_pe"`` hook of its ``HookRegistry`` (an
    encoding installed before is removed first). Remove it with ``restore(transformer)`` or
    ``registry.remove_hook("mmpos_pe")``."""
    if not isinstance(config, PEConfig):
        raise TypeError(f"config must be a PEConfig, got {type(config).__name__}")
    registry = HookRegistry.check_if_exists_or_initialize(transformer)
    if registry.get_hook(PE_HOOK) is not None:
        registry.remove_hook(PE_HOOK, recurse=False)
    hook = PEHook(config)
    registry.register_hook(hook, PE_HOOK)
    _copyable_forward(transformer, hook)


def apply_dype(transformer: nn.Module, config: DyPEConfig) -> None:
    """DyPE on ``transformer``: :func:`apply_pe` with the model's native spectrum under the DyPE schedule."""
    if not isinstance(config, DyPEConfig):
        raise TypeError(f"config must be a DyPEConfig, got {type(config).__name__}")
    apply_pe(transformer, config.pe_config(transformer))


def apply_dype_to_pipeline(pipe, config: DyPEConfig, height: int, width: int) -> Optional[float]:
    """DyPE on ``pipe``: :func:`apply_dype` on its transformer and ``config.shift`` on its scheduler for
    ``height x width`` outputs (:mod:`.noise_shift`); returns the scheduler's ``mu`` (``None``: the pipeline's)."""
    apply_dype(pipe.transformer, config)
    if config.shift is None:
        return None
    return apply_noise_shift(pipe, config.shift, height, width, config.trained_grid)


def installed_hook(transformer: nn.Module) -> Optional[PEHook]:
    """The model's :class:`PEHook`, or ``None``."""
    registry = getattr(transformer, "_diffusers_hook", None)
    return None if registry is None else registry.get_hook(PE_HOOK)


def remove_pe(transformer: nn.Module) -> None:
    """Remove the ``"mmpos_pe"`` hook through the registry (its ``deinitalize_hook`` restores the stock model),
    keeping an accelerate hook added over it (:func:`_keep_outer_wrapper`)."""
    if installed_hook(transformer) is None:
        raise ValueError(f"{type(transformer).__name__} has no mmpos encoding installed (call set_pe first)")
    outer = transformer.__dict__.get("forward")
    transformer._diffusers_hook.remove_hook(PE_HOOK, recurse=False)
    _keep_outer_wrapper(transformer, outer)


def _keep_outer_wrapper(transformer: nn.Module, outer) -> None:
    """accelerate's hooks (``cpu_offload``, ``enable_model_cpu_offload``, ...) wrap the forward they find and keep it
    as ``_old_forward``. Where they wrapped mmpos' hook forward, the registry's removal (which sets the model's forward
    to the one beneath the hook) would drop them too: put ``outer`` back, around the forward beneath."""
    if outer is None or isinstance(outer, _HookedForward) or transformer.__dict__.get("forward") is outer:
        return
    if isinstance(transformer.__dict__.get("_old_forward"), _HookedForward):
        transformer._old_forward = transformer.forward
        transformer.forward = outer


class _HookedForward:
    """The forward the registry installs for a hook (pre_forward, the forward beneath, post_forward), as an object:
    the registry's own wrapper is a closure, which ``copy.deepcopy`` shares between a model and its copy (the copy
    would run the original's layers); this one is copied with the model (its ``fn_ref`` with the registry's)."""

    def __init__(self, module: nn.Module, fn_ref, beneath):
        self.module, self.fn_ref = module, fn_ref
        functools.update_wrapper(self, beneath)  # inspect.signature follows __wrapped__ to the real forward

    def __call__(self, *args, **kwargs):
        args, kwargs = self.fn_ref.pre_forward(self.module, *args, **kwargs)
        output = self.fn_ref.forward(*args, **kwargs)
        return self.fn_ref.post_forward(self.module, output)


def _copyable_forward(transformer: nn.Module, hook: PEHook) -> None:
    """Replace the registry's wrapper of ``hook`` (the model's forward: it was registered last) by a
    :class:`_HookedForward` doing the same; the registry's removal puts back the forward beneath either way."""
    fn_ref = hook.fn_ref
    transformer.forward = _HookedForward(transformer, fn_ref, transformer.forward.__wrapped__)
