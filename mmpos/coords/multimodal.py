"""Position ids of multimodal sequences (text, image and video segments) for a language model's RoPE.

Position design of Qwen2-VL / Qwen2.5-VL / Qwen3-VL (MRoPE, MRoPE-I, MHRoPE) and VRoPE, vectorised over
the whole batch: no Python loop over tokens, segments or samples.

A sequence is read as runs of equal token type (``0`` text, ``1`` image, ``2`` video), as transformers'
``mm_token_type_ids``. Each vision run consumes the next grid ``(T, H, W)`` (vision-encoder patches, so the
language model sees ``T x H/m x W/m`` tokens for merge size ``m``), in order over the batch. A run starts at
the running index ``s`` (text before it advanced it by its length):

- text: ``s + l`` on every axis;
- ``design="mrope"``: vision token (frame t, row i, col j) gets ``(s + ⌊t * interval⌋, s + i, s + j)``,
  or with ``spatial_reset`` ``(s + ⌊t * interval⌋, i, j)`` (h and w restart at 0, the paper's design), the
  product formed as Qwen2.5-VL forms it (see :func:`temporal_ids`);
- ``design="vrope"``: the four VRoPE diagonal variants ``s + t K + v`` (:mod:`mmpos.coords.vrope`).

After a vision run, text resumes at (``vision_advance``) ``"max"``: the run's largest non-reset id + 1
(Qwen2-VL's and the MRoPE-I paper's rule; transformers < 5), or ``"spatial"``: ``s + max(H, W) / m``
(transformers 5.x). They differ only for multi-frame blocks whose temporal ids outrun the spatial ones.
VRoPE always resumes at ``s + T K``. Qwen3-VL's convention (``split_video_frames``) turns a video of T
frames into T single-frame blocks, because timestamps (text tokens) separate its frames.

``rope_deltas = max id + 1 - length`` per sample continues positions while decoding
(:func:`decode_position_ids`).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch
from torch.types import Device

from .._validation import check_choice, check_positive_int
from .vrope import NUM_VARIANTS, diagonal_variants

TEXT, IMAGE, VIDEO = 0, 1, 2
DESIGNS = ("mrope", "vrope")
VISION_ADVANCES = ("max", "spatial")


def multimodal_position_ids(
    token_types: torch.Tensor,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    *,
    spatial_merge_size: int = 1,
    design: str = "mrope",
    spatial_reset: bool = False,
    video_time_interval: float | torch.Tensor = 1.0,
    split_video_frames: bool = False,
    vision_advance: str = "max",
    pad_position: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ids ``(A, B, L)`` int64 and ``rope_deltas`` ``(B, 1)`` of a batch of multimodal sequences.

    Args:
        token_types: ``(B, L)`` integers, 0 text, 1 image, 2 video token.
        image_grid_thw, video_grid_thw: ``(n, 3)`` grids ``(T, H, W)`` in vision patches, in sequence order.
        attention_mask: ``(B, L)``; padded tokens are skipped and get ``pad_position``.
        spatial_merge_size: ``m``; ``H`` and ``W`` must be multiples of it.
        design: ``"mrope"`` (A = 3 axes t, h, w) or ``"vrope"`` (A = 4 diagonal variants).
        spatial_reset: MRoPE only: vision h and w restart at 0 in every block.
        video_time_interval: MRoPE temporal id step per frame, one value or one per video (Qwen2.5-VL:
            ``tokens_per_second * second_per_grid_ts``, a float32 tensor as the processor writes it); ids
            are :func:`temporal_ids`, bit for bit as in Qwen2.5-VL. VRoPE lays frames out consecutively and
            takes none.
        split_video_frames: Qwen3-VL: each video frame is its own block.
        vision_advance: ``"max"`` or ``"spatial"`` (see module docstring).
    """
    check_choice("design", design, DESIGNS)
    check_choice("vision_advance", vision_advance, VISION_ADVANCES)
    check_positive_int("spatial_merge_size", spatial_merge_size)
    if design == "vrope" and spatial_reset:
        raise ValueError("spatial_reset applies to design='mrope' only; VRoPE has its own diagonal layout")
    if design == "vrope" and not (torch.as_tensor(video_time_interval) == 1).all():
        raise ValueError("video_time_interval applies to design='mrope' only; VRoPE lays frames out consecutively")
    token_types, valid = _check_tokens(token_types, attention_mask)
    device = token_types.device
    batch, length = token_types.shape

    types = token_types[valid]  # [N] valid tokens, sample-major
    sample = torch.arange(batch, device=device).unsqueeze(1).expand(batch, length)[valid]
    runs = _Runs(types, sample)
    grids, intervals = _run_grids(
        runs, image_grid_thw, video_grid_thw, video_time_interval, split_video_frames, spatial_merge_size, device
    )

    local = torch.arange(types.numel(), device=device) - runs.start[runs.of_token]  # index inside its run
    layout = _mrope_layout if design == "mrope" else _vrope_layout
    local_ids, span = layout(runs, grids, intervals, local, vision_advance)  # [N, A], [R]
    is_text = (runs.kind == TEXT)[runs.of_token]
    num_axes = local_ids.shape[-1]
    local_ids = torch.where(is_text.unsqueeze(-1), local.unsqueeze(-1).expand(-1, num_axes), local_ids)
    advance = torch.where(runs.kind == TEXT, runs.length, span)

    start = _exclusive_cumsum_per_sample(advance, runs.sample, batch)[runs.of_token]  # [N]
    shift = start.unsqueeze(-1).expand(-1, num_axes).clone()
    if spatial_reset:
        shift[~is_text, 1:] = 0
    ids = local_ids + shift  # [N, A]

    position_ids = torch.full((num_axes, batch, length), pad_position, dtype=torch.int64, device=device)
    position_ids[:, valid] = ids.T
    top = torch.full((batch,), -1, dtype=torch.int64, device=device).scatter_reduce(0, sample, ids.amax(-1), "amax")
    rope_deltas = (top + 1 - valid.sum(-1)).unsqueeze(-1)
    return position_ids, rope_deltas


