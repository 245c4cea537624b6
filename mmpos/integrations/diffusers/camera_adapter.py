"""Camera adapters on a diffusers video transformer's self-attention, installed at the installer's ``camera`` level
(:mod:`.installer`), saved and loaded like diffusers models (safetensors + ``config.json``).

Written once against the family: a family takes camera adapters where it declares a
:class:`~.families.base.CameraSite` (``Family.camera``): its self-attention layers over the video tokens
(``Family.attention_modules``), the forward's video token grid (``Family.latent_grid``, which the attention rules read
too), and which item of the layers' output the residual joins.
Wan, HunyuanVideo 1.5, LTX-2 (video self-attention only: the audio stream is untouched), SkyReels-V2 and Cosmos / Anima
declare one (:func:`camera_families`).

The kinds are the registered camera encodings with ``capabilities.adapter`` (:func:`adapter_kinds`); each builds
its own layers (``pe_class(kind).adapter_layer(...)``), so a new camera encoding needs no change here:

=========  ==========================================================================================
kind       what every self-attention layer gets
=========  ==========================================================================================
``ucpe``   a parallel attention branch (UCPE): relative ray encoding on q, k, v and the output, the
           latitude/up map added to its input, zero-initialised output projection (:class:`UCPEAdapter`)
``prope``  the same branch with PRoPE's per-camera projective frames (pinhole intrinsics), no map
``plucker``  CameraCtrl-style: ``Linear(6, dim)`` of the tokens' Plücker rays, zero-initialised, added to
           the attention's input
=========  ==========================================================================================

A layer follows one protocol: ``state = layer.condition(cameras)`` once per call (layer 0's state is shared),
then per layer ``layer.input_delta(x, state)`` (added to the host attention's input) and ``layer.residual(x,
state)`` (added to its output), each ``None`` or ``[B, L, dim]``. At zero initialisation every kind adds exact
zeros: the transformer's output is bit-identical to stock.

    adapter = CameraAdapter.for_transformer(transformer, "ucpe")
    with camera_conditioning(transformer, adapter, video_cameras(traj, grid, (480, 832))):
        noise = transformer(latents, timestep, text)        # every layer shares one geometry
"""

from __future__ import annotations

import inspect
import threading
from contextlib import contextmanager

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from ..._per_thread import PerThread
from ...camera.cameras import Cameras
from ...camera.video import CameraInput, VideoCameras, video_cameras
from ...encodings.registry import list_pes, pe_capabilities, pe_class
from .context_parallel import shard_sequence
from .families import FAMILIES, family_for, list_families
from .families.base import Family
from .installer import CAMERA, ProcessorInstaller
from .parallelism import check_parallelism, is_parallel

__all__ = [
    "ADAPTER_KINDS",
    "CameraAdapter",
    "CameraCalls",
    "CameraConditioning",
    "adapter_kinds",
    "camera_conditioning",
    "camera_families",
    "camera_family",
    "install_camera_adapter",
    "placed_like",
    "remove_camera_adapter",
    "without_camera",
]


def adapter_kinds() -> tuple[str, ...]:
    """The registered camera encodings that build a camera adapter (``capabilities.adapter``), sorted."""
    return tuple(name for name in list_pes("camera") if pe_capabilities(name).adapter)


ADAPTER_KINDS = adapter_kinds()  # at import (argparse choices); adapter_kinds() also sees later registrations


def camera_families() -> list[str]:
    """The registered families that take camera adapters (a :class:`~.families.base.CameraSite`), sorted."""
    list_families()
    return sorted(name for name, family in FAMILIES.items() if family.camera is not None)


def camera_family(transformer) -> Family:
    """``transformer``'s family, which must declare where camera adapters act; a ValueError naming the others."""
    family = family_for(transformer)
    if family.camera is None:
        raise ValueError(
            f"the {family.name!r} family ({type(transformer).__name__}) takes no camera adapter; the families that do: "
            f"{camera_families()}"
        )
    return family


