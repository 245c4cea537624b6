"""Qwen-Image (and -Edit): ``QwenDoubleStreamAttnProcessor2_0``, joint ``[text | images]``, complex tables.

The processor rotates text and image tokens with the two complex ``[S, P]`` tables ``QwenEmbedRope`` returns
(``(image, text)``; interleaved pairs) and concatenates ``[text, image]``; the edit's rotation is the table of
that joint sequence. Segments from the coordinates (:func:`~mmpos.integrations.diffusers.families.qwen.qwen_coords`
on ``img_shapes``): the target is the image at frame index 0, each condition image (Edit) one frame index after it.
The key mask is the text mask (``encoder_hidden_states_mask``) then the image tokens, as the processor builds it.
"""

from __future__ import annotations

import torch

from mmpos.integrations.diffusers.families.qwen import QwenPositions, qwen_coords
from mmpos.integrations.diffusers.layer_rotation import LayerRotation
from mmpos.ops.tables import RotaryTable

from ..processor import EditAttnProcessor
from ..segments import TokenSegments, grid_shape, runs_by_value
from .base import FamilyEditAttention, grid_cells


class QwenEditAttnProcessor(EditAttnProcessor):
    """The edit level of a Qwen-Image block (``QwenDoubleStreamAttnProcessor2_0``'s signature)."""

    def __call__(
        self,
        attn,
        hidden_states,
        encoder_hidden_states=None,
        encoder_hidden_states_mask=None,
        attention_mask=None,
        image_rotary_emb=None,
    ):
        return self.run(
            attn,
            dict(
                hidden_states=hidden_states,
                encoder_hidden_states=encoder_hidden_states,
                encoder_hidden_states_mask=encoder_hidden_states_mask,
                attention_mask=attention_mask,
                image_rotary_emb=image_rotary_emb,
            ),
        )


def qwen_segments(text_len: int, img_shapes) -> TokenSegments:
    """Segments of ``[text | images]``: the target at frame index 0, condition images at the later ones."""
    image, _ = qwen_coords(img_shapes, 1)
    runs = runs_by_value(image[:, 0])
    (_, target), references = runs[0], [tokens for _, tokens in runs[1:]]
    if references and target.start != 0:
        raise ValueError("img_shapes: expected the target image (frame index 0) first")
    context_len = sum(r.stop - r.start for r in references)
    return TokenSegments(
        text_len,
        target.stop - target.start,
        context_len,
        grid_shape(image[target]),
        grid_shape(image[references[0]]) if references else (0, 0),
        references=tuple(slice(text_len + r.start, text_len + r.stop) for r in references),
    )


