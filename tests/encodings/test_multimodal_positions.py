"""Multimodal position ids (MRoPE family): goldens, transformers' own get_rope_index, invariants, bad input."""

import pytest
import torch

from mmpos.coords.multimodal import (
    decode_position_ids,
    multimodal_position_ids,
    segment_token_types,
    sequence_coords,
    split_frames,
)
from tests.fixtures import tiny_qwen_vl

# The canonical 29-token Qwen3-VL sequence of the notes (rope-variants.md 2.6), decoded from the reference's
# golden file generated with transformers 4.57.1: text, <vs>, image (1, 4, 4), <ve>, text, <vs> frame <ve>, ...
CANONICAL_TYPES = [0] * 6 + [1] * 4 + [0] * 5 + [2] * 4 + [0] * 4 + [2] * 4 + [0] * 2
CANONICAL = {
    False: [
        [0, 1, 2, 3, 4, 5, 6, 6, 6, 6, 8, 9, 10, 11, 12, 13, 13, 13, 13, 15, 16, 17, 18, 19, 19, 19, 19, 21, 22],
        [0, 1, 2, 3, 4, 5, 6, 6, 7, 7, 8, 9, 10, 11, 12, 13, 13, 14, 14, 15, 16, 17, 18, 19, 19, 20, 20, 21, 22],
        [0, 1, 2, 3, 4, 5, 6, 7, 6, 7, 8, 9, 10, 11, 12, 13, 14, 13, 14, 15, 16, 17, 18, 19, 20, 19, 20, 21, 22],
    ],
    True: [
        [0, 1, 2, 3, 4, 5, 6, 6, 6, 6, 8, 9, 10, 11, 12, 13, 13, 13, 13, 15, 16, 17, 18, 19, 19, 19, 19, 21, 22],
        [0, 1, 2, 3, 4, 5, 0, 0, 1, 1, 8, 9, 10, 11, 12, 0, 0, 1, 1, 15, 16, 17, 18, 0, 0, 1, 1, 21, 22],
        [0, 1, 2, 3, 4, 5, 0, 1, 0, 1, 8, 9, 10, 11, 12, 0, 1, 0, 1, 15, 16, 17, 18, 0, 1, 0, 1, 21, 22],
    ],
}


@pytest.mark.parametrize("spatial_reset", [False, True])
def test_canonical_golden(spatial_reset):
    types = torch.tensor([CANONICAL_TYPES])
    ids, deltas = multimodal_position_ids(
        types,
        torch.tensor([[1, 4, 4]]),
        torch.tensor([[2, 4, 4]]),
        spatial_merge_size=2,
        split_video_frames=True,
        spatial_reset=spatial_reset,
    )
    assert ids[:, 0].tolist() == CANONICAL[spatial_reset]
    assert deltas.tolist() == [[-6]]


def test_qwen35_golden_without_vision_start_tokens():
    types = torch.tensor([[0] * 5 + [1] * 4 + [0] * 3 + [2] * 4 + [0] * 2])
    ids, deltas = multimodal_position_ids(
        types, torch.tensor([[1, 4, 4]]), torch.tensor([[1, 4, 4]]), spatial_merge_size=2, split_video_frames=True
    )
    assert ids[:, 0].tolist() == [
        [0, 1, 2, 3, 4, 5, 5, 5, 5, 7, 8, 9, 10, 10, 10, 10, 12, 13],
        [0, 1, 2, 3, 4, 5, 5, 6, 6, 7, 8, 9, 10, 10, 11, 11, 12, 13],
        [0, 1, 2, 3, 4, 5, 6, 5, 6, 7, 8, 9, 10, 11, 10, 11, 12, 13],
    ]
    assert deltas.tolist() == [[-4]]


def _host_rope_index(kind, ids, types, attention_mask=None, **grids):
    with torch.no_grad():
        return tiny_qwen_vl.build(kind).model.get_rope_index(ids, types, attention_mask=attention_mask, **grids)


