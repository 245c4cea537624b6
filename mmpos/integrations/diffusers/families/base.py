"""What mmpos knows about one diffusers transformer family, and the tier-1 seam built from it.

A :class:`Family` is registered once (:func:`~.register_family`) by its module in this package and says:

* which model classes it covers, and where their position seam is (``position_attr``: the module or plain object
  that turns ids or a latent shape into rotary tables, called once per forward);
* the coordinate axes each token gets, which of them are the image rows / columns and the time axis;
* the native spectrum (per-axis channels, theta), and what ``timestep`` the pipelines pass per unit of sigma;
* the tier: 1 (the seam is replaced, the stock processors stay: the native spectrum with any extrapolation
  preset) or 2 (also mmpos processors: any encoding, camera adapters, edits).

Tier 1 seams are :class:`SpectrumSeam`: the family's ``tables(seam, *stock_args)`` rebuilds the stock output
(same format, shapes and arithmetic as the stock module) from the frequencies :meth:`SpectrumSeam.axis_spectra`
resolves for this forward: the stock ladder on every axis the spectrum leaves as trained (so ``"native"`` and
every preset at or below the training extent are the stock tables bit for bit), mmpos' frequencies elsewhere.
Text and other non-image tokens keep the training spectrum (the DyPE authors' Qwen-Image code does the same).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from ....spectrum.allocation import chunked_spectrum
from ..positions import PositionSeam, identity_key, values_key


@dataclass(frozen=True)
class AxisSpectrum:
    """One axis' rotary frequencies for a forward: ``inv_freq`` ``[d / 2]`` float64, or ``None`` for the stock
    ladder (computed by the family exactly as the stock module does), and the magnitude of cos and sin."""

    inv_freq: Optional[torch.Tensor]
    magnitude: float | torch.Tensor = 1.0  # a 0-d tensor in a compiled graph (SpectrumSeam.published_tables)

    @property
    def is_stock(self) -> bool:
        return self.inv_freq is None and self.magnitude == 1.0


STOCK = AxisSpectrum(None, 1.0)


@dataclass(frozen=True)
class CameraSite:
    """Where a family's camera adapters (:mod:`..camera_adapter`) act: the layers are the family's
    ``attention_modules`` (the self-attention over the video tokens), whose hidden states are the tokens of the
    family's ``latent_grid`` (frame-major then row-major; one camera per frame).

    Args:
        output_index: ``None`` where a layer returns the video tokens' attention output; ``i`` where it returns a
            tuple whose item ``i`` is (HunyuanVideo 1.5's joint attention: ``(video, text)``, index 0).
        context_parallel: a family whose seam is not verified under context parallelism
            (:attr:`Family.context_parallel` false) but whose camera adapters are, on the stock position module:
            ``context_parallel(model, args=None, kwargs=None)`` raises (one line, naming what) unless the plan in force
            (and, given a forward's inputs, those inputs) are the ones a 2-process test showed equal to one process
            (LTX-2: ``tests/integrations/test_context_parallel_camera.py``); ``None``: refused as the seam is.
    """

    output_index: Optional[int] = None
    context_parallel: Optional[Callable] = None


def check_latents(hidden_states, layout: str) -> None:
    """``hidden_states`` is a tensor of ``layout`` (``"[B, C, H, W]"``, ``"[B, C, F, H, W]"``: as many dimensions);
    else a ValueError naming ``hidden_states``, what it is and the layout expected."""
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.dim() != layout.count(",") + 1:
        shape = tuple(hidden_states.shape) if isinstance(hidden_states, torch.Tensor) else type(hidden_states).__name__
        raise ValueError(f"hidden_states has shape {shape}; expected latents {layout}")


def latent_video_grid(model, args, kwargs) -> tuple[int, int, int]:
    """The video token grid of latents ``hidden_states [B, C, F, H, W]`` cut into the model's ``patch_size`` ``(t, h,
    w)`` patches (``config.patch_size``, or ``patch_size_t`` and a square ``patch_size``)."""
    latents = kwargs.get("hidden_states", args[0] if args else None)
    check_latents(latents, "[B, C, F, H, W]")
    patch = model.config.patch_size
    patch = tuple(patch) if isinstance(patch, (tuple, list)) else (model.config.patch_size_t, patch, patch)
    return tuple(int(n) // int(p) for n, p in zip(latents.shape[2:], patch))


def _no_tables(seam, *args, **kwargs):
    raise NotImplementedError("this family has no tier-1 tables (its seam is built by make_seam)")


@dataclass(frozen=True)
class Family:
    """One diffusers transformer family (see the module docstring).

    Args:
        name: registry name (``"flux2"``).
        classes: the covered transformer classes, as ``"module:Class"`` (imported lazily; missing ones are
            skipped) or as classes.
        position_attr: attribute of the model holding its position module (the seam).
        latent_grid: video families: ``latent_grid(model, args, kwargs) -> (frames, rows, cols)``, the forward's video
            token grid read from its inputs (tokens in frame-major, then row-major order; ``latent_video_grid`` for
            latents ``[B, C, F, H, W]``); read by the attention rules (:mod:`..attention_rules`, where the family's
            processors take them: :attr:`takes_attention_rules`) and the camera adapters (``camera``); ``None``:
            neither.
        rule_processor: families whose processors are stock (tier 1): ``rule_processor(layer) -> PEProcessor``,
            the stock self-attention (``attention_modules``) with its video attention through the processors'
            ``_attend``, installed by ``set_attention_rule`` (tier 2 families' own processors take the rule); image
            families: ``rule_processor(stock, layer)``, their joint text+image attention through ``_rotate_attend``.
        bundle_tables: the image families HRDiT's SPA reaches (:class:`~..attention_rules.BundleRule`):
            ``bundle_tables(model, args, kwargs, bundle) -> tables(layer)``, where ``bundle(grid [L, 2]) -> [[L, 2],
            ...]`` gives SPA's grids of 0-based integer (row, column) indices and ``tables(layer)`` the rotary tables
            of that layer's attention, one per grid, in the format its processor rotates with (the text tokens'
            positions kept), or ``None`` where the layer has no image tokens; ``None``: SPA is refused.
        rotary_input: the pipeline builds the tables and passes them to the forward (a
            :class:`~.rotary_input.RotaryInput`; CogVideoX): the seam is added at ``position_attr`` and a pre-forward
            hook replaces that argument (:mod:`.rotary_input`).
        seam_options: tier 1: the family's own ``set_pe`` options, name -> allowed values (the first is the default,
            the stock behaviour), set on the seam as attributes (Cosmos: ``fps_modulation``).
        companion_attrs: further position modules of the model that the seam replaces too, each by
            ``seam.companions[attr]`` (LTX-2's audio rope); :func:`~..restore` puts the stock ones back.
        axis_names: the coordinate axes the seam gives each token.
        native_axes_dims / native_theta: the model's rotary channels per axis and base.
        image_axes: indices of the image (row, col) axes; ``time_axis``: of the time axis, or ``None``.
        tables: tier 1: ``tables(seam, *stock_args, **stock_kwargs)`` -> the stock module's output.
        timestep_per_sigma: what the pipelines pass as ``timestep`` per unit of sigma (negative where the model's
            time runs backwards: Z-Image and Lumina 2 get ``1 - sigma``).
        timestep_at_zero_sigma: the ``timestep`` the pipelines pass at sigma 0 (``1.0`` for ``1 - sigma``).
        timestep_arg: the forward argument carrying the timestep (and its position in ``args``).
        tier: 1 or 2; tier 2 also sets ``attention_modules``, ``stock_processor`` and ``make_processors``
            (a tier-1 family with an edit adapter sets ``attention_modules`` too: the edit installs there).
        make_seam: tier 2 (and families with their own seam): ``make_seam(model, stock, encodings, native,
            coord_axes) -> nn.Module``; default: a :class:`SpectrumSeam`.
        cast_probe: tier 1, a stock module whose tables follow the model's casts: the name of its float buffer the
            seam's tables take their dtype from (the seam is then a :class:`CastFollowingSeam`).
        check_inputs: optional ``check_inputs(seam, args, kwargs)`` run before each forward.
        tables_key: tier 1: optional ``tables_key(seam, *stock_args, **stock_kwargs)``: what ``tables`` reads of the
            stock call, compared with ``==`` (Cosmos: the latents' shape, not their values; :func:`ids_values_key`: ids
            the model rebuilds every forward, by value); default: every argument, tensors by identity and version
            (:func:`~..positions.identity_key`). The seam rebuilds its tables when it changes.
        global_coords: optional ``global_coords(seam, args, kwargs) -> coords [S, A]``: the whole sequence's coordinates
            as the seam would receive them in one process, read from the forward's inputs before a
            context-parallel plan shards them (scheduled encodings measure their extents there,
            :mod:`..global_extents`); ``None`` where the seam's inputs are never sharded.
        image_extents: optional ``image_extents(args, kwargs) -> [A] | None``: the output image's extent per axis,
            read from a forward's inputs before the blocks: a tier-1 seam's schedule is resolved there, eagerly, into
            the tensors a ``torch.compile`` graph reads (:meth:`SpectrumSeam.published_tables`).
        pipelines: pipeline class names of the family (docs and ``mmpos generate``).
        train_size: the 1:1 training size in pixels; ``pixels_per_token``: latent patch size in pixels.
        notes: what is special (the README table).
        composes_with: tier 2: ``composes_with() -> classes``: processors other than the stock one that the family's
            mmpos processors carry (FLUX.1: diffusers' IP-Adapter processor); ``set_pe`` keeps their extra term.
        rebind_processor: tier 2: ``rebind_processor(installed, new) -> processor | None``: a loader replaced the mmpos
            processor ``installed`` of a layer by ``new`` (``load_ip_adapter`` / ``unload_ip_adapter`` after
            ``set_pe``); the family's mmpos processor carrying ``new`` (which ``restore`` then puts back), or ``None``
            where the swap is refused (:meth:`~..installer.ProcessorInstaller.check_processors`).
        context_parallel: the family's seam is verified under diffusers' context-parallel plan (a 2-process test
            equals one process, ``tests/integrations/test_context_parallel.py``); ``False``: a forward with mmpos
            installed under ``enable_parallelism`` is refused by name (:mod:`..parallelism`).
        camera: where the camera adapters act (:class:`CameraSite`, with ``latent_grid``); ``None``: the family takes
            none.
        extras: the family's own switches: ``"allocation"`` (``"interleaved"``: MRoPE-I models),
            ``"image_coords_per_token"`` (image ids stepping by less than 1 a token), ``"check_extrapolation"``
            (``check(extrapolation)`` run by ``set_pe`` before the encoding is built: Mochi refuses RIFLEx).
    """

    name: str
    classes: tuple
    position_attr: str
    axis_names: tuple[str, ...]
    native_axes_dims: Callable[[nn.Module], tuple[int, ...]]
    native_theta: Callable[[nn.Module], float]
    image_axes: tuple[int, ...] = (1, 2)
    time_axis: Optional[int] = None
    tables: Callable = _no_tables
    timestep_per_sigma: float = 1.0
    timestep_at_zero_sigma: float = 0.0
    timestep_arg: tuple[str, Optional[int]] = ("timestep", None)
    tier: int = 1
    attention_modules: Optional[Callable[[nn.Module], list]] = None
    stock_processor: Optional[Callable[[], type]] = None
    make_processors: Optional[Callable] = None
    make_seam: Optional[Callable] = None
    cast_probe: Optional[str] = None
    check_model: Optional[Callable] = None
    check_inputs: Optional[Callable] = None
    tables_key: Optional[Callable] = None
    global_coords: Optional[Callable] = None
    image_extents: Optional[Callable] = None
    pipelines: tuple[str, ...] = ()
    train_size: int = 1024
    pixels_per_token: int = 16
    notes: str = ""
    context_parallel: bool = False
    extras: dict = field(default_factory=dict)
    companion_attrs: tuple[str, ...] = ()
    seam_options: dict = field(default_factory=dict)
    composes_with: Optional[Callable[[], tuple]] = None
    rebind_processor: Optional[Callable] = None
    latent_grid: Optional[Callable] = None
    rule_processor: Optional[Callable] = None
    bundle_tables: Optional[Callable] = None
    rotary_input: Optional[object] = None
    camera: Optional[CameraSite] = None

    @property
    def takes_attention_rules(self) -> bool:
        """The video attention rules run on this family: a ``latent_grid`` and processors that take a rule (its own
        tier-2 processors, or ``rule_processor``)."""
        return self.latent_grid is not None and (self.tier == 2 or self.rule_processor is not None)

    @property
    def has_tables(self) -> bool:
        """The family rebuilds its stock tables (``tables``): ``"native"`` keeps the stock processors."""
        return self.tables is not _no_tables

    @property
    def family(self) -> str:  # the name older code reads as ``spec.family``
        return self.name

    def model_classes(self) -> list[type]:
        """The covered classes this diffusers install has."""
        found = []
        for path in self.classes:
            if isinstance(path, type):
                found.append(path)
                continue
            module, name = path.split(":")
            try:
                found.append(getattr(importlib.import_module(module), name))
            except (ImportError, AttributeError):
                continue
        return found

    def head_dim(self, model) -> int:
        return int(model.config.attention_head_dim)

    def num_heads(self, model) -> int:
        return int(model.config.num_attention_heads)

    def sigma(self, args, kwargs) -> Optional[float]:
        """The step's sigma from the forward's timestep: ``(timestep - timestep_at_zero_sigma) / timestep_per_sigma``.
        Per-token timesteps (Wan 2.2 TI2V's ``expand_timesteps``, SANA-WM's per-frame ones) are read from the noisy
        tokens (the largest sigma of the first sample), not from the first token, which may be a pinned clean frame."""
        name, index = self.timestep_arg
        timestep = kwargs.get(name, args[index] if index is not None and len(args) > index else None)
        if not isinstance(timestep, torch.Tensor) or not timestep.numel():
            return None
        first = timestep.reshape(timestep.shape[0], -1)[0] if timestep.dim() >= 2 else timestep.flatten()[:1]
        noisiest = first.max() if self.timestep_per_sigma > 0 else first.min()  # time running backwards: the least
        return (float(noisiest) - self.timestep_at_zero_sigma) / self.timestep_per_sigma


class SpectrumSeam(PositionSeam):
    """Tier 1: replaces a family's position module; the family's ``tables`` rebuild the stock output.

    Args:
        family: the :class:`Family`.
        encoding: the ``rope_axial`` encoding holding the native spectrum, its extrapolation and its step.
        stock: the stock position module (kept for :func:`~mmpos.integrations.diffusers.restore` and for
            families that read its buffers' device or dtype).
    """

    def __init__(self, family: Family, encoding: nn.Module, stock, axes_dims: Sequence[int], theta: float):
        super().__init__([encoding], native=True, coord_axes=None)
        self.family = family
        self.axes_dims = tuple(int(d) for d in axes_dims)
        self.theta = float(theta)
        self.stock = [stock]  # a list: not registered as a submodule (restore puts it back)
        self._plain = chunked_spectrum(self.axes_dims, self.theta)
        self._resolved: dict = {}
        self._recent: list = []  # (call key, output), newest first
        self._training: Optional[list] = None  # training_spectra(), kept for a compiled graph

    def forward(self, *args, **kwargs):
        """The stock module's output for the stock call; rebuilt only when the inputs (the same tensors, unchanged,
        as pipelines pass them at every step) or the step's sigma change."""
        self.count_forward()
        key = self._call_key(args, kwargs)
        if key is None:  # tracing: no cache (dynamo would guard on its length) and no count
            return self.family.tables(self, *args, **kwargs)
        for seen, out in self._recent:
            if seen == key:
                return out
        self.table_builds += 1
        out = self.family.tables(self, *args, **kwargs)
        self._recent = [(key, out)] + self._recent[:3]  # a few: some models call the seam twice per forward (FLUX.2)
        return out

    def _call_key(self, args, kwargs):
        """Identity of a call: each tensor by object and version (no device sync), other values by equality (or the
        family's :attr:`~Family.tables_key`), the dtypes the tables follow and the step's sigma; ``None`` while
        tracing (no cache under torch.compile)."""
        if torch.compiler.is_compiling():
            return None
        (encoding,) = self.encodings
        if self.family.tables_key is not None:
            call = self.family.tables_key(self, *args, **kwargs)
        else:
            call = [identity_key(a) for a in args], [(k, identity_key(v)) for k, v in sorted(kwargs.items())]
        probe = getattr(self, "native_dtype_probe", None)  # a CastFollowingSeam's tables follow the model's casts
        dtypes = self.activation_dtype, None if probe is None else (probe.dtype, probe.device)
        return call, dtypes, encoding.step.sigma, encoding.step.extents

    @property
    def scheduled(self) -> bool:
        """The spectrum follows a schedule (it needs the image tokens' extent, read with a device sync)."""
        return self.encodings[0].schedule is not None

    def axis_spectra(self, image_coords: Optional[torch.Tensor] = None, extents=None) -> list[AxisSpectrum]:
        """Per axis, the frequencies of this forward: the schedule (if any) resolved at the image tokens' extent
        (``image_coords [S, A]``, or ``extents`` per axis, or a function returning them: called only with a
        schedule, so an unscheduled seam reads no extent and compiles in one graph) and the step's sigma;
        :data:`STOCK` where they equal the training spectrum."""
        (encoding,) = self.encodings
        schedule = encoding.schedule
        if schedule is None:
            key = None
            spectrum = encoding.spectrum
        else:
            if callable(extents):
                extents = extents()
            if extents is None:
                extents = extents_of(image_coords) if image_coords is not None else [0.0] * len(self.axes_dims)
            key = schedule.policies(extents, encoding.step.sigma)
            spectrum = schedule.spectrum(key)
        return self.split_once(key, spectrum)

    def split_once(self, key, spectrum) -> list[AxisSpectrum]:
        """``spectrum`` per axis, split once per resolved ``key``; recorded as the encoding's current spectrum."""
        cached = self._resolved.get(key)
        if cached is None or cached[0] is not spectrum:
            cached = (spectrum, self._split(spectrum))
            if len(self._resolved) > 64:
                self._resolved.clear()
            self._resolved[key] = cached
        self.encodings[0].spectrum = spectrum
        return cached[1]

    def publish_image_extents(self, extents: Sequence[float]) -> object:
        """Set ``extents`` (the output image's, per axis) on the encoding's step for this forward and publish the
        spectrum resolved there (:meth:`~mmpos.encodings.rope_axial.AxialRoPE.publish_schedule`; eager, before the
        blocks); returns the state to put back with ``step.restore_extents``."""
        (encoding,) = self.encodings
        previous = encoding.step.swap_extents([float(e) for e in extents])
        encoding.publish_schedule()
        if self._training is None:
            self._training = self.training_spectra()
        return previous

    def published_tables(self, image_coords: torch.Tensor, build: Callable):
        """While ``torch.compile`` traces a scheduled seam: ``build(spectra)`` with the spectrum the hooks published
        (:meth:`publish_image_extents`) where this call's ``image_coords [S, 2]`` span more than one row or column,
        else with the training spectrum (captions, text: what the eager tables give them), selected in the graph.
        ``build`` returns a tensor or a tuple of tensors."""
        (encoding,) = self.encodings
        if not encoding.published or self._training is None:
            raise RuntimeError(
                f"{self.family.name}: a scheduled encoding (DyPE) under torch.compile reads the spectrum the model's "
                "hooks resolve before the blocks; this forward's inputs gave no image extents (Family.image_extents)"
            )
        image = build(self._published_split(encoding.compiled_spectrum))
        training = build(self._training)
        spans = (image_coords.amax(dim=0) - image_coords.amin(dim=0) > 0).any() if image_coords.shape[0] else False
        if isinstance(image, tuple):
            return tuple(torch.where(spans, i, t) for i, t in zip(image, training))
        return torch.where(spans, image, training)

    def _published_split(self, spectrum) -> list[AxisSpectrum]:
        """``spectrum`` per axis with tensor magnitudes (no host reads: traced into the graph)."""
        out, start = [], 0
        for dim in self.axes_dims:
            stop = start + dim // 2
            out.append(AxisSpectrum(spectrum.inv_freq[start:stop], spectrum.magnitude[start]))
            start = stop
        return out

    def training_spectra(self) -> list[AxisSpectrum]:
        """The spectrum of text and other non-image tokens: the stock ladder on every axis, except a
        ``pair_scale`` or changed ``theta``, which apply to every token."""
        (encoding,) = self.encodings
        if encoding.schedule is None:
            return self.axis_spectra()
        return self._split(encoding.schedule.spectrum(encoding.schedule.policies([0.0] * len(self.axes_dims), None)))

    def _split(self, spectrum) -> list[AxisSpectrum]:
        out, start = [], 0
        for dim in self.axes_dims:
            stop = start + dim // 2
            inv, mag = spectrum.inv_freq[start:stop], spectrum.magnitude[start:stop]
            if not bool((mag == mag[0]).all()):
                raise ValueError(
                    "a per-pair magnitude inside one axis (pair_scale) is not supported by the stock "
                    "processors of a tier-1 family; use a tier-2 family"
                )
            magnitude = float(mag[0])
            same = torch.equal(inv, self._plain.inv_freq[start:stop])
            out.append(AxisSpectrum(None if same else inv.clone(), magnitude))
            start = stop
        return out

    def extra_repr(self) -> str:
        return f"family={self.family.name}, axes_dims={self.axes_dims}, theta={self.theta}"


class CastFollowingSeam(SpectrumSeam):
    """A :class:`SpectrumSeam` for a stock module whose tables follow the model's casts (float buffers that
    ``model.to(dtype)`` converts): the buffer ``native_dtype_probe`` (a scalar) takes the dtype and device of the stock
    buffer named ``probe`` and follows the model's later ``.to()`` calls, so tables can be built in the dtype the
    stock buffers would have now, and :func:`~mmpos.integrations.diffusers.restore` moves the stock module to it."""

    def __init__(self, family: Family, encoding: nn.Module, stock, axes_dims: Sequence[int], theta: float, probe: str):
        super().__init__(family, encoding, stock, axes_dims, theta)
        buffer = getattr(stock, probe, None)
        dtype, device = (buffer.dtype, buffer.device) if buffer is not None else (torch.float32, None)
        self.register_buffer("native_dtype_probe", torch.zeros((), dtype=dtype, device=device), persistent=False)


def ids_values_key(seam, *args, **kwargs):
    """A :attr:`Family.tables_key` for position ids the model builds afresh every forward (``torch.cat`` of the text
    and image ids): the arguments by value on the CPU (:func:`~..positions.values_key`), and the seam's text-token
    count (``seam.text_tokens``, set by the pre-forward hook where the family splits text from image rows)."""
    return (
        [values_key(a) for a in args],
        [(k, values_key(v)) for k, v in sorted(kwargs.items())],
        getattr(seam, "text_tokens", None),
    )


def extents_of(coords: torch.Tensor) -> list[float]:
    """``max - min + 1`` per axis of ``coords [..., S, A]`` (one device sync)."""
    flat = coords.reshape(-1, coords.shape[-1]).double()
    return ((flat.amax(dim=0) - flat.amin(dim=0)) + 1).tolist()
