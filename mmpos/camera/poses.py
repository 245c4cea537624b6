"""Camera poses as 4x4 matrices, in one convention.

- Camera axes are OpenCV's: x right, y down, z forward.
- ``c2w`` (camera-to-world) maps camera-frame points to world points; its last column is the camera centre.
  ``w2c`` is its inverse (the "extrinsics", "viewmat"). Both are ``[..., 4, 4]`` with last row ``(0, 0, 0, 1)``.
- A 3x3 block is accepted as a rotation when ``max |R^T R - I| <= tol`` and ``|det R - 1| <= tol`` with
  ``tol = ROTATION_TOLERANCE = 1e-4`` by default: loose enough for poses stored with 6 significant digits
  (RealEstate10K) or computed in float32 (error ~1e-7), tight enough to reject scaled, sheared or reflected
  matrices. Use :func:`orthonormalize` to project a nearly-rotation onto SO(3) first.

Converters: :func:`opengl_to_opencv` (OpenGL, Blender, NeRF/three.js cameras: x right, y up, looking
down -z) and the RealEstate10K row layout in :mod:`mmpos.camera.trajectory`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._validation import check_finite, check_float_coords

ROTATION_TOLERANCE = 1e-4
_FLIP_YZ = (1.0, -1.0, -1.0, 1.0)


def check_rotation(name: str, rotation: torch.Tensor, tol: float = ROTATION_TOLERANCE) -> None:
    """Raise ``ValueError`` unless ``rotation [..., 3, 3]`` is orthonormal with determinant +1 within ``tol``."""
    check_float_coords(name, rotation)
    if rotation.dim() < 2 or rotation.shape[-2:] != (3, 3):
        raise ValueError(f"{name} must be [..., 3, 3], got {tuple(rotation.shape)}")
    check_finite(name, rotation)
    r = rotation.double()
    gram_error = (r.transpose(-1, -2) @ r - torch.eye(3, dtype=r.dtype, device=r.device)).abs().amax()
    det_error = (torch.linalg.det(r) - 1).abs().amax() if r.numel() else r.new_zeros(())
    if gram_error > tol or det_error > tol:
        raise ValueError(
            f"{name} is not a rotation: max |R^T R - I| = {gram_error.item():.2e}, "
            f"max |det R - 1| = {det_error.item():.2e}; expected both <= {tol:g} (orthonormal, "
            "right-handed; see mmpos.camera.orthonormalize)"
        )


def check_pose(name: str, pose: torch.Tensor, tol: float = ROTATION_TOLERANCE) -> torch.Tensor:
    """Validate a rigid pose ``[..., 4, 4]`` (or ``[..., 3, 4]``, which is completed); returns ``[..., 4, 4]``."""
    check_float_coords(name, pose)
    if pose.dim() < 2 or pose.shape[-1] != 4 or pose.shape[-2] not in (3, 4):
        raise ValueError(f"{name} must be [..., 4, 4] or [..., 3, 4], got {tuple(pose.shape)}")
    check_finite(name, pose)
    if pose.shape[-2] == 3:
        pose = complete_pose(pose)
    bottom = pose[..., 3, :] - torch.tensor([0.0, 0, 0, 1], dtype=pose.dtype, device=pose.device)
    if pose.numel() and bottom.abs().amax() > tol:
        raise ValueError(f"{name} must have last row (0, 0, 0, 1); it differs by {bottom.abs().amax().item():.2e}")
    check_rotation(f"{name}[..., :3, :3]", pose[..., :3, :3], tol)
    return pose


def complete_pose(pose34: torch.Tensor) -> torch.Tensor:
    """``[..., 3, 4]`` -> ``[..., 4, 4]`` with last row ``(0, 0, 0, 1)``."""
    bottom = torch.zeros(*pose34.shape[:-2], 1, 4, dtype=pose34.dtype, device=pose34.device)
    bottom[..., 3] = 1
    return torch.cat([pose34, bottom], dim=-2)


def pose_from_rotation_translation(rotation: torch.Tensor, translation: torch.Tensor) -> torch.Tensor:
    """``[R | t]`` as ``[..., 4, 4]``."""
    return complete_pose(torch.cat([rotation, translation[..., None]], dim=-1))


def invert_pose(pose: torch.Tensor) -> torch.Tensor:
    """Analytic inverse of a rigid pose (``[R^T | -R^T t]``): c2w <-> w2c, exact in rotation."""
    rotation_t = pose[..., :3, :3].transpose(-1, -2)
    return pose_from_rotation_translation(rotation_t, -(rotation_t @ pose[..., :3, 3:])[..., 0])


c2w_to_w2c = invert_pose
w2c_to_c2w = invert_pose


def camera_centers(c2w: torch.Tensor) -> torch.Tensor:
    """``[..., 3]`` camera centres of ``c2w [..., 4, 4]``."""
    return c2w[..., :3, 3]


def opengl_to_opencv(c2w_gl: torch.Tensor) -> torch.Tensor:
    """Camera-to-world of an OpenGL/Blender camera (x right, y up, looks down -z) -> OpenCV axes.

    Flips the camera's y and z axes (``c2w @ diag(1, -1, -1, 1)``); world axes are left as they are. The
    same function converts back (the flip is its own inverse).
    """
    flip = torch.tensor(_FLIP_YZ, dtype=c2w_gl.dtype, device=c2w_gl.device)
    return c2w_gl * flip  # scales the columns: the camera axes


opencv_to_opengl = opengl_to_opencv
blender_to_opencv = opengl_to_opencv


def orthonormalize(rotation: torch.Tensor) -> torch.Tensor:
    """Nearest rotation (Frobenius) to ``rotation [..., 3, 3]`` via SVD, with determinant +1.

    Refuses matrices of rank below 2 (e.g. zeros), whose nearest rotation is not unique, and non-finite ones."""
    if rotation.shape[-2:] != (3, 3):
        raise ValueError(f"rotation has shape {tuple(rotation.shape)}; expected [..., 3, 3]")
    if not bool(torch.isfinite(rotation).all()):
        raise ValueError("rotation has non-finite entries (NaN or inf)")
    u, singular, vh = torch.linalg.svd(rotation)
    tolerance = singular[..., 0] * 3 * torch.finfo(singular.dtype).eps  # numpy's matrix_rank: what rounding leaves
    if rotation.numel() and not bool(((singular[..., 0] > 0) & (singular[..., 1] > tolerance)).all()):
        raise ValueError(
            "rotation has rank below 2 (e.g. all zeros): no unique nearest rotation; expected a "
            "matrix close to a rotation"
        )
    sign = torch.linalg.det(u @ vh).sign()
    u = torch.cat([u[..., :2], u[..., 2:] * sign[..., None, None]], dim=-1)
    return u @ vh


def axis_angle_to_matrix(axis_angle: torch.Tensor) -> torch.Tensor:
    """Rodrigues' formula: ``[..., 3]`` rotation vectors (axis times angle in radians) -> ``[..., 3, 3]``."""
    angle = axis_angle.norm(dim=-1, keepdim=True)
    axis = axis_angle / angle.clamp_min(1e-300)
    x, y, z = axis.unbind(-1)
    zero = torch.zeros_like(x)
    cross = torch.stack([zero, -z, y, z, zero, -x, -y, x, zero], -1).unflatten(-1, (3, 3))
    sin, cos = angle.sin()[..., None], angle.cos()[..., None]
    eye = torch.eye(3, dtype=axis_angle.dtype, device=axis_angle.device)
    return eye + sin * cross + (1 - cos) * (cross @ cross)


