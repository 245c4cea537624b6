"""Poses (OpenCV convention, converters, validation) and trajectories (RealEstate10K, JSON, presets)."""

import math

import pytest
import torch

from mmpos.camera import (
    PRESETS,
    Trajectory,
    axis_angle_to_matrix,
    check_pose,
    invert_pose,
    load_trajectory,
    look_at,
    opengl_to_opencv,
    orthonormalize,
    pose_from_rotation_translation,
    preset_trajectory,
    read_re10k,
    save_trajectory,
)

F64 = torch.float64


def random_poses(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    rotation = orthonormalize(torch.randn(n, 3, 3, generator=g, dtype=F64))
    return pose_from_rotation_translation(rotation, torch.randn(n, 3, generator=g, dtype=F64))


def test_invert_pose_is_the_matrix_inverse():
    poses = random_poses(5)
    assert torch.allclose(invert_pose(poses), torch.linalg.inv(poses), atol=1e-14)
    assert torch.allclose(invert_pose(invert_pose(poses)), poses, atol=1e-15)


def test_opengl_camera_converts_to_opencv_axes():
    # an OpenGL camera at the origin looking down world -z with y up: in OpenCV axes it looks along -z
    # (camera z = forward = world -z) with its y axis pointing down (world -y)
    c2w_gl = torch.eye(4, dtype=F64)
    c2w_cv = opengl_to_opencv(c2w_gl)
    assert c2w_cv[:3, 2].tolist() == [0, 0, -1] and c2w_cv[:3, 1].tolist() == [0, -1, 0]
    point_world = torch.tensor([0.3, 0.2, -2.0, 1.0], dtype=F64)  # in front of the camera, above-right
    in_cam = invert_pose(c2w_cv) @ point_world
    assert in_cam[2] > 0 and in_cam[1] < 0 and in_cam[0] > 0  # OpenCV: z forward, y down (above: negative)
    assert torch.equal(opengl_to_opencv(c2w_cv), c2w_gl)


def test_look_at_points_the_optical_axis_at_the_target():
    eye = torch.tensor([1.0, -0.5, -2.0], dtype=F64)
    target = torch.tensor([0.2, 0.1, 0.7], dtype=F64)
    c2w = look_at(eye, target)
    check_pose("c2w", c2w, tol=1e-12)
    direction = (target - eye) / (target - eye).norm()
    assert torch.allclose(c2w[:3, 2], direction, atol=1e-15)
    assert c2w[1, 1] > 0  # camera y (down) has a positive world-y (down) component


@pytest.mark.parametrize(
    "matrix, match",
    [
        (torch.diag(torch.tensor([1.0, 1.0, 1.01, 1.0], dtype=F64)), "not a rotation"),
        (torch.diag(torch.tensor([1.0, 1.0, -1.0, 1.0], dtype=F64)), "not a rotation"),  # a reflection
        (torch.full((4, 4), float("nan"), dtype=F64), "non-finite"),
        (torch.eye(3, dtype=F64), r"\[..., 4, 4\]"),
    ],
)
def test_invalid_poses_raise(matrix, match):
    with pytest.raises(ValueError, match=match):
        check_pose("c2w", matrix)


def test_rotation_tolerance_is_documented_and_applied():
    nearly = torch.eye(4, dtype=F64)
    nearly[0, 1] = 5e-5  # within 1e-4: accepted (6 significant digits in files)
    check_pose("c2w", nearly)
    nearly[0, 1] = 5e-4
    with pytest.raises(ValueError, match="<= 0.0001"):
        check_pose("c2w", nearly)


def _trajectory(n=6):
    intrinsics = torch.tensor([[0.9, 1.6, 0.5, 0.5]], dtype=F64).repeat(n, 1) + torch.rand(n, 4, dtype=F64) * 0.01
    return Trajectory(random_poses(n, 3), intrinsics, torch.arange(n, dtype=F64) * 33366, "https://youtu.be/x")


@pytest.mark.parametrize("suffix", [".txt", ".json"])
def test_trajectory_files_round_trip(tmp_path, suffix):
    traj = _trajectory()
    back = load_trajectory(save_trajectory(traj, tmp_path / f"clip{suffix}"))
    assert torch.allclose(back.c2w, traj.c2w, atol=1e-14) and torch.equal(back.intrinsics, traj.intrinsics)
    assert torch.equal(back.timestamps, traj.timestamps) and back.url == traj.url


def test_re10k_layout_is_world_to_camera_with_normalised_intrinsics(tmp_path):
    w2c = random_poses(1, 7)[0]
    row = [1000, 0.8, 1.4, 0.45, 0.55, 0, 0] + w2c[:3].flatten().tolist()
    path = tmp_path / "clip.txt"
    path.write_text("https://www.youtube.com/watch?v=abc\n" + " ".join(map(repr, row)) + "\n")
    traj = read_re10k(path)
    assert torch.allclose(traj.w2c[0], w2c, atol=1e-14)
    assert traj.intrinsics[0].tolist() == [0.8, 1.4, 0.45, 0.55] and traj.timestamps.tolist() == [1000.0]
    k = traj.intrinsic_matrices(640, 360)[0]
    assert k[0, 0] == pytest.approx(512) and k[1, 1] == pytest.approx(504) and k[1, 2] == pytest.approx(198)


@pytest.mark.parametrize(
    "content, match",
    [
        ("url\n1 2 3\n", r"clip.txt:2: 3 columns; a RealEstate10K pose line has 19"),
        ("url\n" + " ".join(["0"] * 20) + "\n", "20 columns"),
        ("url\n" + " ".join(["1"] * 19) + "\n", "not a rotation"),
        ("", "empty file"),
    ],
)
def test_bad_re10k_files_raise(tmp_path, content, match):
    path = tmp_path / "clip.txt"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        read_re10k(path)


def test_bad_json_files_raise(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"format": "mmpos.trajectory", "frames": [{"c2w": [[1, 0, 0]], "intrinsics": [1, 1, 0.5, 0.5]}]}')
    with pytest.raises(ValueError, match=r"frames\[0\].c2w must be a 4x4"):
        load_trajectory(path)
    path.write_text('{"frames": []}')
    with pytest.raises(ValueError, match="not a mmpos.trajectory file"):
        load_trajectory(path)


def test_trajectory_rejects_bad_intrinsics():
    with pytest.raises(ValueError, match="focal lengths"):
        Trajectory(random_poses(2), torch.tensor([[1.0, -1.0, 0.5, 0.5]] * 2, dtype=F64))
    with pytest.raises(ValueError, match="non-finite"):
        Trajectory(random_poses(2), torch.tensor([[1.0, float("inf"), 0.5, 0.5]] * 2, dtype=F64))


@pytest.mark.parametrize("name", PRESETS)
def test_presets_are_smooth_valid_and_start_still(name):
    traj = preset_trajectory(name, 129)
    assert len(traj) == 129
    check_pose("c2w", traj.c2w, tol=1e-12)
    state = torch.cat([traj.c2w.flatten(1), traj.intrinsics], -1)
    velocity = state.diff(dim=0)
    assert velocity.abs().sum() > 0.1  # it moves
    peak = velocity.abs().max()
    assert velocity[0].abs().max() < 0.1 * peak and velocity[-1].abs().max() < 0.1 * peak  # eased ends
    assert velocity.diff(dim=0).abs().max() < 0.2 * peak  # no jumps: speed changes by < 20% of its peak a frame


def test_preset_directions():
    assert preset_trajectory("dolly_in", 5).c2w[-1, 2, 3] > 0 > preset_trajectory("dolly_out", 5).c2w[-1, 2, 3]
    assert preset_trajectory("pan", 5, degrees=30).c2w[-1, 0, 2] == pytest.approx(math.sin(math.radians(30)))
    assert preset_trajectory("tilt", 5, degrees=20).c2w[-1, 1, 2] == pytest.approx(-math.sin(math.radians(20)))
    assert preset_trajectory("zoom_in", 5).intrinsics[-1, 0] == pytest.approx(
        2 * preset_trajectory("zoom_in", 5).intrinsics[0, 0]
    )
    orbit = preset_trajectory("orbit", 9, degrees=180)
    target = torch.tensor([0, 0, 2.0], dtype=F64)
    to_target = target - orbit.c2w[:, :3, 3]
    assert torch.allclose(to_target.norm(dim=-1), torch.full((9,), 2.0, dtype=F64))
    assert torch.allclose(orbit.c2w[:, :3, 2], to_target / 2, atol=1e-12)  # always looking at the target
    assert torch.allclose(orbit.c2w[0], torch.eye(4, dtype=F64), atol=1e-15)
    with pytest.raises(ValueError, match="name='spin'"):
        preset_trajectory("spin", 4)


def test_axis_angle_matches_matrix_exponential():
    v = torch.randn(4, 3, dtype=F64)
    skew = torch.zeros(4, 3, 3, dtype=F64)
    skew[:, 0, 1], skew[:, 0, 2], skew[:, 1, 2] = -v[:, 2], v[:, 1], -v[:, 0]
    skew = skew - skew.transpose(-1, -2)
    assert torch.allclose(axis_angle_to_matrix(v), torch.linalg.matrix_exp(skew), atol=1e-14)


def test_sample_assets_are_the_documented_preset():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "assets" / "cameras"
    expected = preset_trajectory("arc", 25, degrees=60)
    for name in ("arc_re10k.txt", "arc.json"):
        traj = load_trajectory(root / name)
        assert torch.allclose(traj.c2w, expected.c2w, atol=1e-14) and torch.equal(traj.intrinsics, expected.intrinsics)


def test_matrix_to_axis_angle_inverts_rodrigues_including_pi_and_zero():
    from mmpos.camera import matrix_to_axis_angle

    g = torch.Generator().manual_seed(0)
    axes = torch.nn.functional.normalize(torch.randn(6, 3, generator=g, dtype=F64), dim=-1)
    angles = torch.tensor([0.0, 1e-9, 0.3, 2.0, math.pi - 1e-9, math.pi], dtype=F64)
    vectors = axes * angles[:, None]
    recovered = matrix_to_axis_angle(axis_angle_to_matrix(vectors))
    assert torch.allclose(axis_angle_to_matrix(recovered), axis_angle_to_matrix(vectors), atol=1e-12)
    assert torch.allclose(recovered[:4], vectors[:4], atol=1e-12)
    assert torch.allclose(recovered.norm(dim=-1), angles, atol=1e-7)


def test_resample_keeps_frames_and_interpolates_on_the_geodesic():
    from mmpos.camera import resample

    pan = preset_trajectory("pan", 5, degrees=40)
    same = resample(pan, 5)
    assert torch.allclose(same.c2w, pan.c2w, atol=1e-14) and torch.allclose(same.intrinsics, pan.intrinsics)
    dense = resample(pan, 9)  # every other frame is an original one, the others lie halfway on the rotation
    assert torch.allclose(dense.c2w[::2], pan.c2w, atol=1e-14)
    yaw = torch.atan2(dense.c2w[:, 0, 2], dense.c2w[:, 2, 2])
    original = torch.atan2(pan.c2w[:, 0, 2], pan.c2w[:, 2, 2])
    assert torch.allclose(yaw[1::2], (original[:-1] + original[1:]) / 2, atol=1e-14)
    check_pose("c2w", resample(preset_trajectory("orbit", 7), 50).c2w, tol=1e-12)
    assert torch.allclose(resample(pan, 3).timestamps, torch.tensor([0.0, 2.0, 4.0], dtype=F64))


@pytest.mark.parametrize(
    "matrix", [torch.zeros(3, 3), torch.diag(torch.tensor([2.0, 0.0, 0.0])), torch.full((2, 3, 3), float("nan"))]
)
def test_orthonormalize_refuses_matrices_without_a_unique_nearest_rotation(matrix):
    from mmpos.camera import orthonormalize

    with pytest.raises(ValueError, match="rotation has"):
        orthonormalize(matrix)


def test_orthonormalize_of_a_rank_2_matrix_is_still_a_rotation():
    from mmpos.camera import orthonormalize

    rotation = orthonormalize(torch.diag(torch.tensor([3.0, 1.0, 0.0], dtype=torch.float64)))
    assert torch.allclose(rotation, torch.eye(3, dtype=torch.float64))
