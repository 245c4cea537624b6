"""Camera figures: the rig (frusta along a trajectory, coloured by time), a frame's ray-direction and
latitude/up maps, and the attention pattern each camera encoding imposes across two views."""
from __future__ import annotations

import math
from pathlib import Path

import torch

from ..camera.models import UnifiedCamera
from ..camera.presets import PRESETS, preset_trajectory
from ..camera.ray_frames import latitude_up_map
from ..camera.rays import ray_grid, world_rays
from ..camera.trajectory import Trajectory, load_trajectory
from .figure_files import pyplot, save_figure


def resolve_trajectory(spec: str, num_frames: int = 49) -> Trajectory:
    """A trajectory file (RealEstate10K ``.txt`` or mmpos ``.json``) or ``preset:NAME`` (see ``PRESETS``)."""
    if spec.startswith("preset:"):
        return preset_trajectory(spec.split(":", 1)[1], num_frames)
    if not Path(spec).exists():
        raise FileNotFoundError(f"trajectory {spec!r} not found; pass a RealEstate10K .txt, an mmpos .json, or "
                                f"preset:NAME with NAME in {sorted(PRESETS)}")
    return load_trajectory(spec)


def frustum_lines(c2w: torch.Tensor, intrinsics: torch.Tensor, depth: float) -> torch.Tensor:
    """``[8, 2, 3]`` world segments of a camera's frustum (4 edges from the centre, 4 around the image plane at
    z-depth ``depth``); ``intrinsics``: normalised ``(fx/W, fy/H, cx/W, cy/H)``."""
    fx, fy, cx, cy = intrinsics.tolist()
    corners = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]], dtype=c2w.dtype)
    x = (corners[:, 0] - cx) / fx * depth
    y = (corners[:, 1] - cy) / fy * depth
    cam = torch.stack([x, y, torch.full_like(x, depth)], -1)
    world = cam @ c2w[:3, :3].T + c2w[:3, 3]
    centre = c2w[:3, 3].expand(4, 3)
    edges = torch.stack([centre, world], 1)
    rim = torch.stack([world, world.roll(-1, 0)], 1)
    return torch.cat([edges, rim])


def plot_rig(ax, trajectory: Trajectory, max_frusta: int = 16, title: str = "camera rig") -> None:
    """Frusta along the path in world axes (shown with y down as in OpenCV), coloured by time."""
    import matplotlib.cm as cm

    c2w = trajectory.c2w.double()
    centres = c2w[:, :3, 3]
    extent = float((centres.amax(0) - centres.amin(0)).max())
    depth = 0.15 * extent if extent > 1e-6 else 0.3
    n = len(trajectory)
    picks = sorted(set(torch.linspace(0, n - 1, min(n, max_frusta)).round().long().tolist()))
    colours = cm.viridis(torch.linspace(0, 1, n).numpy())
    ax.plot(centres[:, 0].numpy(), centres[:, 2].numpy(), -centres[:, 1].numpy(), color="0.6", lw=1)
    drawn = [centres]
    for i in picks:
        segments = frustum_lines(c2w[i], trajectory.intrinsics[i].double(), depth)
        drawn.append(segments.reshape(-1, 3))
        for segment in segments:
            ax.plot(segment[:, 0].numpy(), segment[:, 2].numpy(), -segment[:, 1].numpy(), color=colours[i], lw=1)
    ax.set_xlabel("x")
    ax.set_ylabel("z (forward)")
    ax.set_zlabel("-y (up)")
    ax.set_title(title)
    _equal_axes(ax, torch.cat(drawn))  # every frustum inside the axes (a pan: all at one centre)
    mappable = cm.ScalarMappable(cmap="viridis")
    mappable.set_clim(0, n - 1)
    ax.figure.colorbar(mappable, ax=ax, fraction=0.03, pad=0.12, label="frame")  # clear of the z label


def _equal_axes(ax, points: torch.Tensor) -> None:
    low, high = points.amin(0), points.amax(0)
    centre, half = ((low + high) / 2).tolist(), float((high - low).max()) / 2 + 1e-3
    ax.set_xlim(centre[0] - half, centre[0] + half)
    ax.set_ylim(centre[2] - half, centre[2] + half)
    ax.set_zlim(-centre[1] - half, -centre[1] + half)