def matrix_to_axis_angle(rotation: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`axis_angle_to_matrix`: ``[..., 3, 3]`` -> ``[..., 3]`` with angles in ``[0, pi]``
    (stable near 0 and at pi, where the axis comes from ``(R + I) / 2 = a a^T``)."""
    trace = rotation[..., 0, 0] + rotation[..., 1, 1] + rotation[..., 2, 2]
    angle = torch.acos(((trace - 1) / 2).clamp(-1, 1))
    vee = torch.stack(
        [
            rotation[..., 2, 1] - rotation[..., 1, 2],
            rotation[..., 0, 2] - rotation[..., 2, 0],
            rotation[..., 1, 0] - rotation[..., 0, 1],
        ],
        -1,
    )  # 2 sin(angle) axis
    sine = vee.norm(dim=-1) / 2
    regular = sine > 1e-6
    factor = torch.where(regular, angle / (2 * sine.clamp_min(1e-6)), 0.5 + angle**2 / 12)
    result = vee * factor[..., None]
    near_pi = ~regular & (trace < 0)
    if bool(near_pi.any()):
        outer = (rotation + torch.eye(3, dtype=rotation.dtype, device=rotation.device)) / 2  # a a^T at angle pi
        column = outer.diagonal(dim1=-2, dim2=-1).argmax(-1)
        axis = torch.gather(outer, -1, column[..., None, None].expand(*column.shape, 3, 1))[..., 0]
        axis = axis / axis.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        result = torch.where(near_pi[..., None], axis * angle[..., None], result)
    return result


def look_at(
    eye: torch.Tensor, target: torch.Tensor, down: Sequence[float] | torch.Tensor = (0.0, 1.0, 0.0)
) -> torch.Tensor:
    """OpenCV camera-to-world ``[..., 4, 4]`` at ``eye`` looking at ``target``, with the camera's y axis as
    close as possible to the world ``down`` direction (default +y: the y-down world of RealEstate10K)."""
    down_t = torch.as_tensor(down, dtype=eye.dtype, device=eye.device).expand_as(eye)
    z = target - eye
    z = z / z.norm(dim=-1, keepdim=True)
    y = down_t - (down_t * z).sum(-1, keepdim=True) * z
    norm = y.norm(dim=-1, keepdim=True)
    if bool((norm < 1e-9).any()):
        raise ValueError("look_at: the viewing direction is parallel to `down`; the roll is undefined")
    y = y / norm
    x = torch.cross(y, z, dim=-1)
    return pose_from_rotation_translation(torch.stack([x, y, z], dim=-1), eye)
