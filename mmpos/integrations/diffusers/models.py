"""What mmpos needs to know about each supported diffusers transformer.

A :class:`ModelSpec` names the model's position module (the seam mmpos replaces), the coordinate axes it
gives every token, its native rotary spectrum (head dim, per-axis channels, theta) and the attention
modules whose processors rotate q and k.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    family: str  # "flux" | "wan" | "qwen"
    position_attr: str  # attribute holding the position module: the seam
    axis_names: tuple[str, ...]  # coordinate axes the seam gives each token
    native_axes_dims: Callable[[nn.Module], tuple[int, ...]]
    native_theta: Callable[[nn.Module], float]
    attention_modules: Callable[[nn.Module], list[tuple[str, nn.Module]]]
    stock_processor: Callable[[], type]  # the processor class set_pe may replace without losing anything
    timestep_per_sigma: float = 1.0  # what the pipelines pass as ``timestep`` per unit of sigma

    def head_dim(self, model) -> int:
        return int(model.config.attention_head_dim)

    def num_heads(self, model) -> int:
        return int(model.config.num_attention_heads)


def _flux_attention(model):
    from diffusers.models.transformers.transformer_flux import FluxAttention

    return [(name, m) for name, m in model.named_modules() if isinstance(m, FluxAttention)]


def _flux_processor():
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

    return FluxAttnProcessor


def _wan_processor():
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    return WanAttnProcessor


def _wan_self_attention(model):
    return [(f"blocks.{i}.attn1", block.attn1) for i, block in enumerate(model.blocks)]


def _wan_axes_dims(model):
    rope = model.rope
    return (int(rope.t_dim), int(rope.h_dim), int(rope.w_dim))


FLUX = ModelSpec(
    family="flux",
    position_attr="pos_embed",
    axis_names=("index", "row", "col"),
    native_axes_dims=lambda model: tuple(int(d) for d in model.config.axes_dims_rope),
    native_theta=lambda model: float(model.pos_embed.theta),
    attention_modules=_flux_attention,
    stock_processor=_flux_processor,
    timestep_per_sigma=1.0,  # the Flux pipelines pass t / 1000 = sigma
)

WAN = ModelSpec(
    family="wan",
    position_attr="rope",
    axis_names=("t", "row", "col"),
    native_axes_dims=_wan_axes_dims,
    native_theta=lambda model: 10000.0,  # WanRotaryPosEmbed's default; the model never passes another
    attention_modules=_wan_self_attention,
    stock_processor=_wan_processor,
    timestep_per_sigma=1000.0,  # WanPipeline passes the scheduler's timesteps (sigma * 1000)
)


def _qwen_attention(model):
    return [(f"transformer_blocks.{i}.attn", block.attn) for i, block in enumerate(model.transformer_blocks)]


def _qwen_processor():
    from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

    return QwenDoubleStreamAttnProcessor2_0


QWEN = ModelSpec(
    family="qwen",
    position_attr="pos_embed",
    axis_names=("frame", "row", "col"),  # rows and columns centred on the image, see .qwen
    native_axes_dims=lambda model: tuple(int(d) for d in model.config.axes_dims_rope),
    native_theta=lambda model: float(model.pos_embed.theta),
    attention_modules=_qwen_attention,
    stock_processor=_qwen_processor,
    timestep_per_sigma=1.0,  # QwenImagePipeline passes t / 1000 = sigma
)


def supported_classes() -> dict[type, ModelSpec]:
    from diffusers import FluxTransformer2DModel, QwenImageTransformer2DModel, WanTransformer3DModel

    return {FluxTransformer2DModel: FLUX, WanTransformer3DModel: WAN, QwenImageTransformer2DModel: QWEN}


def spec_for(model) -> ModelSpec:
    """The spec of ``model``'s class (exact class or a subclass); a clear error for anything else."""
    classes = supported_classes()
    for cls, spec in classes.items():
        if isinstance(model, cls):
            return spec
    names = ", ".join(c.__name__ for c in classes)
    raise TypeError(f"set_pe supports {names}; got {type(model).__name__}. "
                    "Other diffusers transformers build their RoPE differently (see mmpos/integrations/diffusers).")
