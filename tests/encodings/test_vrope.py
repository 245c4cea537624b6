"""VRoPE: the worked example of the notes, index invariants, relative property, decoding state, DiT grids."""

import pytest
import torch

import mmpos
from mmpos.coords import vrope
from mmpos.coords.multimodal import multimodal_position_ids, sequence_coords
from mmpos.spectrum import rope_inv_freq
from tests.conftest import logits

# rope-variants.md 3.2: text 3, video T=2 h=2 w=3 (K = 4), text 2; pairs 0-3 (pairs 4+ repeat)
WORKED_EXAMPLE = [
    [0, 1, 2, 3, 4, 5, 4, 5, 6, 7, 8, 9, 8, 9, 10, 11, 12],
    [0, 1, 2, 5, 4, 3, 6, 5, 4, 9, 8, 7, 10, 9, 8, 11, 12],
    [0, 1, 2, 4, 5, 6, 3, 4, 5, 8, 9, 10, 7, 8, 9, 11, 12],
    [0, 1, 2, 6, 5, 4, 5, 4, 3, 10, 9, 8, 9, 8, 7, 11, 12],
]
SEGMENTS = [("text", 3), ("video", 2, 2, 3), ("text", 2)]


def test_worked_example_exactly():
    ids, state = vrope.sequence_ids(SEGMENTS)
    per_pair = vrope.pair_ids(ids, num_pairs=8)
    assert per_pair[:, :4].T.tolist() == WORKED_EXAMPLE
    assert torch.equal(per_pair[:, 4:], per_pair[:, :4])  # channel cycling: pair f reads variant f % 4
    assert state.index == 13


def test_batched_builder_equals_the_segment_builder():
    batched = sequence_coords(SEGMENTS, design="vrope").long()
    assert torch.equal(batched, vrope.sequence_ids(SEGMENTS)[0])
    types = torch.tensor([[0] * 3 + [2] * 12 + [0] * 2])
    ids, deltas = multimodal_position_ids(types, None, torch.tensor([[2, 2, 3]]), design="vrope")
    assert ids.shape == (4, 1, 17) and deltas.item() == 13 - 17


@pytest.mark.parametrize("frames,height,width,start", [(3, 4, 5, 7), (1, 1, 6, 0), (2, 5, 1, 3)])
def test_index_invariants(frames, height, width, start):
    ids = vrope.video_block_ids(frames, height, width, start)
    span = height + width - 1
    assert ids.min() == start and ids[0, 0] == start  # continuity with the text before (top-left, v0)
    assert ids.max() == start + frames * span - 1 == ids[-1, 0]  # the text after starts at start + T K
    v0, v1, v2, v3 = ids.unbind(-1)
    assert torch.equal(v0 + v3, v1 + v2)  # symmetry (both equal 2 (start + t K) + h + w - 2)
    per_frame = ids.view(frames, height * width, 4)
    for t in range(frames):
        base = start + t * span
        assert per_frame[t].min() >= base and per_frame[t].max() <= base + span - 1  # frames do not overlap
        centre = per_frame[t].double().mean(-1)  # mean of the 4 variants = frame centre, for every token
        assert torch.equal(centre, torch.full_like(centre, base + (span - 1) / 2))


def test_shared_text_does_not_advance_and_decoding_continues():
    state = vrope.VRoPEState()
    prefix = state.ids([("text", 2), ("image", 2, 2)])
    first = state.ids([("shared_text", 3)])
    second = state.ids([("shared_text", 2)])
    assert state.index == 2 + 3 and torch.equal(first[:2], second)  # candidates start at the same index
    assert first[:, 0].tolist() == [5, 6, 7]
    steps = [state.next_text() for _ in range(3)]
    assert [s[0, 0].item() for s in steps] == [5, 6, 7] and state.index == 8
    assert prefix.max() == 4


def test_compact_ids_round_trip():
    ids, _ = vrope.sequence_ids([("text", 2), ("video", 3, 3, 4), ("image", 2, 5), ("text", 1)])
    assert torch.equal(vrope.expand_ids(vrope.compact_ids(ids)), ids)


