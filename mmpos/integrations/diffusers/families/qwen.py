"""Qwen-Image (diffusers' ``QwenImageTransformer2DModel``): its centred multimodal RoPE rebuilt as coordinates.

``QwenEmbedRope`` (``scale_rope=True``) gives image ``i`` of a sample (``f x h x w`` tokens) the coordinates
``(i + frame, row - (h - h // 2), col - (w - w // 2))``: rows and columns centred on the image, and the text
tokens ``m + j`` on all three axes after the images (``m = max(h // 2, w // 2)`` over the images). Its tables are
complex ``[S, P]`` (interleaved pairs) that the stock processor multiplies into q and k, so the seam hands it
mmpos tables in that format and the processors stay stock.

``pe="native"`` follows the stock arithmetic bit for bit (fp32 ladder ``1 / theta ** (2i / d)``, fp32 phases,
``torch.polar``); a changed spectrum (extrapolation) is computed in fp64 and rounded to fp32 frequencies there.
A schedule's scale (DyPE) is read from the image tokens' extent only (text positions run past the images), and
the text tokens keep the training spectrum (no schedule, no YaRN magnitude), as in the DyPE authors' Qwen-Image code
(``txt_freqs`` from the plain ladder); a static ``extrapolation`` policy applies to every token.

Under diffusers' context parallelism (its plan splits ``pos_embed``'s outputs along dim 0) the seam builds and
caches only this rank's rows of the image and text tables (:mod:`..context_parallel`); ring attention with a text
mask that masks tokens is refused (:func:`_check_inputs`).
"""

from __future__ import annotations

import torch

from ....ops.tables import RotaryTable
from ....spectrum.allocation import chunked_spectrum
from .. import context_parallel
from ..positions import ByIdentity, PositionSeam, identity_key
from ..processors import PEProcessor
from . import register_family
from .base import Family, extents_of


