"""Switch the language-model RoPE of a transformers Qwen2-VL / Qwen2.5-VL / Qwen3-VL model, and restore it.

    from mmpos.integrations.transformers_vlm import use_multimodal_rope
    patch = use_multimodal_rope(model, "mrope_interleave", spatial_reset=True)   # or "mrope", "mhrope", "vrope"
    logits = model(**inputs).logits        # generate() works too: decoding continues from rope_deltas
    patch.restore()                        # or: with use_multimodal_rope(...): ...

No modelling code is copied; three seams of the host are swapped:

1. the VLM's ``get_rope_index`` (an instance attribute shadows the method) builds ``(3, B, L)`` position ids
   with :func:`mmpos.coords.multimodal.multimodal_position_ids` (VRoPE: its variants ``v0, v1, v2``; the
   fourth is ``v1 + v2 - v0``, so transformers' ``rope_deltas`` decoding stays valid);
2. ``language_model.rotary_emb`` becomes :class:`MultimodalRotaryEmbedding`, which reads the host's own
   ``inv_freq`` and ``attention_scaling`` (one source of truth) and forms phases with the host's fp32
   arithmetic, so text-only inputs give bit-identical logits;
3. MHRoPE only: the modelling module's ``apply_rotary_pos_emb`` is wrapped to accept per-head cos/sin
   ``(B, H_kv, L, D)`` (query head g uses KV head ``g // group``); 3-D cos/sin still go to the original.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
from torch import nn

from .._validation import check_choice
from ..coords.multimodal import IMAGE, TEXT, VIDEO, multimodal_position_ids
from ..spectrum.multimodal import (
    NOPE_HEAD,
    check_mrope_section,
    cyclic_axis_of_pair,
    default_head_section,
    default_mrope_section,
    head_axis_map,
    section_axis_of_pair,
)

ENCODINGS = ("mrope", "mrope_interleave", "mhrope", "vrope")
HOSTS = {  # model_type: (split_video_frames, uses tokens_per_second)
    "qwen2_vl": (False, False),
    "qwen2_5_vl": (False, True),
    "qwen3_vl": (True, False),
    "qwen3_vl_moe": (True, False),
}
_PATCH_ATTR = "_mmpos_rope_patch"
_APPLY_PATCHES: dict = {}  # modelling module -> [original apply_rotary_pos_emb, number of patched models]


class MultimodalRotaryEmbedding(nn.Module):
    """Drop-in for a Qwen-VL ``rotary_emb``: ``cos, sin = module(x, position_ids)`` with ids ``(3, B, L)``.

    Per pair ``f`` (``axis_of_pair``) or per KV head (``head_axis``, MHRoPE: cos/sin ``(B, H_kv, L, D)``) it
    picks one id row; VRoPE (``vrope=True``) first appends the fourth variant ``v1 + v2 - v0``.
    """

    def __init__(
        self,
        host: nn.Module,
        axis_of_pair: torch.Tensor | None = None,
        head_axis: torch.Tensor | None = None,
        vrope: bool = False,
    ):
        super().__init__()
        if (axis_of_pair is None) == (head_axis is None):
            raise ValueError("pass exactly one of axis_of_pair (per-pair allocation) or head_axis (MHRoPE)")
        self.host = host  # a submodule, so model.to(device) moves it; its buffers are not persistent
        self.vrope = vrope
        self.register_buffer("axis_of_pair", axis_of_pair, persistent=False)
        self.register_buffer("head_axis", head_axis, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        if position_ids.dim() != 3 or position_ids.shape[0] not in (1, 3):
            raise ValueError(f"position_ids must be (3, B, L) (or (1, B, L)), got {tuple(position_ids.shape)}")
        rows = position_ids.expand(3, -1, -1)
        if self.vrope:
            rows = torch.cat([rows, (rows[1] + rows[2] - rows[0]).unsqueeze(0)])
        inv_freq = self.host.inv_freq.to(device=x.device, dtype=torch.float)
        with torch.autocast(x.device.type, enabled=False):
            if self.head_axis is None:
                freqs = rows[self.axis_of_pair].permute(1, 2, 0).float() * inv_freq  # (B, L, F)
            else:
                per_head = rows[self.head_axis.clamp_min(0)].transpose(0, 1)  # (B, H_kv, L)
                freqs = per_head[..., None].float() * inv_freq
                freqs = freqs.masked_fill((self.head_axis == NOPE_HEAD)[:, None, None], 0.0)
            cos, sin = freqs.cos() * self.host.attention_scaling, freqs.sin() * self.host.attention_scaling
        return torch.cat([cos, cos], -1).to(x.dtype), torch.cat([sin, sin], -1).to(x.dtype)


@dataclass
class RopePatch:
    """What :func:`use_multimodal_rope` changed; :meth:`restore` puts the host back."""

    vlm: nn.Module
    language_model: nn.Module
    host_rotary: nn.Module
    encoding: str
    apply_module: object = None
    active: bool = field(default=True)

    def restore(self) -> None:
        if not self.active:
            return
        self.language_model.rotary_emb = self.host_rotary
        self.vlm.__dict__.pop("get_rope_index", None)
        self.vlm.__dict__.pop(_PATCH_ATTR, None)
        self.vlm.rope_deltas = None  # cached deltas came from our ids
        if self.apply_module is not None:
            _release_headwise_apply(self.apply_module)
        self.active = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.restore()


def use_multimodal_rope(
    model: nn.Module,
    encoding: str,
    *,
    mrope_section=None,
    head_section=None,
    spatial_reset: bool = False,
    vision_advance: str | None = None,
) -> RopePatch:
    """Switch ``model`` (a Qwen2-VL / Qwen2.5-VL / Qwen3-VL model or its ``ForConditionalGeneration``) to
    ``encoding`` in ``("mrope", "mrope_interleave", "mhrope", "vrope")``.

    Args:
        mrope_section: pairs per axis for the MRoPE family; default the host's own ``mrope_section`` when it
            fits the allocation, else :func:`~mmpos.spectrum.multimodal.default_mrope_section`.
        head_section: MHRoPE KV heads per axis (default ``(H - 2 (3H // 8), 3H // 8, 3H // 8)``).
        spatial_reset: MRoPE family: vision h, w ids restart at 0 per block.
        vision_advance: ``"max"`` or ``"spatial"`` (see :mod:`mmpos.coords.multimodal`); default ``"spatial"``,
            transformers 5.x's own rule, so ``"mrope"`` on Qwen2-VL reproduces the host exactly.
    Needs transformers >= 5 (its ``get_rope_index(input_ids, mm_token_type_ids, ...)`` signature).
    """
    check_choice("encoding", encoding, ENCODINGS)
    if _transformers_major() < 5:
        raise RuntimeError("use_multimodal_rope needs transformers >= 5 (mm_token_type_ids-based get_rope_index)")
    vlm = _find_vlm(model)
    if _PATCH_ATTR in vlm.__dict__:
        raise RuntimeError("this model's RoPE is already switched by mmpos; call .restore() on that patch first")
    language_model = vlm.language_model
    text_config = language_model.config
    host_rotary = language_model.rotary_emb
    rope_type = host_rotary.rope_type
    if "dynamic" in rope_type or "longrope" in rope_type:
        raise ValueError(f"rope_type={rope_type!r} updates inv_freq on the fly; only static ladders are supported")
    num_pairs = host_rotary.inv_freq.numel()
    split_frames, timed = HOSTS[vlm.config.model_type]
    advance = vision_advance or "spatial"

    head_axis = axis_of_pair = None
    if encoding in ("mrope", "mrope_interleave"):
        allocation = "chunked" if encoding == "mrope" else "interleaved"
        section = mrope_section or _host_section(host_rotary, num_pairs, allocation)
        axis_of_pair = section_axis_of_pair(check_mrope_section(section, num_pairs, allocation), allocation)
    elif encoding == "vrope":
        if spatial_reset:
            raise ValueError("spatial_reset applies to the MRoPE family, not to VRoPE")
        axis_of_pair = cyclic_axis_of_pair(num_pairs, 4)
    else:
        num_kv_heads = text_config.num_key_value_heads
        section = head_section or default_head_section(num_kv_heads)
        head_axis = head_axis_map(section, num_kv_heads)
        if text_config.num_attention_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads={text_config.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={num_kv_heads}"
            )

    on_host = lambda t: None if t is None else t.to(host_rotary.inv_freq.device)
    adapter = MultimodalRotaryEmbedding(
        host_rotary, on_host(axis_of_pair), on_host(head_axis), vrope=encoding == "vrope"
    )
    patch = RopePatch(vlm, language_model, host_rotary, encoding)
    if head_axis is not None:
        patch.apply_module = _acquire_headwise_apply(language_model)
    language_model.rotary_emb = adapter
    vlm.get_rope_index = _rope_index_function(
        vlm, "vrope" if encoding == "vrope" else "mrope", spatial_reset, split_frames, timed, advance
    )
    vlm.rope_deltas = None
    vlm.__dict__[_PATCH_ATTR] = patch
    return patch


def _rope_index_function(vlm, design, spatial_reset, split_frames, timed, advance):
    config = vlm.config
    merge = config.vision_config.spatial_merge_size
    tokens_per_second = getattr(config.vision_config, "tokens_per_second", 1) if timed else None

    def get_rope_index(
        input_ids,
        mm_token_type_ids=None,
        image_grid_thw=None,
        video_grid_thw=None,
        attention_mask=None,
        second_per_grid_ts=None,
        **unused,
    ):
        """mmpos replacement of ``get_rope_index``: ``(3, B, L)`` position ids and ``rope_deltas (B, 1)``."""
        token_types = mm_token_type_ids
        if token_types is None:
            token_types = torch.full_like(input_ids, TEXT)
            token_types = token_types.masked_fill(input_ids == config.image_token_id, IMAGE)
            token_types = token_types.masked_fill(input_ids == config.video_token_id, VIDEO)
        interval = 1.0
        if tokens_per_second is not None and design == "mrope":  # VRoPE lays frames out consecutively
            # as the host: tokens_per_second * second_per_grid_ts in the tensor's own dtype (float32 from the
            # processor); temporal_ids then truncates the product in that dtype
            seconds = 1 if second_per_grid_ts is None else torch.as_tensor(second_per_grid_ts)
            interval = tokens_per_second * seconds
        ids, deltas = multimodal_position_ids(
            token_types.long(),
            image_grid_thw,
            video_grid_thw,
            attention_mask,
            spatial_merge_size=merge,
            design=design,
            spatial_reset=spatial_reset,
            video_time_interval=interval,
            split_video_frames=split_frames,
            vision_advance=advance,
        )
        return ids[:3].to(input_ids.dtype), deltas

    return get_rope_index


def _host_section(host_rotary, num_pairs, allocation):
    section = getattr(host_rotary, "mrope_section", None)
    try:
        return check_mrope_section(section, num_pairs, allocation)
    except (TypeError, ValueError):
        return default_mrope_section(num_pairs)


def _find_vlm(model):
    for candidate in (model, getattr(model, "model", None)):
        if candidate is not None and hasattr(candidate, "get_rope_index") and hasattr(candidate, "language_model"):
            model_type = getattr(candidate.config, "model_type", None)
            if model_type not in HOSTS:
                raise ValueError(f"model_type={model_type!r} is not supported; expected one of {tuple(HOSTS)}")
            return candidate
    raise ValueError(
        f"{type(model).__name__} is not a Qwen2-VL / Qwen2.5-VL / Qwen3-VL model "
        "(no get_rope_index and language_model found on it or on its .model)"
    )


def _transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def _headwise_apply(original, rotate_half):
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if cos.dim() != 4:
            return original(q, k, cos, sin, unsqueeze_dim)
        if unsqueeze_dim != 1 or q.shape[1] % cos.shape[1] or k.shape[1] != cos.shape[1]:
            raise ValueError(
                f"per-head cos {tuple(cos.shape)} needs q, k as (B, H, L, D) with H_kv = "
                f"{cos.shape[1]} key heads dividing the query heads; got q {tuple(q.shape)}, "
                f"k {tuple(k.shape)}"
            )
        group = q.shape[1] // cos.shape[1]
        cos_q, sin_q = cos.repeat_interleave(group, 1), sin.repeat_interleave(group, 1)
        return q * cos_q + rotate_half(q) * sin_q, k * cos + rotate_half(k) * sin

    apply_rotary_pos_emb.mmpos_original = original
    return apply_rotary_pos_emb


def _acquire_headwise_apply(language_model):
    module = sys.modules[type(language_model.layers[0].self_attn).__module__]
    if module not in _APPLY_PATCHES:
        original = module.apply_rotary_pos_emb
        _APPLY_PATCHES[module] = [original, 0]
        module.apply_rotary_pos_emb = _headwise_apply(original, module.rotate_half)
    _APPLY_PATCHES[module][1] += 1
    return module


def _release_headwise_apply(module):
    entry = _APPLY_PATCHES[module]
    entry[1] -= 1
    if entry[1] == 0:
        module.apply_rotary_pos_emb = entry[0]
        del _APPLY_PATCHES[module]
