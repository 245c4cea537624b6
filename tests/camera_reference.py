"""Independent fp64 re-derivations of the camera encodings' reference formulas (PRoPE/GTA, UCPE, RayRoPE), sign
conventions included, written from ``specs/rope-variants.md`` sections 4 and 5 and the papers: loops and explicit
matrices, no mmpos operator. Tokens are camera-major, row-major inside an image (column fastest).

Reference convention, split layout ``x = [x1 | x2]`` of a channel block, ``c, s`` the token's (expected) cos, sin::

    rot_minus(x) = [x1 c + x2 s, -x1 s + x2 c]     applied to q, k, v  (rotation by -theta)
    rot_plus(x)  = [x1 c - x2 s,  x1 s + x2 c]     applied to the attention output (rotation by +theta)
"""

from __future__ import annotations

import math

import torch

F64 = torch.float64


def rot_minus(x, c, s):
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * c + x2 * s, -x1 * s + x2 * c], -1)


def rot_plus(x, c, s):
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1)


def softmax_attention(q, k, v):
    weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return weights @ v


# --- PRoPE / GTA / UCPE: per-token 4x4 on the first half, 2D RoPE (x block, y block) on the rest -------------
def patch_positions(cameras, rows, cols):
    """``[L]`` column and row index of every token (x cycles fastest)."""
    index = torch.arange(rows * cols).repeat(cameras)
    return (index % cols).to(F64), (index // cols).to(F64)


def rope_2d_cos_sin(cols, rows, rope_dim, base=100.0):
    """cos, sin ``[L, rope_dim / 4]`` for the x block and the y block: ``w_n = base^(-n / num_freqs)``."""
    num_freqs = rope_dim // 4
    omega = base ** (-torch.arange(num_freqs, dtype=F64) / num_freqs)
    return [(torch.cos(p[:, None] * omega), torch.sin(p[:, None] * omega)) for p in (cols, rows)]


def _rope_blocks(x, tables, rotate):
    half = x.shape[-1] // 2
    blocks = [x[..., :half], x[..., half:]]
    return torch.cat([rotate(b, c, s) for b, (c, s) in zip(blocks, tables)], -1)


def _project(x, matrices):
    """``x [B, H, L, n]`` chunks of 4 multiplied by ``matrices [B, L, 4, 4]`` token by token."""
    b, h, length, n = x.shape
    chunks = x.reshape(b, h, length, n // 4, 4)
    return torch.einsum("blij,bhlnj->bhlni", matrices, chunks).reshape(b, h, length, n)


def projective_attention(q, k, v, matrices, cameras, grid):
    """The GTA/PRoPE/UCPE operator: ``P^T q``, ``P^-1 k``, ``P^-1 v``, ``P o`` on the first half of the head,
    ``rot_minus`` on q, k, v and ``rot_plus`` on the output for the 2D RoPE half. ``matrices [B, L, 4, 4]``."""
    d = q.shape[-1]
    n = d // 2
    tables = rope_2d_cos_sin(*patch_positions(cameras, *grid), d - n)
    inverse = torch.linalg.inv(matrices)
    q_t = torch.cat([_project(q[..., :n], matrices.transpose(-1, -2)), _rope_blocks(q[..., n:], tables, rot_minus)], -1)
    k_t = torch.cat([_project(k[..., :n], inverse), _rope_blocks(k[..., n:], tables, rot_minus)], -1)
    v_t = torch.cat([_project(v[..., :n], inverse), _rope_blocks(v[..., n:], tables, rot_minus)], -1)
    o = softmax_attention(q_t, k_t, v_t)
    return torch.cat([_project(o[..., :n], matrices), _rope_blocks(o[..., n:], tables, rot_plus)], -1)


def prope_matrices(w2c, grid, intrinsics=None, image_size=None):
    """``[B, L, 4, 4]``: ``diag(K_hat, 1) w2c`` of each token's camera (``w2c`` alone for GTA), with
    ``K_hat = [[fx/W, 0, cx/W - 1/2], [0, fy/H, cy/H - 1/2], [0, 0, 1]]``."""
    frames = w2c.clone()
    if intrinsics is not None:
        h, w = image_size
        lift = torch.zeros_like(w2c)
        lift[..., 0, 0], lift[..., 0, 1], lift[..., 0, 2] = (
            intrinsics[..., 0, 0] / w,
            intrinsics[..., 0, 1] / w,
            intrinsics[..., 0, 2] / w - 0.5,
        )
        lift[..., 1, 1], lift[..., 1, 2] = intrinsics[..., 1, 1] / h, intrinsics[..., 1, 2] / h - 0.5
        lift[..., 2, 2] = lift[..., 3, 3] = 1.0
        frames = lift @ w2c
    return frames.repeat_interleave(grid[0] * grid[1], dim=1)


def ucpe_ray_frames(c2w, rays_cam):
    """``[B, C * P, 4, 4]`` world-to-ray frames: ``z = normalize(R d)``, ``x = normalize(y_cam x z)``,
    ``y = z x x``, ``R_w2l = [x y z]^T``, ``t = -R_w2l o``. ``rays_cam [P, 3]``."""
    b, c = c2w.shape[:2]
    out = torch.zeros(b, c, rays_cam.shape[0], 4, 4, dtype=F64)
    for i in range(b):
        for j in range(c):
            rotation, centre = c2w[i, j, :3, :3], c2w[i, j, :3, 3]
            for p, ray in enumerate(rays_cam):
                z = rotation @ ray
                z = z / z.norm()
                x = torch.linalg.cross(rotation[:, 1], z)
                x = x / x.norm()
                y = torch.linalg.cross(z, x)
                r_w2l = torch.stack([x, y, z])
                out[i, j, p, :3, :3] = r_w2l
                out[i, j, p, :3, 3] = -r_w2l @ centre
                out[i, j, p, 3, 3] = 1.0
    return out.flatten(1, 2)


# --- RayRoPE (default d_pj+0_3d, section 4) -------------------------------------------------------------------
RAY_CORNERS = {1: [(0.5, 0.5)], 2: [(0.0, 0.0), (1.0, 1.0)], 3: [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)]}


def _lift_normalised(intrinsics, image_size):
    h, w = image_size
    k_hat = torch.tensor([[1 / w, 0, -0.5], [0, 1 / h, -0.5], [0, 0, 1]], dtype=F64) @ intrinsics
    lift = torch.eye(4, dtype=F64)
    lift[:3, :3] = k_hat
    return lift


def rayrope_coordinates(w2c, intrinsics, image_size, grid, depths, frame):
    """``[L, D_c]`` coordinates of every token (one batch element) in camera ``frame``'s projective frame.

    ``depths [L, R]`` z-depths of each ray point; ``X(d) = P_k^-1 (u, v, 1, 1/d)``, ``Y = P_frame X``,
    ``dir = Y[:3] / |Y[:3]|`` (first two), ``depth = min(|Y_z| / Y_w, 10)``, ``p0 = (w2c_frame o_k)[:3]``.
    """
    rows, cols = grid
    cameras, num_rays = w2c.shape[0], depths.shape[-1]
    proj = [_lift_normalised(intrinsics[c], image_size) @ w2c[c] for c in range(cameras)]
    out = []
    for token in range(cameras * rows * cols):
        camera, patch = divmod(token, rows * cols)
        row, col = divmod(patch, cols)
        centre = torch.linalg.inv(w2c[camera])[:, 3]
        p0 = (w2c[frame] @ centre)[:3]
        dirs, zs = [], []
        for ray, (ox, oy) in enumerate(RAY_CORNERS[num_rays]):
            u, v = (col + ox) / cols - 0.5, (row + oy) / rows - 0.5
            point = torch.linalg.inv(proj[camera]) @ torch.tensor([u, v, 1.0, 1.0 / depths[token, ray]], dtype=F64)
            y = proj[frame] @ point
            dirs.append((y[:3] / y[:3].norm())[:2])
            zs.append(torch.clamp(y[2].abs() / y[3], max=10.0).reshape(1))
        out.append(torch.cat([p0, *dirs, *zs]))
    return torch.stack(out)


def rayrope_frequencies(num_rays, num_freqs, base=3.0):
    """``[F * D_c]`` angular frequencies ``(2 pi / T) base^n``, frequency-major (periods 4, 8, 80)."""
    periods = [4.0] * 3 + [8.0] * (2 * num_rays) + [80.0] * num_rays
    return torch.tensor([2 * math.pi / t * base**n for n in range(num_freqs) for t in periods], dtype=F64)


def expected_cos_sin(theta1, theta2):
    """``E[cos], E[sin]`` of an angle uniform in ``[theta1, theta2]``: ``(sin t2 - sin t1) / D``,
    ``(cos t1 - cos t2) / D``; for ``|D| < 1e-5`` the midpoint's cos, sin (error ``D^2 / 24``)."""
    spread = theta2 - theta1
    small = spread.abs() < 1e-5
    safe = torch.where(small, torch.ones_like(spread), spread)
    mid = (theta1 + theta2) / 2
    c = torch.where(small, mid.cos(), (theta2.sin() - theta1.sin()) / safe)
    s = torch.where(small, mid.sin(), (theta1.cos() - theta2.cos()) / safe)
    return c, s


def rayrope_depths(raw, num_rays):
    """``raw [L, 2]`` (log-depth, sigma) -> ``(d1, d2)`` ``[L, R]``: ``exp(min(l -+ s, 3))`` in ``[1e-2, 100]``."""
    d1 = torch.exp(torch.clamp(raw[:, 0] - raw[:, 1], max=3.0)).clamp(1e-2, 100.0)
    d2 = torch.exp(torch.clamp(raw[:, 0] + raw[:, 1], max=3.0)).clamp(1e-2, 100.0)
    return d1[:, None].expand(-1, num_rays), d2[:, None].expand(-1, num_rays)


def rayrope_attention(q, k, v, w2c, intrinsics, image_size, grid, raw, num_rays=3):
    """RayRoPE self-attention of one batch element ``q, k, v [H, L, d]`` (``w2c [C, 4, 4]``, ``raw [L, 2]``):
    per query camera, ``rot_minus`` of its queries by their own encoding and of all keys and values by their
    encoding in that camera's frame, SDPA, then ``rot_plus`` of the output by the query encoding."""
    cameras, patches = w2c.shape[0], grid[0] * grid[1]
    num_freqs = q.shape[-1] // (2 * (3 + 3 * num_rays))
    omega = rayrope_frequencies(num_rays, num_freqs)
    d1, d2 = rayrope_depths(raw, num_rays)

    def cos_sin(frame):
        coords = [rayrope_coordinates(w2c, intrinsics, image_size, grid, d, frame) for d in (d1, d2)]
        return expected_cos_sin(coords[0].repeat(1, num_freqs) * omega, coords[1].repeat(1, num_freqs) * omega)

    outputs, q_cos, q_sin = [], [], []
    for camera in range(cameras):
        rows = slice(camera * patches, (camera + 1) * patches)
        c, s = cos_sin(camera)
        q_cos.append(c[rows])
        q_sin.append(s[rows])
        o = softmax_attention(rot_minus(q[:, rows], c[rows], s[rows]), rot_minus(k, c, s), rot_minus(v, c, s))
        outputs.append(o)
    return rot_plus(torch.cat(outputs, -2), torch.cat(q_cos), torch.cat(q_sin))
