"""Ground-truth metrics on rendered scenes, where the right answer is known."""

import numpy as np

from mmpos.eval.metrics import colour_mask, insertion_scores, iou, layout_copy, palette_similarity, texture_similarity
from mmpos.world import render_scene, sample_scene
from mmpos.world.edit_pairs import style_set, transplant_pair


def test_colour_mask_recovers_rendered_object_masks():
    for seed in range(8):
        rendered = render_scene(sample_scene(seed))
        for obj, mask in zip(rendered.spec.objects, rendered.masks):
            same_colour = [m for o, m in zip(rendered.spec.objects, rendered.masks) if o.colour == obj.colour]
            assert np.array_equal(colour_mask(rendered.image, obj.colour), np.any(same_colour, axis=0))


def test_style_metrics_separate_style_from_layout():
    styles = style_set(2, count=3)
    reference = styles.reference
    other_style = style_set(11, count=1).reference
    for target in styles.targets:
        assert palette_similarity(target.image, reference.image) > palette_similarity(
            other_style.image, reference.image
        )
        assert texture_similarity(target.image, reference.image) > 0.8
        assert (
            layout_copy(target.image, reference.masks, reference.spec.style.background)
            < layout_copy(reference.image, reference.masks, reference.spec.style.background)
            == 1.0
        )
    assert texture_similarity(reference.image, reference.image) == 1.0


def test_insertion_scores_on_ground_truth_and_on_nothing_inserted():
    pair = transplant_pair(3)
    obj = pair.target.spec.objects[-1]
    region = np.zeros_like(pair.mask)
    x0, y0, x1, y1 = pair.box
    region[y0:y1, x0:x1] = True
    perfect = insertion_scores(pair.target.image, pair.background.image, pair.mask, obj.colour, region)
    assert perfect["mask_iou"] == 1.0 and perfect["outside_change"] == 0.0 and perfect["colour_error"] < 0.3
    empty = insertion_scores(pair.background.image, pair.background.image, pair.mask, obj.colour, region)
    assert empty["mask_iou"] == 0.0 and empty["colour_error"] == 1.0
    assert iou(np.zeros((2, 2), bool), np.zeros((2, 2), bool)) == 1.0