def _padded_batch(kind):
    """Two samples of the mixed input, the second with a shorter video, left-padded and without its last text."""
    a = tiny_qwen_vl.mixed_inputs(kind)
    b = tiny_qwen_vl.mixed_inputs(kind, video_grid=(2, 4, 4))
    length = a["input_ids"].shape[1]
    ids_b, types_b = b["input_ids"][:, :-2], b["mm_token_type_ids"][:, :-2]
    pad = length - ids_b.shape[1]
    ids = torch.cat([a["input_ids"], torch.cat([torch.zeros(1, pad, dtype=torch.long), ids_b], 1)])
    types = torch.cat([a["mm_token_type_ids"], torch.cat([torch.zeros(1, pad, dtype=torch.int), types_b], 1)])
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    grids = dict(
        image_grid_thw=torch.cat([a["image_grid_thw"], b["image_grid_thw"]]),
        video_grid_thw=torch.cat([a["video_grid_thw"], b["video_grid_thw"]]),
    )
    if kind == "qwen2_5_vl":
        grids["second_per_grid_ts"] = torch.tensor([1.5, 0.5])
    return ids, types, mask, grids


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_equals_transformers_get_rope_index(kind):
    ids, types, mask, grids = _padded_batch(kind)
    expected, expected_deltas = _host_rope_index(kind, ids, types, mask, **grids)
    interval = 1.0 if kind != "qwen2_5_vl" else 2 * grids["second_per_grid_ts"]  # tokens_per_second = 2
    ours, deltas = multimodal_position_ids(
        types,
        grids["image_grid_thw"],
        grids["video_grid_thw"],
        mask,
        spatial_merge_size=2,
        video_time_interval=interval,
        split_video_frames=kind == "qwen3_vl",
        vision_advance="spatial",
    )
    assert torch.equal(ours, expected)
    assert torch.equal(deltas, expected_deltas)


# What Qwen2.5-VL's processor writes: second_per_grid_ts = temporal_patch_size / sampled fps, a float32 tensor
PROCESSOR_FPS = (1.2, 2.4, 4.8, 25.0)


def _processor_seconds(fps_values, temporal_patch_size=2):
    return torch.tensor([temporal_patch_size / fps for fps in fps_values])


def _video_batch(frames):
    """One sample per video: 3 text tokens, a (T, 2, 2) video (one token per frame after merge 2), 1 text."""
    types = torch.tensor([[0, 0, 0] + [2] * t + [0] + [0] * (max(frames) - t) for t in frames])
    mask = torch.tensor([[1] * (4 + t) + [0] * (max(frames) - t) for t in frames])
    ids = torch.where(types == 2, tiny_qwen_vl.VIDEO_TOKEN, 1)
    return ids, types, mask, torch.tensor([[t, 2, 2] for t in frames])


@pytest.mark.parametrize("frames", [4, 64])
def test_qwen2_5_vl_temporal_ids_at_processor_frame_rates(frames):
    """Float32 second_per_grid_ts from the processor: temporal ids equal transformers' for every fps."""
    seconds = _processor_seconds(PROCESSOR_FPS)
    ids, types, mask, videos = _video_batch([frames] * len(PROCESSOR_FPS))
    expected, expected_deltas = _host_rope_index(
        "qwen2_5_vl", ids, types, mask, video_grid_thw=videos, second_per_grid_ts=seconds
    )
    ours, deltas = multimodal_position_ids(
        types, None, videos, mask, spatial_merge_size=2, video_time_interval=2 * seconds, vision_advance="spatial"
    )
    assert torch.equal(ours, expected) and torch.equal(deltas, expected_deltas)
    # the old rule (truncating the fp64 product of the float32 interval) misses the host on these inputs
    old = torch.floor(torch.arange(frames).double() * (2 * seconds[1]).double()).long()
    assert not torch.equal(old, expected[0, 1, 3 : 3 + frames] - 3)


def test_issue_example_2_4_fps():
    """tokens_per_second 2, grid (4, 2, 2), 2.4 fps: temporal ids 0, 1, 3, 5 after the text (fp64 gave 0, 1, 3, 4)."""
    ids, types, _, videos = _video_batch([4])
    seconds = _processor_seconds([2.4])
    expected, _ = _host_rope_index("qwen2_5_vl", ids, types, video_grid_thw=videos, second_per_grid_ts=seconds)
    ours, _ = multimodal_position_ids(
        types, None, videos, spatial_merge_size=2, video_time_interval=2 * seconds, vision_advance="spatial"
    )
    assert expected[0, 0].tolist() == [0, 1, 2, 3, 4, 6, 8, 4] and torch.equal(ours, expected)