class QwenEditAttention(FamilyEditAttention):
    family = "qwen"

    def processor_class(self, slot) -> type:
        return QwenEditAttnProcessor

    def sigma(self, args, kwargs):
        timestep = kwargs.get("timestep", args[3] if len(args) > 3 else None)
        return timestep.flatten()[:1]

    def observe(self, context, module, args, kwargs) -> None:
        text = kwargs.get("encoder_hidden_states", args[1] if len(args) > 1 else None)
        img_shapes = kwargs.get("img_shapes", args[4] if len(args) > 4 else None)
        context.segments = qwen_segments(text.shape[1], img_shapes)

    def project(self, attn, inputs):
        hidden_states, encoder_hidden_states = inputs["hidden_states"], inputs["encoder_hidden_states"]
        if inputs.get("attention_mask") is not None:
            raise ValueError("QwenDoubleStreamAttnProcessor2_0 does not accept an external attention_mask")
        head_dim = attn.inner_dim // attn.heads
        img = [f(hidden_states).unflatten(-1, (-1, head_dim)) for f in (attn.to_q, attn.to_k, attn.to_v)]
        txt = [
            f(encoder_hidden_states).unflatten(-1, (-1, head_dim))
            for f in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)
        ]
        for stream, norms in ((img, (attn.norm_q, attn.norm_k)), (txt, (attn.norm_added_q, attn.norm_added_k))):
            for i, norm in enumerate(norms):
                if norm is not None:
                    stream[i] = norm(stream[i])
        query, key, value = (torch.cat([t, i], dim=1) for t, i in zip(txt, img))
        return query, key, value, None

    def rotary_emb(self, inputs):
        return inputs["image_rotary_emb"]

    def rotation(self, beneath, rotary_emb, layer: int) -> LayerRotation:
        img_freqs, txt_freqs = rotary_emb
        return LayerRotation(RotaryTable(torch.cat([txt_freqs, img_freqs], dim=0)))

    def key_mask(self, inputs, segments, batch, length):
        mask = inputs.get("encoder_hidden_states_mask")
        if mask is None:
            return None
        image = torch.ones(batch, length - mask.shape[1], dtype=torch.bool, device=mask.device)
        return torch.cat([mask, image], dim=1)

    def finish(self, attn, inputs, state, out, dtype):
        joint = out.flatten(2, 3).to(dtype)
        text = inputs["encoder_hidden_states"].shape[1]
        img = attn.to_out[0](joint[:, text:].contiguous())
        if len(attn.to_out) > 1:
            img = attn.to_out[1](img)
        return img, attn.to_add_out(joint[:, :text].contiguous())

    def image_coords(self, inputs):
        """The centred ``(frame, row, col)`` of ``img_shapes``: the target at frame 0, condition images after."""
        return qwen_coords(inputs["img_shapes"], 1, inputs["hidden_states"].device)[0]

    def table_at(self, transformer, inputs, image_coords):
        text_len = inputs["encoder_hidden_states"].shape[1]
        _, text = transformer.pos_embed(inputs["img_shapes"], max_txt_seq_len=text_len, device=image_coords.device)
        return RotaryTable(torch.cat([text, qwen_table_at(transformer.pos_embed, image_coords)], dim=0))

    def grid_coords(self, ids, grid):
        return qwen_canvas_coords(ids, grid)

    def move_ids(self, kwargs, coords, grid):
        return kwargs  # the forward takes no ids: the position module's table moves (move_table)

    def move_table(self, module, args, kwargs, output, coords, moved, grid, cache):
        """The image table with the moved grid tokens' rows (found by their coordinates) at ``coords``, built with
        the module's own frequencies (:func:`qwen_table_at`: the stock ladder or the ``set_pe`` encoding's)."""
        video_fhw = kwargs.get("video_fhw", args[0] if args else None)
        image_table, text_table = output
        key = (repr(video_fhw), id(module))
        held = cache.get("table")
        if held is None or held[0] != key or held[1] is not image_table:  # the stock module caches its tables
            tokens, cells = _moved_tokens(video_fhw, image_table.device, moved, grid)
            new_rows = qwen_table_at(module, coords.to(image_table.device)[cells])
            held = cache["table"] = (
                key,
                image_table,
                image_table.index_copy(0, tokens, new_rows.to(image_table.dtype)),
            )
        return held[2], text_table


def qwen_table_at(module, coords: torch.Tensor) -> torch.Tensor:
    """The complex image table ``[S, P]`` Qwen-Image's position ``module`` gives tokens at ``coords [S, 3]``:
    the stock ``QwenEmbedRope``'s arithmetic (fp32 ladder times fp32 positions, ``torch.polar``), or a
    ``set_pe`` seam's encoding (its native arithmetic or its own table)."""
    if isinstance(module, QwenPositions):
        (encoding,) = module.encodings
        coords = module.encoding_coords(coords.float())
        if module.native:
            return module._native_table(encoding, coords)
        return encoding.table(coords, torch.float32, coords.device).cis
    ladders = [1.0 / torch.pow(module.theta, torch.arange(0, d, 2).to(torch.float32).div(d)) for d in module.axes_dim]
    axis = torch.cat([torch.full((d // 2,), i, dtype=torch.long) for i, d in enumerate(module.axes_dim)])
    phase = coords.float()[:, axis.to(coords.device)] * torch.cat(ladders).to(coords.device)
    return torch.polar(torch.ones_like(phase), phase)


ADAPTER = QwenEditAttention()


def qwen_canvas_coords(ids: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """FLUX.1-style grid ids ``[N, 3]`` on a ``rows x cols`` grid -> Qwen-Image's centred coordinates ``[N, 3]``
    ``(0, row - (rows - rows // 2), col - (cols - cols // 2))`` (fp32, as ``QwenEmbedRope`` places them)."""
    rows, cols = grid
    out = torch.zeros(ids.shape[0], 3, dtype=torch.float32, device=ids.device)
    out[:, 1] = ids[:, 1].float() - (rows - rows // 2)
    out[:, 2] = ids[:, 2].float() - (cols - cols // 2)
    return out


def _moved_tokens(video_fhw, device, moved: torch.Tensor, grid: tuple[int, int]):
    """(the image tokens whose grid cell moved, those cells): the output image's tokens (frame 0) found by their
    centred coordinates."""
    coords = qwen_coords(video_fhw, 1, device)[0]
    rows, cols = grid
    image = coords[:, 0] == 0
    cells = grid_cells(coords[image][:, 1:3], grid, (-(rows - rows // 2), -(cols - cols // 2)))
    moved_cells = moved.to(cells.device)[cells]
    return image.nonzero().flatten()[moved_cells], cells[moved_cells]