def plot_ray_maps(axes, camera, c2w: torch.Tensor, grid_size) -> None:
    """Three panels: world ray directions as RGB, latitude, and the image-space up vectors."""
    rows, cols = grid_size
    rays, valid = ray_grid(camera, grid_size, dtype=torch.float64)
    _, directions = world_rays(c2w.double(), rays)
    rgb = ((directions + 1) / 2 * valid[:, None]).reshape(rows, cols, 3)
    latup, ok = latitude_up_map(camera, c2w.double(), grid_size)
    latitude = torch.where(ok, latup[:, 2], torch.full_like(latup[:, 2], float("nan"))).reshape(rows, cols)
    axes[0].imshow(rgb.clamp(0, 1).numpy())
    axes[0].set_title("world ray direction (xyz as RGB)")
    image = axes[1].imshow(torch.rad2deg(latitude).numpy(), cmap="coolwarm", vmin=-90, vmax=90)
    axes[1].figure.colorbar(image, ax=axes[1], fraction=0.046, label="latitude (deg)")
    axes[1].set_title("latitude")
    col, row = torch.meshgrid(torch.arange(cols), torch.arange(rows), indexing="xy")
    up = latup[:, :2].reshape(rows, cols, 2)
    axes[2].quiver(col.numpy(), row.numpy(), up[..., 0].numpy(), -up[..., 1].numpy(), ok.reshape(rows, cols).numpy(),
                   cmap="coolwarm", scale=1.2 * max(rows, cols) / 1.0, width=0.004)
    axes[2].set_xlim(-0.5, cols - 0.5)
    axes[2].set_ylim(rows - 0.5, -0.5)
    axes[2].set_aspect("equal")
    axes[2].set_title("up direction in the image")
    for ax in axes:
        ax.set_xlabel("patch column")
        ax.set_ylabel("patch row")


def frame_camera(trajectory: Trajectory, frame: int, width: int, height: int, model: str = "pinhole",
                 fov: float | None = None, xi: float = 0.0):
    """The camera model of ``frame``: the trajectory's pinhole, or a unified camera of ``fov``/``xi``."""
    if model == "pinhole":
        return trajectory.camera(frame, width, height)
    if model != "unified":
        raise ValueError(f"model={model!r} is not supported; expected 'pinhole' or 'unified'")
    if fov is None:
        fov = math.degrees(2 * math.atan(0.5 / float(trajectory.intrinsics[frame, 0])))
    return UnifiedCamera.from_fov(width, height, fov, xi)


def camera_figures(trajectory: Trajectory, out_dir, stem: str = "cameras", frame: int = 0,
                   image_size=(180, 320), grid_size=(18, 32), model: str = "pinhole", fov=None, xi: float = 0.0,
                   replace: bool = True):
    """Write ``{stem}_rig.png`` and ``{stem}_rays.png`` (frame ``frame``) to ``out_dir``; returns the paths.
    ``replace=False``: an existing figure is kept and :class:`~mmpos._atomic.OutputTakenError` raised."""
    if not -len(trajectory) <= frame < len(trajectory):
        raise ValueError(f"frame={frame} is outside the trajectory's {len(trajectory)} frames")
    plt = pyplot()
    out_dir = Path(out_dir)
    fig = plt.figure(figsize=(6, 5))
    plot_rig(fig.add_subplot(projection="3d"), trajectory, title=f"{stem}: {len(trajectory)} frames")
    rig_path = save_figure(fig, out_dir / f"{stem}_rig.png", replace=replace)
    height, width = image_size
    camera = frame_camera(trajectory, frame, width, height, model, fov, xi)
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8), layout="constrained")  # colour bar beside, not over, labels
    plot_ray_maps(axes, camera, trajectory.c2w[frame], grid_size)
    fig.suptitle(f"{stem}: frame {frame % len(trajectory)}, {type(camera).__name__}"
                 + (f" (xi={xi:g})" if model == "unified" else ""))
    return [rig_path, save_figure(fig, out_dir / f"{stem}_rays.png", replace=replace)]