def test_python_float_and_integer_intervals_follow_torch_promotion():
    types, videos = torch.tensor([[2] * 64]), torch.tensor([[64, 2, 2]])
    as_float, _ = multimodal_position_ids(types, None, videos, spatial_merge_size=2, video_time_interval=2 / 1.2)
    as_f32, _ = multimodal_position_ids(
        types, None, videos, spatial_merge_size=2, video_time_interval=torch.tensor(2 / 1.2)
    )
    as_int, _ = multimodal_position_ids(types, None, videos, spatial_merge_size=2, video_time_interval=3)
    assert torch.equal(as_float, as_f32)  # a Python float is held as float32, as PyTorch holds it
    assert torch.equal(as_float[0, 0], (torch.arange(64) * torch.tensor(2 / 1.2)).long())
    assert as_int[0, 0].tolist() == [3 * t for t in range(64)]


def test_vision_advance_rules_differ_only_when_time_outruns_space():
    # Qwen2.5-VL: 4 temporal patches 3 ids apart (interval 3) in a 2 x 3 grid: t reaches s + 9 > s + 3
    types = torch.tensor([[0, 0] + [2] * 24 + [0, 0]])
    video = torch.tensor([[4, 4, 6]])
    spatial, _ = multimodal_position_ids(
        types, None, video, spatial_merge_size=2, video_time_interval=3.0, vision_advance="spatial"
    )
    by_max, deltas = multimodal_position_ids(
        types, None, video, spatial_merge_size=2, video_time_interval=3.0, vision_advance="max"
    )
    assert spatial[0, 0, 2:26].unique().tolist() == [2, 5, 8, 11]
    assert spatial[:, 0, 26].tolist() == [5, 5, 5]  # transformers 5.x: s + max(H, W) / m, collides with t ids
    assert by_max[:, 0, 26].tolist() == [12, 12, 12]  # block max + 1
    assert deltas.item() == 13 + 1 - 28
    image_only = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 0]])
    a, _ = multimodal_position_ids(image_only, torch.tensor([[1, 4, 6]]), spatial_merge_size=2, vision_advance="max")
    b, _ = multimodal_position_ids(
        image_only, torch.tensor([[1, 4, 6]]), spatial_merge_size=2, vision_advance="spatial"
    )
    assert torch.equal(a, b)


def test_spatial_reset_invariants():
    segments = [("text", 3), ("image", 3, 5), ("text", 2), ("video", 3, 2, 4), ("text", 4)]
    plain = sequence_coords(segments).long()
    reset = sequence_coords(segments, spatial_reset=True).long()
    types, _, _ = segment_token_types(segments)
    text, vision = types == 0, types != 0
    assert torch.equal(plain[text], reset[text])
    assert torch.equal(plain[:, 0], reset[:, 0])  # temporal ids are never reset
    image = torch.arange(3, 18)
    assert reset[image, 1].tolist() == [0] * 5 + [1] * 5 + [2] * 5
    assert reset[image, 2].tolist() == list(range(5)) * 3
    assert reset[vision, 1:].min() == 0
    video = torch.arange(20, 44)
    assert reset[video, 1].max() == 1 and reset[video, 2].max() == 3
    for block, after in ((image, 18), (video, 44)):  # the token after a block sits at its (non-reset) max + 1
        assert (plain[after] == plain[block].max() + 1).all()


def test_text_only_is_plain_positions_and_rope_deltas_zero():
    ids, deltas = multimodal_position_ids(torch.zeros(2, 7, dtype=torch.long))
    assert torch.equal(ids, torch.arange(7).expand(3, 2, 7))
    assert deltas.tolist() == [[0], [0]]


def test_rope_deltas_and_decoding_continue_after_the_last_id():
    ids, types, mask, grids = _padded_batch("qwen2_vl")
    pos, deltas = multimodal_position_ids(
        types, grids["image_grid_thw"], grids["video_grid_thw"], mask, spatial_merge_size=2
    )
    for b in range(2):
        valid = pos[:, b, mask[b].bool()]
        assert deltas[b].item() == valid.max().item() + 1 - int(mask[b].sum())
    next_ids = decode_position_ids(deltas, past_length=mask.sum(-1), num_new=2)
    assert next_ids.shape == (3, 2, 2)
    for b in range(2):  # every sample, padded or not, continues right after its own largest id
        top = pos[:, b].max().item()
        assert next_ids[:, b].tolist() == [[top + 1, top + 2]] * 3


