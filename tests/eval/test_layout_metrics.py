"""Layout and repetition scores against the scene's ground truth (mmpos.eval.layout_metrics)."""

import numpy as np

from mmpos.eval.layout_metrics import connected_components, dominant_period, layout_scores
from mmpos.world.render import render_scene
from mmpos.world.scene import ObjectSpec, SceneSpec, SceneStyle


def scene():
    style = SceneStyle("white", "stripes", "flat")
    return SceneSpec(
        32,
        style,
        (ObjectSpec("square", "red", (2, 2, 12, 12), "small"), ObjectSpec("circle", "blue", (18, 18, 30, 30), "small")),
    )


def test_connected_components_are_four_connected():
    mask = np.array([[1, 1, 0, 0], [0, 1, 0, 1], [0, 0, 1, 1], [1, 0, 0, 0]], dtype=bool)
    labels, count = connected_components(mask)
    assert count == 3  # the diagonal touch at (1,1)-(2,2) does not connect
    assert labels[0, 0] == labels[1, 1] != labels[2, 2] == labels[1, 3]


def test_ground_truth_scores_perfectly_and_a_tiled_scene_is_a_repetition():
    spec = scene()
    image = render_scene(spec).image
    assert layout_scores(image, spec) == {
        "count_error": 0.0,
        "duplicated": 0.0,
        "position_acc": 1.0,
        "period_ratio": 1.0,
    }
    tiled = layout_scores(np.tile(image, (2, 2, 1)), spec)
    assert tiled["duplicated"] == 1.0 and tiled["count_error"] >= 2 and tiled["position_acc"] < 1
    zoomed = layout_scores(image.repeat(2, 0).repeat(2, 1), spec)  # the same scene, twice the size
    assert zoomed["count_error"] == 0.0 and zoomed["position_acc"] == 1.0 and zoomed["period_ratio"] == 2.0


def test_dominant_period_of_stripes():
    image = render_scene(SceneSpec(48, SceneStyle("gray", "stripes", "flat"))).image
    assert abs(dominant_period(image, "gray") - 6 / np.sqrt(2)) < 1e-9  # (x + y) stripes, 6 px along x
