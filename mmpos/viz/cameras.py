"""Camera figures: the rig (frusta along a trajectory, coloured by time), a frame's ray-direction and
latitude/up maps, and the attention pattern each camera encoding imposes across two views."""

from __future__ import annotations

from pathlib import Path

import torch

from ..camera.cameras import Cameras
from ..camera.frusta import frustum_lines
from ..camera.presets import preset_trajectory
from ..camera.ray_frames import latitude_up_map
from ..camera.rays import ray_grid, world_rays
from ..camera.specs import frame_camera
from ..camera.trajectory import Trajectory
from .figure_files import pyplot, save_figure


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
    axes[2].quiver(
        col.numpy(),
        row.numpy(),
        up[..., 0].numpy(),
        -up[..., 1].numpy(),
        ok.reshape(rows, cols).numpy(),
        cmap="coolwarm",
        scale=1.2 * max(rows, cols) / 1.0,
        width=0.004,
    )
    axes[2].set_xlim(-0.5, cols - 0.5)
    axes[2].set_ylim(rows - 0.5, -0.5)
    axes[2].set_aspect("equal")
    axes[2].set_title("up direction in the image")
    for ax in axes:
        ax.set_xlabel("patch column")
        ax.set_ylabel("patch row")


def camera_figures(
    trajectory: Trajectory,
    out_dir,
    stem: str = "cameras",
    frame: int = 0,
    image_size=(180, 320),
    grid_size=(18, 32),
    model: str = "pinhole",
    fov=None,
    xi: float = 0.0,
    replace: bool = True,
):
    """Write ``{stem}_rig.png`` and ``{stem}_rays.png`` (frame ``frame``) to ``out_dir``; returns the paths.
    ``replace=False``: an existing figure is kept and :class:`~mmpos._atomic.OutputTakenError` raised."""
    if not -len(trajectory) <= frame < len(trajectory):
        raise ValueError(f"frame={frame} is outside the trajectory's {len(trajectory)} frames")
    height, width = image_size
    camera = frame_camera(trajectory, frame, width, height, model, fov, xi)  # a bad fov / xi: before any file
    plt = pyplot()
    out_dir = Path(out_dir)
    fig = plt.figure(figsize=(6, 5))
    plot_rig(fig.add_subplot(projection="3d"), trajectory, title=f"{stem}: {len(trajectory)} frames")
    rig_path = save_figure(fig, out_dir / f"{stem}_rig.png", replace=replace)
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.8), layout="constrained")  # colour bar beside, not over, labels
    plot_ray_maps(axes, camera, trajectory.c2w[frame], grid_size)
    fig.suptitle(
        f"{stem}: frame {frame % len(trajectory)}, {type(camera).__name__}"
        + (f" (xi={xi:g})" if model == "unified" else "")
    )
    return [rig_path, save_figure(fig, out_dir / f"{stem}_rays.png", replace=replace)]


@torch.no_grad()
def encoding_logit_maps(name: str, grid_size=(9, 16), image_size=(90, 160)) -> tuple[torch.Tensor, torch.Tensor]:
    """Content-free logits (q = k = ones, fp64) from the centre token of view 0 to every token of view 0 and of
    view 1 (an arc of 40 degrees away), ``2 x [rows, cols]``, for any camera encoding (depth known at 2 where it
    reads depth). An additive encoding (``plucker``) leaves attention plain: its map is the cosine ``e_i . e_j``
    of the embedded geometry (the 6D rays), as for the absolute encodings."""
    from ..encodings import pe_class

    views = preset_trajectory("arc", 2, degrees=40.0)
    height, width = image_size
    rays, valid = ray_grid(views.camera(0, width, height), grid_size, dtype=torch.float64)
    cameras = Cameras(
        c2w=views.c2w[None],
        grid=grid_size,
        image_size=image_size,
        rays=rays,
        valid=valid,
        intrinsics=views.intrinsic_matrices(width, height)[None],
        depth=torch.full((1, 2, height, width), 2.0, dtype=torch.float64),
    )
    tokens, head_dim = cameras.num_tokens // 2, 48
    centre = (grid_size[0] // 2) * grid_size[1] + grid_size[1] // 2
    pe = pe_class(name).for_head_dim(head_dim).double()
    geometry = pe.prepare(cameras)
    if pe.capabilities.additive:
        unit = geometry[0] / geometry[0].norm(dim=-1, keepdim=True).clamp_min(1e-12)
        row = unit @ unit[centre]
    else:
        ones = torch.ones(1, 1, 2 * tokens, head_dim, dtype=torch.float64)
        row = pe.logits(ones, ones, geometry)[0, 0, centre] / head_dim
    return row[:tokens].reshape(grid_size), row[tokens:].reshape(grid_size)


def camera_encoding_figure(name: str, path) -> Path:
    """Two panels for a camera encoding: view 0 and view 1 of a two-camera arc (see :func:`encoding_logit_maps`)."""
    plt = pyplot()
    same, other = encoding_logit_maps(name)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
    from ..encodings import pe_capabilities

    additive = pe_capabilities(name).additive
    label = "cosine of the embedded rays with the query's" if additive else "logit with the query"
    low, high = float(min(same.min(), other.min())), float(max(same.max(), other.max()))
    for ax, values, title in zip(axes, (same, other), ("view 0", "view 1 (arc, 40 deg)")):
        image = ax.imshow(values.numpy(), cmap="RdBu_r", vmin=low, vmax=high)
        ax.set_title(f"{name}: {title}")
        ax.set_xlabel("token column")
        ax.set_ylabel("token row")
    fig.colorbar(image, ax=list(axes), shrink=0.9, label=label)  # one scale for both views
    row, col = (side // 2 for side in same.shape)
    fig.suptitle(
        f"content-free (q = k = ones, fp64), {same.shape[0]} x {same.shape[1]} tokens per pinhole view; "
        "x: the query token",
        fontsize=9,
    )
    axes[0].scatter([col], [row], marker="x", c="black", s=25)
    return save_figure(fig, path)


def demo_camera_figures(out_dir) -> list[Path]:
    """The demo's camera figures: an orbit rig with its ray maps, and a 200-degree unified-camera frame."""
    written = camera_figures(preset_trajectory("orbit", 49, degrees=120), out_dir, "orbit", frame=24)
    tilted = preset_trajectory("tilt", 9, degrees=25)
    written += camera_figures(tilted, out_dir, "fisheye_tilt", frame=-1, model="unified", fov=200, xi=2.3)
    return written