def qwen_coords(video_fhw, max_txt_seq_len, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(image [S_img, 3], text [S_txt, 3])`` fp32 coordinates of ``QwenEmbedRope.forward``'s tokens."""
    if isinstance(video_fhw, list):
        video_fhw = video_fhw[0]  # the stock module uses the first sample's shapes for the batch
    shapes = video_fhw if isinstance(video_fhw, list) else [video_fhw]
    images, last = [], 0
    for index, (frames, height, width) in enumerate(shapes):
        t = torch.arange(index, index + frames, dtype=torch.float32, device=device)
        r = torch.arange(height, dtype=torch.float32, device=device) - (height - height // 2)
        c = torch.arange(width, dtype=torch.float32, device=device) - (width - width // 2)
        images.append(torch.stack(torch.meshgrid(t, r, c, indexing="ij"), dim=-1).reshape(-1, 3))
        last = max(last, height // 2, width // 2)
    text = torch.arange(last, last + int(max_txt_seq_len), dtype=torch.float32, device=device)
    return torch.cat(images), text[:, None].expand(-1, 3).contiguous()


class QwenPositions(PositionSeam):
    """Replaces ``QwenImageTransformer2DModel.pos_embed``: ``(img_shapes, max_txt_seq_len)`` -> complex64
    tables ``(image [S_img, P], text [S_txt, P])`` in the stock format."""

    def __init__(self, encodings, native, coord_axes, theta: float):
        super().__init__(encodings, native, coord_axes)
        self.theta = float(theta)
        self._plain_of = None  # (spectrum, whether it is the plain ladder): compared once per spectrum object
        for encoding in encodings:  # a fixed spectrum is checked here, so a traced forward compares nothing
            if getattr(encoding, "schedule", None) is None and native:
                self.is_plain(encoding, encoding.spectrum)

    def forward(self, video_fhw, device=None, max_txt_seq_len=None):
        if max_txt_seq_len is None:
            raise ValueError("max_txt_seq_len must be given (the text length), as for the stock QwenEmbedRope")
        self.count_forward()
        if not self.encodings:
            return None
        split = context_parallel.own_output_split(self, "pos_embed", split_dim=0)
        key = (identity_key(video_fhw), int(max_txt_seq_len), device, ByIdentity(split))
        return self.memo(key, lambda: self.tables_at(*qwen_coords(video_fhw, max_txt_seq_len, device)))

    def tables_at(self, image: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The complex64 tables ``(image [S_img, P], text [S_txt, P])`` of the coordinates ``image [S_img, 3]`` and
        ``text [S_txt, 3]`` (:func:`qwen_coords`'; a schedule's scale read from ``image``)."""
        (encoding,) = self.encodings
        image, text = self.encoding_coords(image), self.encoding_coords(text)
        scheduled = getattr(encoding, "schedule", None) is not None
        extents = {"text": [0.0] * image.shape[-1], "image": extents_of(image) if scheduled else None}
        tables = {}
        for part, coords in (("text", text), ("image", image)):
            if scheduled:  # text: extent 0, i.e. the training spectrum; images: the whole image's scale
                encoding.step.extents = extents[part]
            coords = self.own_part(coords)
            tables[part] = (
                self._native_table(encoding, coords)
                if self.native
                else self.counted(encoding.table(coords, torch.float32, coords.device)).cis
            )
        return tables["image"], tables["text"]

    def own_part(self, coords: torch.Tensor) -> torch.Tensor:
        """``coords`` (one part: image or text), or under Qwen-Image's context-parallel plan (which splits the
        outputs ``0`` and ``1`` along dim 0) only this rank's rows of it: the seam splits its outputs itself."""
        hook = context_parallel.own_output_split(self, "pos_embed", split_dim=0)
        if hook is None:
            return coords
        start, stop = context_parallel.own_rows(hook, coords.shape[0])
        return coords[start:stop]

    def _native_table(self, encoding, coords):
        """The stock arithmetic on ``encoding``'s spectrum at ``coords`` (a schedule's resolved at this step),
        cached on the encoding's table of them."""
        table = self.counted(encoding.table(coords, torch.float32, coords.device))
        cached = getattr(table, "qwen_native", None)
        if cached is None:
            spectrum = encoding.spectrum_at(coords)
            inv_freq = _stock_ladder(encoding.axes_dims, self.theta, coords.device)
            if not self.is_plain(encoding, spectrum):
                inv_freq = spectrum.inv_freq.to(coords.device, torch.float32)
            phase = coords[:, spectrum.axis_of_pair.to(coords.device)] * inv_freq  # fp32, as torch.outer there
            magnitude = spectrum.magnitude.to(coords.device, torch.float32).expand_as(phase)
            cached = table.qwen_native = torch.polar(magnitude.contiguous(), phase)
        return cached

    def is_plain(self, encoding, spectrum) -> bool:
        """``spectrum`` is the plain ladder (the stock arithmetic applies), decided once per spectrum object."""
        if self._plain_of is None or self._plain_of[0] is not spectrum:
            self._plain_of = (spectrum, _is_plain(spectrum, encoding.axes_dims, self.theta))
        return self._plain_of[1]


def _stock_ladder(axes_dims, theta, device) -> torch.Tensor:
    """``QwenEmbedRope.rope_params``' fp32 frequencies, axis after axis."""
    return torch.cat([1.0 / torch.pow(theta, torch.arange(0, d, 2).to(torch.float32).div(d)) for d in axes_dims]).to(
        device
    )


def _is_plain(spectrum, axes_dims, theta) -> bool:
    plain = chunked_spectrum(axes_dims, theta)
    return torch.equal(spectrum.inv_freq, plain.inv_freq) and bool((spectrum.magnitude == 1).all())


def _check_inputs(seam, args, kwargs) -> None:
    """Refuse a text mask that masks tokens under ring attention: diffusers 0.42's even ring attention applies each
    rank's local mask to every rank's keys (a silently wrong result), its ``ring_anything`` refuses any mask."""
    config = context_parallel.plan_config(seam, "pos_embed")
    if config is None or config.ring_degree == 1:
        return
    mask = kwargs.get("encoder_hidden_states_mask", args[2] if len(args) > 2 else None)
    if mask is not None and not bool(mask.all()):  # one device sync per forward, under ring attention only
        raise ValueError(
            f"Qwen-Image: encoder_hidden_states_mask masks text tokens, which diffusers' ring attention (ring_degree="
            f"{config.ring_degree}) cannot take (it applies each rank's mask to every rank's keys); use ulysses_degree, "
            "or pass the prompt without padding (mask None)"
        )


def qwen_stock_rotation(query, key, rotary_emb, layer):
    """The stock complex multiply (``apply_rotary_emb_qwen``, ``use_real=False``) of ``[B, S, H, D]`` by ``[S, P]``."""
    from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

    query = apply_rotary_emb_qwen(query, rotary_emb, use_real=False)
    return query, apply_rotary_emb_qwen(key, rotary_emb, use_real=False)


class QwenRuleAttnProcessor(PEProcessor):
    """``QwenDoubleStreamAttnProcessor2_0`` (diffusers 0.42) with its joint attention (text, then image) through
    :meth:`PEProcessor._rotate_attend`, where an image attention rule applies; the stock arithmetic otherwise. The
    text and image tables are concatenated and multiplied into the joint q and k (per token: the stock products)."""

    def __call__(
        self,
        attn,
        hidden_states,
        encoder_hidden_states=None,
        encoder_hidden_states_mask=None,
        attention_mask=None,
        image_rotary_emb=None,
    ):
        if encoder_hidden_states is None or attention_mask is not None:
            raise ValueError("Qwen-Image's attention takes the text stream and no external attention_mask")
        if encoder_hidden_states_mask is not None:
            image_mask = hidden_states.new_ones(hidden_states.shape[:2], dtype=torch.bool)
            attention_mask = torch.cat([encoder_hidden_states_mask, image_mask], dim=1)[:, None, None, :]
        text = encoder_hidden_states.shape[1]
        query, key, value = qwen_project_heads(attn, hidden_states, encoder_hidden_states)
        table = None
        if image_rotary_emb is not None:
            image_table, text_table = image_rotary_emb
            table = torch.cat([text_table, image_table], dim=0)
        joint = self._rotate_attend(query, key, value, table, attention_mask, self._parallel_config)
        joint = joint.flatten(2, 3).to(query.dtype)
        image_out = attn.to_out[0](joint[:, text:].contiguous())
        if len(attn.to_out) > 1:
            image_out = attn.to_out[1](image_out)
        return image_out, attn.to_add_out(joint[:, :text].contiguous())


def qwen_project_heads(attn, hidden_states, encoder_hidden_states):
    """The joint q, k, v ``[B, S_txt + S_img, H, D]`` (text first, normed, before RoPE), as the stock processor."""
    heads = []
    for stream, projections, norms in (
        (
            encoder_hidden_states,
            (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj),
            (attn.norm_added_q, attn.norm_added_k),
        ),
        (hidden_states, (attn.to_q, attn.to_k, attn.to_v), (attn.norm_q, attn.norm_k)),
    ):
        q, k, v = (proj(stream).unflatten(-1, (-1, attn.inner_dim // attn.heads)) for proj in projections)
        q = q if norms[0] is None else norms[0](q)
        k = k if norms[1] is None else norms[1](k)
        heads.append((q, k, v))
    return tuple(torch.cat([text, image], dim=1) for text, image in zip(*heads))


def _rule_processor(stock, layer: int) -> QwenRuleAttnProcessor:
    backend, parallel = getattr(stock, "_attention_backend", None), getattr(stock, "_parallel_config", None)
    return QwenRuleAttnProcessor(qwen_stock_rotation, layer, backend, parallel)


def qwen_bundle_tables(model, args, kwargs, bundle):
    """SPA's tables (:attr:`Family.bundle_tables`): the seam's at each of ``bundle``'s grids of the images' 0-based
    rows and columns, centred again as the stock module centres a grid of as many bundles (the base grid's count
    ``n`` per axis: ``b - (n - n // 2)``), the text positions kept; text first, the same for every layer."""
    seam = model.pos_embed
    if not isinstance(seam, QwenPositions) or not seam.encodings:
        raise ValueError("spa on Qwen-Image needs set_pe(model, 'native') first (its seam builds the bundled tables)")
    shapes = kwargs.get("img_shapes", args[4] if len(args) > 4 else None)
    text = kwargs.get("encoder_hidden_states", args[1] if len(args) > 1 else None)
    device = text.device
    image, text_coords = qwen_coords(shapes, text.shape[1], device)
    shapes = shapes[0] if isinstance(shapes, list) else shapes
    shapes = shapes if isinstance(shapes, list) else [shapes]
    counts = [f * h * w for f, h, w in shapes]
    offsets = torch.cat(
        [image.new_tensor([h - h // 2, w - w // 2]).expand(n, 2) for (_, h, w), n in zip(shapes, counts)]
    )
    grids = bundle(image[:, 1:3] + offsets)
    bundles = [part.amax(dim=0) + 1 for part in grids[0].split(counts)]  # the base grid's bundles per axis
    centre = torch.cat([(n - torch.div(n, 2, rounding_mode="floor")).expand(c, 2) for n, c in zip(bundles, counts)])
    tables = []
    for grid in grids:
        image_table, text_table = seam.tables_at(torch.cat([image[:, :1], grid - centre], dim=1), text_coords)
        tables.append(torch.cat([text_table, image_table], dim=0))
    return lambda layer: tables


def _attention(model):
    return [(f"transformer_blocks.{i}.attn", block.attn) for i, block in enumerate(model.transformer_blocks)]


def _processor():
    from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

    return QwenDoubleStreamAttnProcessor2_0


def _seam(model, stock, encodings, native, coord_axes):
    """Qwen-Image's stock processors multiply complex ``[S, P]`` tables into interleaved pairs: one encoding with
    such tables, shared by the layers."""
    from diffusers.models.transformers.transformer_qwenimage import QwenEmbedRope

    if type(stock) is not QwenEmbedRope:
        raise TypeError(
            f"set_pe supports Qwen-Image's QwenEmbedRope, got {type(stock).__name__} "
            "(use_layer3d_rope=True is not supported)"
        )
    if len(encodings) > 1:
        raise ValueError("Qwen-Image: per_layer encodings are not supported (its stock processors read one table)")
    for encoding in encodings:
        probe = encoding.table(torch.zeros(1, encoding.num_axes), torch.float32)
        if (
            getattr(encoding, "layout", None) != "interleaved"
            or not isinstance(probe, RotaryTable)
            or probe.cis.dim() != 2
        ):
            raise ValueError(
                f"Qwen-Image applies one complex [S, P] table in the interleaved layout; "
                f"{type(encoding).__name__} does not give one (use 'native' or 'rope_axial')"
            )
    return QwenPositions(encodings, native, coord_axes, float(model.pos_embed.theta))


QWEN = register_family(
    Family(
        name="qwen",
        classes=("diffusers.models.transformers.transformer_qwenimage:QwenImageTransformer2DModel",),
        position_attr="pos_embed",
        axis_names=("frame", "row", "col"),  # rows and columns centred on the image
        native_axes_dims=lambda model: tuple(int(d) for d in model.config.axes_dims_rope),
        native_theta=lambda model: float(model.pos_embed.theta),
        image_axes=(1, 2),
        timestep_per_sigma=1.0,  # QwenImagePipeline passes t / 1000 = sigma
        timestep_arg=("timestep", 3),
        tier=2,  # the stock processors read mmpos tables as they are: rope_axial-style encodings with one table
        attention_modules=_attention,
        stock_processor=_processor,
        make_processors=lambda beneath, rotation, native: {},
        make_seam=_seam,
        check_model=context_parallel.refuse_after_parallelism("pos_embed"),  # the plan hooks the seam itself
        check_inputs=_check_inputs,
        rule_processor=_rule_processor,  # the image attention rules (HAP, SPA) on the stock arithmetic
        bundle_tables=qwen_bundle_tables,
        context_parallel=True,  # tests/integrations/test_context_parallel.py
        pipelines=(
            "QwenImagePipeline",
            "QwenImageEditPipeline",
            "QwenImageEditPlusPipeline",
            "QwenImageImg2ImgPipeline",
            "QwenImageInpaintPipeline",
        ),
        train_size=1328,
        pixels_per_token=16,
        notes="stock processors read mmpos tables: `rope_axial`-style encodings with one shared table; several images "
        "per sequence (Edit); text on the training spectrum",
    )
)