@torch.no_grad()
def encoding_logit_maps(name: str, grid_size=(9, 16), image_size=(90, 160)) -> tuple[torch.Tensor, torch.Tensor]:
    """Content-free logits (q = k = ones, fp64) from the centre token of view 0 to every token of view 0 and of
    view 1 (an arc of 40 degrees away), ``2 x [rows, cols]``. ``plucker`` is additive: with content-free tokens and
    identity projections its logit is ``e_i . e_j`` of the 6D rays, shown normalised (cosine), as for the
    absolute encodings."""
    from ..encodings import create_pe

    views = preset_trajectory("arc", 2, degrees=40.0)
    c2w = views.c2w[None]
    height, width = image_size
    rows, cols = grid_size
    camera = views.camera(0, width, height)
    rays, valid = ray_grid(camera, grid_size, dtype=torch.float64)
    tokens = rows * cols
    centre = (rows // 2) * cols + cols // 2
    if name == "plucker":
        plucker = create_pe("plucker", embed_dim=8).embed(c2w, rays)[0]
        unit = plucker / plucker.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        row = unit @ unit[centre]
        return row[:tokens].reshape(rows, cols), row[tokens:].reshape(rows, cols)
    head_dim = 48
    pe = create_pe(name, head_dim=head_dim).double()
    ones = torch.ones(1, 1, 2 * tokens, head_dim, dtype=torch.float64)
    k_pixels = views.intrinsic_matrices(width, height)[None]
    if name == "rayrope":
        side = pe.prepare(views.w2c[None], k_pixels, image_size, grid_size)
        known = torch.full((1, 2 * tokens, pe.num_rays), 2.0, dtype=torch.float64)
        scores = pe.logits(ones, ones, side, known_depth_q=known)
    else:
        geo = (pe.prepare(views.w2c[None], grid_size, k_pixels, image_size) if name == "prope"
               else pe.prepare(c2w, rays, grid_size, valid))
        scores = pe.apply_q(ones, geo) @ pe.apply_kv(ones, None, geo)[0].transpose(-1, -2)
    row = scores[0, 0, centre] / head_dim
    return row[:tokens].reshape(rows, cols), row[tokens:].reshape(rows, cols)


def camera_encoding_figure(name: str, path) -> Path:
    """Two panels for a camera encoding: view 0 and view 1 of a two-camera arc (see :func:`encoding_logit_maps`)."""
    plt = pyplot()
    same, other = encoding_logit_maps(name)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
    label = "cosine of the 6D rays with the query's" if name == "plucker" else "logit with the query"
    low, high = float(min(same.min(), other.min())), float(max(same.max(), other.max()))
    for ax, values, title in zip(axes, (same, other), ("view 0", "view 1 (arc, 40 deg)")):
        image = ax.imshow(values.numpy(), cmap="RdBu_r", vmin=low, vmax=high)
        ax.set_title(f"{name}: {title}")
        ax.set_xlabel("token column")
        ax.set_ylabel("token row")
    fig.colorbar(image, ax=list(axes), shrink=0.9, label=label)  # one scale for both views
    row, col = (side // 2 for side in same.shape)
    fig.suptitle(f"content-free (q = k = ones, fp64), {same.shape[0]} x {same.shape[1]} tokens per pinhole view; "
                 "x: the query token", fontsize=9)
    axes[0].scatter([col], [row], marker="x", c="black", s=25)
    return save_figure(fig, path)


def demo_camera_figures(out_dir) -> list[Path]:
    """The demo's camera figures: an orbit rig with its ray maps, and a 200-degree unified-camera frame."""
    written = camera_figures(preset_trajectory("orbit", 49, degrees=120), out_dir, "orbit", frame=24)
    tilted = preset_trajectory("tilt", 9, degrees=25)
    written += camera_figures(tilted, out_dir, "fisheye_tilt", frame=-1, model="unified", fov=200, xi=2.3)
    return written