class CameraAdapter(ModelMixin, ConfigMixin):
    """One camera module per self-attention layer of a ``num_layers``-block transformer of width ``dim``.

    Args:
        kind: one of :func:`adapter_kinds` (``"plucker"``, ``"prope"``, ``"ucpe"``; see the module docstring).
        dim, num_layers: the host transformer's width and block count.
        num_heads, head_dim: of the attention branch (``ucpe``/``prope``; UCPE on Wan-1.3B: 1 x 192).
        use_orientation: ``ucpe``: add ``Linear(3, dim)`` of the latitude/up map to the branch input.
        rope_theta: base of the branch's 2D RoPE; qkv_bias: biases of its q, k, v projections.
        ray_offset: where each patch's ray passes (patch units from its top-left corner): ``(0.5, 0.5)`` the
            centre; ``(0, 0)`` for UCPE's released weights, whose rays start at integer grid indices.
    """

    @register_to_config
    def __init__(
        self,
        kind: str = "ucpe",
        dim: int = 1536,
        num_layers: int = 30,
        num_heads: int = 1,
        head_dim: int = 192,
        use_orientation: bool = True,
        rope_theta: float = 100.0,
        qkv_bias: bool = True,
        ray_offset: tuple = (0.5, 0.5),
    ):
        super().__init__()
        kinds = adapter_kinds()
        if kind not in kinds:
            raise ValueError(f"kind={kind!r} is not a camera adapter; expected one of {kinds}")
        build = pe_class(kind).adapter_layer
        self.layers = nn.ModuleList(
            build(dim, num_heads, head_dim, use_orientation=use_orientation, rope_theta=rope_theta, qkv_bias=qkv_bias)
            for _ in range(num_layers)
        )

    @classmethod
    def for_transformer(cls, transformer, kind: str = "ucpe", compress: int = 8, **options) -> "CameraAdapter":
        """An adapter sized for ``transformer`` (of a family in :func:`camera_families`): one layer per self-attention
        layer of its family's camera site; UCPE's ``attn_compress``: heads ``max(1, heads // compress)`` with
        ``head_dim`` the inner width ``dim // compress`` per head, rounded down to a multiple of 8 (at least 8);
        ``options`` override any config entry."""
        family = camera_family(transformer)
        num_heads = family.num_heads(transformer)
        dim = num_heads * family.head_dim(transformer)
        heads = max(1, num_heads // compress)
        head_dim = max(8, (dim // compress // heads) // 8 * 8)
        layers = len(family.attention_modules(transformer))
        sizes = dict(dim=dim, num_layers=layers, num_heads=heads, head_dim=head_dim)
        return placed_like(cls(kind=kind, **{**sizes, **options}), transformer)

    def conditioning(self, cameras: Cameras | VideoCameras | CameraInput, scale: float = 1.0) -> "CameraConditioning":
        """The per-call state every layer reads: built once from ``cameras`` (a :class:`~mmpos.camera.Cameras`, or
        the :class:`~mmpos.camera.VideoCameras` of :func:`~mmpos.camera.video_cameras`), or, from a camera path (a
        :class:`~mmpos.camera.Trajectory`, :class:`~mmpos.camera.video.CameraPath` or ``(c2w, model)``), at each
        forward on the grid of its video tokens (:class:`CameraPathConditioning`)."""
        if isinstance(cameras, VideoCameras):
            cameras = cameras.cameras
        if isinstance(cameras, Cameras):
            tokens = cameras.num_cameras * cameras.grid[0] * cameras.grid[1]
            return CameraConditioning(self, scale, self.layers[0].condition(cameras), tokens)
        return CameraPathConditioning(self, cameras, scale)


def placed_like(adapter: CameraAdapter, transformer) -> CameraAdapter:
    """``adapter`` on ``transformer``'s device and in its dtype (cast only when they differ)."""
    adapter = adapter.to(transformer.device)
    return adapter if adapter.dtype == transformer.dtype else adapter.to(dtype=transformer.dtype)


class CameraConditioning:
    """What one call conditions on: the adapter, ``scale`` (``camera_scale``) and ``state``, what the adapter's
    layers' ``condition(cameras)`` built once for all layers, for ``num_tokens`` video tokens (``None``: unchecked)."""

    def __init__(self, adapter: CameraAdapter, scale: float = 1.0, state=None, num_tokens: int | None = None):
        self.adapter, self.scale, self.state, self.num_tokens = adapter, float(scale), state, num_tokens
        self._shards: list = []  # (parallel config, this rank's conditioning), one per config seen

    def for_forward(self, transformer, args, kwargs) -> None:
        """Before a forward: the cameras must cover its video tokens (its family's grid); a ValueError otherwise."""
        if self.num_tokens is None:
            return
        grid = camera_family(transformer).latent_grid(transformer, args, kwargs)
        if self.num_tokens != grid[0] * grid[1] * grid[2]:
            raise ValueError(
                f"cameras: they cover {self.num_tokens} video tokens; this forward has {grid[0]} x {grid[1]} x "
                f"{grid[2]} (frames x rows x cols); build them on that grid (video_cameras), or pass the camera path"
            )

    def sharded(self, parallel_config) -> "CameraConditioning":
        """This rank's part under diffusers' context parallelism: the per-token state ``[B, L, ...]`` cut along the
        tokens as the plan cuts the hidden states (once per call, shared by the layers); refused for kinds whose
        conditioning is not per token (:func:`check_shardable`)."""
        for config, shard in self._shards:
            if config is parallel_config:
                return shard
        check_shardable(self.adapter)
        if not isinstance(self.state, torch.Tensor) or self.state.dim() < 2:
            raise RuntimeError(f"the {self.adapter.config.kind!r} conditioning is not a per-token [B, L, ...] tensor")
        shard = CameraConditioning(self.adapter, self.scale, shard_sequence(self.state, 1, parallel_config))
        self._shards.append((parallel_config, shard))
        return shard

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.scale == 1.0 else x * self.scale

    def attention_input(self, layer: int, hidden_states: torch.Tensor) -> torch.Tensor:
        """The hidden states plus the layer's ``input_delta`` (``plucker``: its projection of the rays)."""
        delta = self.adapter.layers[layer].input_delta(hidden_states, self.state)
        return hidden_states if delta is None else hidden_states + self._scaled(delta)

    def residual(self, layer: int, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """The layer's ``residual`` ``[B, L, dim]`` to add to the attention output (``ucpe``/``prope``: the branch)."""
        residual = self.adapter.layers[layer].residual(hidden_states, self.state)
        return None if residual is None else self._scaled(residual)


class CameraPathConditioning(CameraConditioning):
    """A camera path (any length) put on each forward's video token grid: its family's ``latent_grid`` reads the
    grid ``(frames, rows, cols)`` from the forward's inputs, the path is
    resampled to the latent frames and imaged at ``rows x cols`` patches of ``pixels_per_token`` pixels
    (:func:`~mmpos.camera.video_cameras`, rays at the adapter's ``ray_offset``, fp64 for an fp64 model, else fp32),
    once per grid."""

    def __init__(self, adapter: CameraAdapter, camera: CameraInput, scale: float = 1.0):
        super().__init__(adapter, scale)
        self.camera, self.grid = camera, None

    def for_forward(self, transformer, args, kwargs) -> None:
        family = camera_family(transformer)
        grid = tuple(int(n) for n in family.latent_grid(transformer, args, kwargs))
        if grid == self.grid:
            return
        pixels = family.pixels_per_token
        dtype = torch.float64 if transformer.dtype == torch.float64 else torch.float32
        offset = tuple(self.adapter.config.ray_offset)
        image_size = (grid[1] * pixels, grid[2] * pixels)
        cameras = video_cameras(self.camera, grid, image_size, dtype, transformer.device, offset)
        self.state, self.grid, self._shards = self.adapter.layers[0].condition(cameras.cameras), grid, []


class CameraAttnProcessor:
    """The ``camera`` level of one self-attention layer: runs the level beneath with the camera added.

    ``conditioning`` is a :class:`CameraConditioning`, or a :class:`CameraCalls` whose calling thread's
    conditioning is read per call (``None``: the level beneath runs unchanged).

    ``_parallel_config`` is the attribute diffusers' ``enable_parallelism`` sets on the processors it finds; under
    context parallelism (this level's or the level beneath's config set) the conditioning is cut to this rank's
    tokens (:meth:`CameraConditioning.sharded`: per-token kinds) or the call is refused.

    The call takes what the stock processor takes (diffusers' attention modules pass a processor only the keywords
    its signature names: :func:`camera_processor` gives each stock processor class a subclass with its signature);
    ``output_index``: the item of a tuple output the residual joins (``None``: the output is the tensor).
    """

    _parallel_config = None

    def __init__(self, conditioning, layer: int, slot, output_index: int | None = None):
        self.conditioning, self.layer, self.slot, self.output_index = conditioning, layer, slot, output_index

    def __call__(self, attn, hidden_states: torch.Tensor, *args, **kwargs):
        beneath = self.slot.below(CAMERA)
        conditioning = self.conditioning
        if isinstance(conditioning, CameraCalls):
            conditioning = conditioning.current()
            if conditioning is None:
                return beneath(attn, hidden_states, *args, **kwargs)
        parallel = self._parallel_config
        parallel = getattr(beneath, "_parallel_config", None) if parallel is None else parallel
        if parallel is not None:
            conditioning = conditioning.sharded(parallel)
        attention_input = conditioning.attention_input(self.layer, hidden_states)
        out = beneath(attn, attention_input, *args, **kwargs)
        residual = conditioning.residual(self.layer, hidden_states)
        if residual is None:
            return out
        if self.output_index is None:
            return out + residual
        return type(out)(item + residual if i == self.output_index else item for i, item in enumerate(out))

    def __reduce__(self):  # the class is made per stock processor class (camera_processor)
        return camera_processor, (type(self).stock_class, self.conditioning, self.layer, self.slot, self.output_index)


_PROCESSOR_CLASSES: dict[type, type] = {}


def camera_processor(stock_class: type, conditioning, layer: int, slot, output_index=None) -> CameraAttnProcessor:
    """A :class:`CameraAttnProcessor` whose ``__call__`` has ``stock_class.__call__``'s signature."""
    cls = _PROCESSOR_CLASSES.get(stock_class)
    if cls is None:

        def __call__(self, attn, hidden_states, *args, **kwargs):
            return CameraAttnProcessor.__call__(self, attn, hidden_states, *args, **kwargs)

        __call__.__signature__ = inspect.signature(stock_class.__call__)
        name = f"Camera{stock_class.__name__}"
        cls = type(name, (CameraAttnProcessor,), {"__call__": __call__, "stock_class": stock_class})
        _PROCESSOR_CLASSES[stock_class] = cls
    return cls(conditioning, layer, slot, output_index)


def check_adapter_fits(transformer, adapter: CameraAdapter) -> None:
    """Raise ValueError unless ``adapter`` has one layer per self-attention layer of ``transformer``, of its width (and
    ``transformer``'s family takes camera adapters)."""
    spec = camera_family(transformer)
    count, width = len(spec.attention_modules(transformer)), spec.num_heads(transformer) * spec.head_dim(transformer)
    if (count, width) != (len(adapter.layers), adapter.config.dim):
        raise ValueError(
            f"the adapter has {len(adapter.layers)} layers of width {adapter.config.dim}; the "
            f"transformer has {count} self-attention layers of width {width}"
        )


def check_shardable(adapter: CameraAdapter) -> None:
    """Under diffusers' context parallelism each rank holds a shard of the tokens: a per-token (additive) kind
    (``plucker``) cuts its conditioning with them; a kind with its own attention branch over the whole sequence
    (``ucpe``, ``prope``) is refused."""
    kind = adapter.config.kind
    if not pe_capabilities(kind).additive:
        additive = [name for name in adapter_kinds() if pe_capabilities(name).additive]
        raise RuntimeError(
            f"the {kind!r} camera adapter does not run under diffusers' context parallelism (enable_parallelism): "
            "its attention branch covers the whole sequence while each rank holds a shard of the tokens; use "
            f"{additive} under context parallelism, or run {kind!r} calls on one process per video"
        )


def install_camera_adapter(transformer, conditioning) -> None:
    """Fill the ``camera`` level of ``transformer``'s self-attention layers (one per adapter layer) with
    ``conditioning`` (a :class:`CameraConditioning`, or the :class:`CameraCalls` of concurrent calls)."""
    family = camera_family(transformer)
    check_parallelism(transformer, "a camera adapter", family, camera_only=True)  # set_pe's own checks refuse the rest
    if isinstance(conditioning, CameraConditioning) and is_parallel(transformer):
        check_shardable(conditioning.adapter)  # (a model made parallel later: the processors check each call)
    if isinstance(conditioning, CameraConditioning):
        check_adapter_fits(transformer, conditioning.adapter)
    installer = ProcessorInstaller.of(transformer)
    index = family.camera.output_index
    processors = {
        i: camera_processor(type(slot.original), conditioning, i, slot, index) for i, slot in enumerate(installer.slots)
    }
    installer.fill(CAMERA, processors, hook=_CamerasForForward(conditioning))


class _CamerasForForward:
    """The ``camera`` level's pre-forward hook: the conditioning of this call (:class:`CameraCalls`: the calling
    thread's) checked against, or put on, the forward's video token grid."""

    def __init__(self, conditioning):
        self.conditioning = conditioning

    def __call__(self, module, args, kwargs) -> None:
        conditioning = self.conditioning
        if isinstance(conditioning, CameraCalls):
            conditioning = conditioning.current()
        if conditioning is None:
            return
        family = camera_family(module)
        if is_parallel(module) and not family.context_parallel and family.camera.context_parallel is not None:
            family.camera.context_parallel(module, args, kwargs)  # the inputs its plan shards as verified
        conditioning.for_forward(module, args, kwargs)


def remove_camera_adapter(transformer) -> None:
    """Empty the ``camera`` level: the layers run what they ran before."""
    installer = ProcessorInstaller.find(transformer)
    if installer is not None:
        installer.clear(transformer, CAMERA)


class CameraCalls:
    """The camera calls running on one transformer, each in its own thread (one model serving requests).

    The ``camera`` level is filled once while any call runs and emptied after the last; each layer reads the
    calling thread's conditioning (:class:`~mmpos._per_thread.PerThread`), so a call without a camera
    (:meth:`without_camera`) runs the level beneath unchanged while another thread's camera call runs. A thread
    that entered no call (autograd's, recomputing a checkpointed block) reads the latest call's conditioning.
    """

    _lock = threading.Lock()  # guards the count and the level of every transformer

    def __init__(self):
        self._conditioning = PerThread(None)
        self._running = 0

    @classmethod
    def of(cls, transformer) -> "CameraCalls":
        with cls._lock:
            calls = transformer.__dict__.get("_mmpos_camera_calls")
            if calls is None:
                calls = transformer.__dict__["_mmpos_camera_calls"] = cls()
            return calls

    def current(self) -> CameraConditioning | None:
        return self._conditioning.get()

    @contextmanager
    def running(self, transformer, conditioning: CameraConditioning | None):
        """``conditioning`` (``None``: no camera) for this thread's call on ``transformer``."""
        if conditioning is not None:
            check_adapter_fits(transformer, conditioning.adapter)
            if is_parallel(transformer):
                check_shardable(conditioning.adapter)
            with self._lock:
                if self._running == 0:
                    install_camera_adapter(transformer, self)
                self._running += 1
        previous = self._conditioning.swap(conditioning, latest=conditioning is not None)
        try:
            yield conditioning
        finally:
            self._conditioning.restore(previous)
            if conditioning is not None:
                with self._lock:
                    self._running -= 1
                    if self._running == 0:
                        remove_camera_adapter(transformer)

    def __getstate__(self):  # a copied transformer has no calls running
        return {}

    def __setstate__(self, state):
        self.__init__()


@contextmanager
def camera_conditioning(
    transformer, adapter: CameraAdapter, cameras: Cameras | VideoCameras | CameraInput, scale: float = 1.0
):
    """Install ``adapter`` conditioned on ``cameras`` for the duration of the block, even if it raises; calls in
    other threads on the same transformer keep their own cameras (or none, :func:`without_camera`). ``cameras``: built
    on the video token grid, or a camera path put on each forward's grid (:meth:`CameraAdapter.conditioning`)."""
    with CameraCalls.of(transformer).running(transformer, adapter.conditioning(cameras, scale)) as conditioning:
        yield conditioning


def without_camera(transformer):
    """A ``with`` block in which this thread's calls of ``transformer`` get no camera, while other threads' camera
    calls run."""
    return CameraCalls.of(transformer).running(transformer, None)