def test_text_only_is_plain_rope_bit_for_bit():
    ids, _ = vrope.sequence_ids([("text", 11)])
    pe = mmpos.create_pe("vrope", head_dim=32, theta=1e6)
    plain = mmpos.create_pe("rope_1d", head_dim=32, theta=1e6)
    assert torch.equal(pe.table(ids.float()).cis, plain.table(torch.arange(11.0)).cis)


def test_table_reads_per_pair_ids():
    ids, _ = vrope.sequence_ids(SEGMENTS)
    pe = mmpos.create_pe("vrope", head_dim=16, theta=100.0)
    table = pe.table(ids.double(), torch.float64)
    expected = vrope.pair_ids(ids, 8).double() * rope_inv_freq(16, 100.0)
    assert torch.allclose(table.cis, torch.polar(torch.ones_like(expected), expected), atol=1e-14, rtol=0)


def test_relative_property_fp64():
    """Logits depend only on per-pair id differences: shifting every id by a constant changes nothing, and a
    pair of tokens with the same per-variant offsets gives the same logit wherever it sits."""
    pe = mmpos.create_pe("vrope", head_dim=32, theta=100.0)
    ids, _ = vrope.sequence_ids([("text", 4), ("video", 2, 3, 4), ("text", 3)])
    q, k = (
        torch.randn(2, 2, ids.shape[0], 32, dtype=torch.float64),
        torch.randn(2, 2, ids.shape[0], 32, dtype=torch.float64),
    )
    base = logits(*pe(q, k, ids.double()))
    shifted = logits(*pe(q, k, ids.double() + 1234))
    assert torch.allclose(base, shifted, atol=1e-10, rtol=0)
    # tokens (frame 0, 0, 0) -> (0, 1, 2) and (frame 1, 1, 1) -> (1, 2, 3): same per-variant offsets
    video = vrope.video_block_ids(2, 3, 4)
    a, b = video[[0, 6]].double(), video[[12 + 5, 12 + 11]].double()
    assert torch.equal(a[1] - a[0], b[1] - b[0])
    qk = torch.randn(2, 1, 1, 1, 32, dtype=torch.float64)
    la = logits(pe.rotate(qk[0], pe.table(a[:1], torch.float64)), pe.rotate(qk[1], pe.table(a[1:], torch.float64)))
    lb = logits(pe.rotate(qk[0], pe.table(b[:1], torch.float64)), pe.rotate(qk[1], pe.table(b[1:], torch.float64)))
    assert torch.allclose(la, lb, atol=1e-12, rtol=0)


def test_video_dit_grid():
    """VRoPE on a video DiT's (t, row, col) grid with [B, L, H, D] activations and the interleaved layout."""
    coords = vrope.video_grid_ids(2, 3, 5)
    pe = mmpos.create_pe("vrope", head_dim=64, layout="interleaved", seq_dim=-3)
    q = torch.randn(2, 30, 4, 64)
    out_q, out_k = pe(q, q, coords)
    assert out_q.shape == q.shape and torch.equal(out_q, out_k)
    assert torch.allclose(out_q.norm(dim=-1), q.norm(dim=-1), atol=1e-5)  # rotations keep norms


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: vrope.sequence_ids([("text", 2), ("video", 2, 3)]), r"segments\[1\].*takes 3 size"),
        (lambda: vrope.sequence_ids([("audio", 2)]), r"segments\[0\]"),
        (lambda: vrope.sequence_ids([("image", 0, 3)]), "positive integer"),
        (lambda: vrope.pair_ids(torch.zeros(5, 3), 8), r"\[\.\.\., 4\]"),
        (lambda: vrope.expand_ids(torch.zeros(5, 4)), "3 entries"),
        (
            lambda: mmpos.create_pe("vrope", head_dim=32)(
                torch.randn(1, 1, 5, 32), torch.randn(1, 1, 5, 32), torch.zeros(5, 3)
            ),
            r"\[L, 4\]",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