def _frame_indices(
    runs: _Runs, grids: torch.Tensor, local: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(frame, row, col) of every token inside its block (frame-major, row-major)."""
    height, width = grids[runs.of_token, 1], grids[runs.of_token, 2]
    return local // (height * width), (local // width) % height, local % width


def temporal_ids(frame: torch.Tensor, interval: torch.Tensor) -> torch.Tensor:
    """Temporal ids ``(frame * interval).long()`` int64, the product in PyTorch's promoted dtype.

    This is Qwen2.5-VL's rule in transformers (``(arange(T) * time_interval).long()``): with the float32
    ``second_per_grid_ts`` its processor writes (``temporal_patch_size / fps``), the product is rounded to
    float32 before truncation: at interval ``2 * float32(2 / 2.4)`` (2.4 fps, 2 tokens per second) frame 3
    gives float32 5.0 -> 5, where the fp64 product of the same interval, 4.9999999, truncates to 4. Python-float
    intervals become float32 tensors (PyTorch's default dtype), integer intervals stay exact in int64.

    Args:
        frame: ``[N]`` int64 frame indices (non-negative).
        interval: ``[N]`` non-negative interval per token, integer or floating.
    """
    return (frame * interval).long()


def _mrope_layout(
    runs: _Runs, grids: torch.Tensor, intervals: torch.Tensor, local: torch.Tensor, vision_advance: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Local ``(temporal id, row, col)`` ids ``[N, 3]`` and each block's advance ``[R]``."""
    frame, row, col = _frame_indices(runs, grids, local)
    t_ids = temporal_ids(frame, intervals[runs.of_token])
    frames, height, width = grids.unbind(-1)
    if vision_advance == "max":
        last_t = temporal_ids(frames - 1, intervals)
        span = torch.maximum(last_t, torch.maximum(height, width) - 1) + 1
    else:
        span = torch.maximum(height, width)
    return torch.stack([t_ids, row, col], dim=-1), span


def _vrope_layout(
    runs: _Runs, grids: torch.Tensor, intervals: torch.Tensor, local: torch.Tensor, vision_advance: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Local VRoPE variant ids ``t K + v`` ``[N, 4]`` (``K = H + W - 1``) and each block's advance ``T K``."""
    frame, row, col = _frame_indices(runs, grids, local)
    frames, height, width = grids.unbind(-1)
    span = height + width - 1
    variants = diagonal_variants(row, col, height[runs.of_token], width[runs.of_token])
    return variants + (frame * span[runs.of_token]).unsqueeze(-1), frames * span


def decode_position_ids(
    rope_deltas: torch.Tensor, past_length: int | torch.Tensor, num_new: int = 1, num_axes: int = 3
) -> torch.Tensor:
    """Ids ``(A, B, num_new)`` of the next generated text tokens: ``past + step + rope_deltas``.

    ``past_length``: tokens already seen per sample, not counting padding (an int, or ``(B,)``, e.g.
    ``attention_mask.sum(-1)``), so every sample continues at its own ``max id + 1``.
    """
    check_positive_int("num_new", num_new)
    past = torch.as_tensor(past_length, device=rope_deltas.device).reshape(-1, 1)
    steps = past + torch.arange(num_new, device=rope_deltas.device)
    return (steps + rope_deltas.reshape(-1, 1)).unsqueeze(0).expand(num_axes, -1, -1)


def segment_token_types(
    segments: Iterable[Sequence], device: Device = None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Token types ``[L]`` and grids of a segment list, in language-model tokens (merge size 1).

    Segments: ``("text", n)``, ``("image", h, w)``, ``("video", T, h, w)``. Returns
    ``(token_types, image_grid_thw or None, video_grid_thw or None)``.
    """
    types: list[torch.Tensor] = []
    images: list[tuple[int, ...]] = []
    videos: list[tuple[int, ...]] = []
    for position, segment in enumerate(segments):
        kind, sizes = (segment[0], tuple(segment[1:])) if isinstance(segment, (tuple, list)) and segment else (None, ())
        expected = {"text": 1, "image": 2, "video": 3}.get(kind) if isinstance(kind, str) else None
        if expected is None or len(sizes) != expected or any(not isinstance(s, int) or s <= 0 for s in sizes):
            raise ValueError(
                f"segments[{position}]={segment!r}: expected ('text', n), ('image', h, w) or "
                "('video', T, h, w) with positive integer sizes"
            )
        if kind == "text":
            types.append(torch.full((sizes[0],), TEXT))
        elif kind == "image":
            images.append((1,) + sizes)
            types.append(torch.full((sizes[0] * sizes[1],), IMAGE))
        else:
            videos.append(sizes)
            types.append(torch.full((sizes[0] * sizes[1] * sizes[2],), VIDEO))
    if not types:
        raise ValueError("segments is empty")

    def grid(rows: list[tuple[int, ...]]) -> torch.Tensor | None:
        return torch.tensor(rows, dtype=torch.int64, device=device) if rows else None

    return torch.cat(types).to(device), grid(images), grid(videos)


def sequence_coords(
    segments: Iterable[Sequence], design: str = "mrope", device: Device = None, **options: Any
) -> torch.Tensor:
    """Float32 coordinates ``[L, A]`` of one segment list (see :func:`segment_token_types`), for
    ``create_pe("mrope"/"mrope_interleave"/"mhrope"/"vrope")``; ``options`` as :func:`multimodal_position_ids`."""
    types, images, videos = segment_token_types(segments, device)
    ids, _ = multimodal_position_ids(types[None], images, videos, design=design, **options)
    return ids[:, 0].T.float()


def split_frames(video_grid_thw: torch.Tensor) -> torch.Tensor:
    """Qwen3-VL: a video ``(T, H, W)`` becomes T rows ``(1, H, W)`` (a new tensor; the input is untouched)."""
    grids = _check_grid("video_grid_thw", video_grid_thw)
    single = grids.clone()
    single[:, 0] = 1
    return torch.repeat_interleave(single, grids[:, 0], dim=0)


class _Runs:
    """Maximal runs of equal token type within a sample, over the flattened valid tokens."""

    def __init__(self, types: torch.Tensor, sample: torch.Tensor) -> None:
        boundary = torch.ones_like(types, dtype=torch.bool)
        boundary[1:] = (types[1:] != types[:-1]) | (sample[1:] != sample[:-1])
        self.start = boundary.nonzero().squeeze(-1)  # [R]
        self.of_token = torch.cumsum(boundary, 0) - 1  # [N]
        ends = torch.cat([self.start[1:], self.start.new_tensor([types.numel()])])
        self.length = ends - self.start
        self.kind = types[self.start]
        self.sample = sample[self.start]


def _run_grids(
    runs: _Runs,
    image_grid_thw: torch.Tensor | None,
    video_grid_thw: torch.Tensor | None,
    video_time_interval: float | torch.Tensor,
    split_video_frames: bool,
    merge: int,
    device: Device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per run: language-model grid ``[R, 3]`` (text: ``(len, 1, 1)``) and temporal interval ``[R]`` (in the
    dtype the video interval has, see :func:`temporal_ids`)."""
    grids = torch.stack([runs.length, torch.ones_like(runs.length), torch.ones_like(runs.length)], dim=-1)
    intervals = torch.ones(runs.length.numel(), dtype=_interval_tensor(video_time_interval).dtype, device=device)
    for kind, name, grid_thw in ((IMAGE, "image_grid_thw", image_grid_thw), (VIDEO, "video_grid_thw", video_grid_thw)):
        is_kind = runs.kind == kind
        count = int(is_kind.sum())
        if grid_thw is None:
            if count:
                raise ValueError(f"the sequence has {count} {name.split('_')[0]} block(s) but {name} is None")
            continue
        grid = _check_grid(name, grid_thw).to(device)
        step = _per_block_interval(video_time_interval, grid.shape[0], device) if kind == VIDEO else None
        if step is not None and split_video_frames:
            step = torch.repeat_interleave(step, grid[:, 0])
            grid = split_frames(grid)
        if grid.shape[0] != count:
            raise ValueError(
                f"{name} has {grid.shape[0]} grid(s) but the token types hold {count} "
                f"{name.split('_')[0]} block(s) (runs of consecutive tokens of that type)"
            )
        if ((grid[:, 1:] % merge) != 0).any():
            raise ValueError(
                f"{name}={grid.tolist()}: heights and widths must be multiples of spatial_merge_size={merge}"
            )
        llm_grid = torch.cat([grid[:, :1], grid[:, 1:] // merge], dim=-1)
        tokens, run_length = llm_grid.prod(-1), runs.length[is_kind]
        if not torch.equal(tokens, run_length):
            bad = int((tokens != run_length).nonzero()[0])
            raise ValueError(
                f"{name}[{bad}] covers {int(tokens[bad])} language-model tokens "
                f"({llm_grid[bad].tolist()} after merge {merge}) but its block has {int(run_length[bad])}"
            )
        grids[is_kind] = llm_grid
        if step is not None:
            intervals[is_kind] = step
    return grids, intervals


def _interval_tensor(value: float | torch.Tensor) -> torch.Tensor:
    """The interval as PyTorch would hold it: a tensor keeps its dtype, Python floats become float32."""
    step = torch.as_tensor(value)
    if step.dtype == torch.bool or step.is_complex():
        raise ValueError(f"video_time_interval must be real numbers, got dtype {step.dtype}")
    return step


def _per_block_interval(value: float | torch.Tensor, count: int, device: Device) -> torch.Tensor:
    step = _interval_tensor(value).to(device).flatten()
    if step.numel() == 1:
        step = step.expand(count)
    if step.numel() != count:
        raise ValueError(f"video_time_interval has {step.numel()} values; expected one or one per video ({count})")
    if not torch.isfinite(step).all() or (step < 0).any():
        raise ValueError("video_time_interval must be finite and non-negative")
    return step


def _check_grid(name: str, grid: object) -> torch.Tensor:
    if not isinstance(grid, torch.Tensor) or grid.dim() != 2 or grid.shape[-1] != 3:
        raise ValueError(
            f"{name} must be an integer tensor of shape (n, 3) (T, H, W), got {tuple(getattr(grid, 'shape', ()))}"
        )
    if grid.is_floating_point() or grid.dtype == torch.bool or (grid <= 0).any():
        raise ValueError(f"{name} must hold positive integers, got {grid.tolist()}")
    return grid.to(torch.int64)


def _check_tokens(token_types: object, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(token_types, torch.Tensor) or token_types.dim() != 2 or token_types.is_floating_point():
        shape = tuple(getattr(token_types, "shape", ()))
        raise ValueError(f"token_types must be an integer tensor (B, L), got shape {shape}")
    if ((token_types < TEXT) | (token_types > VIDEO)).any():
        raise ValueError("token_types must hold 0 (text), 1 (image) or 2 (video)")
    if attention_mask is None:
        return token_types, torch.ones_like(token_types, dtype=torch.bool)
    if attention_mask.shape != token_types.shape:
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}; expected {tuple(token_types.shape)}")
    return token_types, attention_mask.to(token_types.device).bool()


def _exclusive_cumsum_per_sample(values: torch.Tensor, sample: torch.Tensor, batch: int) -> torch.Tensor:
    """Running sum of ``values`` (one per run) restarting at every sample's first run."""
    inclusive = torch.cumsum(values, 0)
    exclusive = inclusive - values
    first = torch.full((batch,), values.numel(), dtype=torch.int64, device=values.device)
    first = first.scatter_reduce(0, sample, torch.arange(values.numel(), device=values.device), "amin")
    return exclusive - exclusive[first[sample]]


__all__ = [
    "TEXT",
    "IMAGE",
    "VIDEO",
    "DESIGNS",
    "multimodal_position_ids",
    "decode_position_ids",
    "temporal_ids",
    "segment_token_types",
    "sequence_coords",
    "split_frames",
    "NUM_VARIANTS",
]