def test_batch_equals_samples_one_by_one():
    ids, types, mask, grids = _padded_batch("qwen3_vl")
    batch, deltas = multimodal_position_ids(
        types,
        grids["image_grid_thw"],
        grids["video_grid_thw"],
        mask,
        spatial_merge_size=2,
        split_video_frames=True,
        spatial_reset=True,
    )
    for b in range(2):
        keep = mask[b].bool()
        one, delta = multimodal_position_ids(
            types[b : b + 1, keep],
            grids["image_grid_thw"][b : b + 1],
            grids["video_grid_thw"][b : b + 1],
            spatial_merge_size=2,
            split_video_frames=True,
            spatial_reset=True,
        )
        assert torch.equal(batch[:, b, keep], one[:, 0])
        assert (batch[:, b, ~keep] == 0).all()
        assert delta.item() == deltas[b].item()


def test_inputs_are_not_modified():
    ids, types, mask, grids = _padded_batch("qwen2_vl")
    before = [t.clone() for t in (types, mask, grids["image_grid_thw"], grids["video_grid_thw"])]
    multimodal_position_ids(types, grids["image_grid_thw"], grids["video_grid_thw"], mask, spatial_merge_size=2)
    split_frames(grids["video_grid_thw"])
    for old, new in zip(before, (types, mask, grids["image_grid_thw"], grids["video_grid_thw"])):
        assert torch.equal(old, new)


def test_qwen3_split_frames():
    assert split_frames(torch.tensor([[3, 4, 6], [1, 2, 2]])).tolist() == [[1, 4, 6]] * 3 + [[1, 2, 2]]


@pytest.mark.parametrize(
    "call,match",
    [
        (
            lambda: multimodal_position_ids(
                torch.tensor([[0, 1, 1, 0]]), torch.tensor([[1, 4, 4], [1, 2, 2]]), spatial_merge_size=2
            ),
            "image_grid_thw has 2 grid",
        ),
        (
            lambda: multimodal_position_ids(
                torch.tensor([[0, 1, 1, 0]]), torch.tensor([[1, 4, 4]]), spatial_merge_size=2
            ),
            r"image_grid_thw\[0\] covers 4 .* block has 2",
        ),
        (
            lambda: multimodal_position_ids(torch.tensor([[0, 2, 2, 0]]), None, spatial_merge_size=2),
            "video block.* video_grid_thw is None",
        ),
        (
            lambda: multimodal_position_ids(
                torch.tensor([[0, 1, 1, 0]]), torch.tensor([[1, 3, 4]]), spatial_merge_size=2
            ),
            "multiples of spatial_merge_size=2",
        ),
        (lambda: multimodal_position_ids(torch.tensor([[0, 3]])), "0 \\(text\\), 1 \\(image\\) or 2"),
        (lambda: multimodal_position_ids(torch.tensor([[0, 0]]), attention_mask=torch.ones(1, 3)), "attention_mask"),
        (
            lambda: multimodal_position_ids(
                torch.tensor([[0, 2, 0]]), None, torch.tensor([[1, 1, 1]]), video_time_interval=[1.0, 2.0]
            ),
            "one per video",
        ),
        (lambda: multimodal_position_ids(torch.tensor([[0, 0]]), design="vrope", spatial_reset=True), "spatial_reset"),
        (lambda: multimodal_position_ids(torch.tensor([[0, 0]]), vision_advance="min"), "vision_advance"),
        (
            lambda: multimodal_position_ids(torch.tensor([[0, 0]]), design="vrope", video_time_interval=2.0),
            "VRoPE lays frames out consecutively",
        ),
        (lambda: segment_token_types([("text", 2), ("audio", 3)]), r"segments\[1\]"),
        (lambda: multimodal_position_ids(torch.zeros(4)), r"token_types must be an integer tensor \(B, L\)"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
