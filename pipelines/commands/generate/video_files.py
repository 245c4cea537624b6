"""Files of a generated video: an mp4 (OpenCV ``VideoWriter``: H.264 where the build has it), a GIF beside it, a
labelled grid of frames (PNG, upscaled nearest-neighbour to a viewable size) and the camera rig plot; and the
one-line reports of a video run (poses resampled, frames beyond the trained length, a resized first frame).

Every file is written to a temporary name beside its target and renamed into place, so a crash never leaves a
half-written file under the final name.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mmpos._atomic import written_atomically

if TYPE_CHECKING:
    import torch

# OpenCV fourcc, what it is; the first one this OpenCV build opens is used. Browsers play the first two in mp4.
CODECS = (("avc1", "H.264"), ("vp09", "VP9"), ("mp4v", "MPEG-4 Part 2, which browsers do not play"))
VIEWABLE_PIXELS = 256  # previews (frames.png tiles, the GIF) are upscaled by an integer factor to at least this


def video_to_uint8(frames: torch.Tensor) -> np.ndarray:
    """``[F, 3, H, W]`` floats in ``[0, 1]`` -> ``[F, H, W, 3]`` uint8 RGB."""
    if frames.dim() != 4 or frames.shape[1] != 3:
        raise ValueError(f"frames must be [F, 3, H, W], got {tuple(frames.shape)}")
    import torch

    return (frames.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()


@contextlib.contextmanager
def _quiet_native_stderr():
    """Silence what OpenCV's FFmpeg prints on file descriptor 2 while a codec is probed (a missing H.264 encoder
    prints a page of errors before ``isOpened()`` says no)."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _open_writer(path: Path, fps: float, size: tuple[int, int]):
    """``(writer, fourcc)``: the first of :data:`CODECS` this OpenCV build can write."""
    import cv2

    for fourcc, _ in CODECS:
        with _quiet_native_stderr():
            writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, size)
        if writer.isOpened():
            return writer, fourcc
        writer.release()
    raise RuntimeError(f"OpenCV could not open a video writer for {path} with any of {', '.join(c for c, _ in CODECS)}")


def write_mp4(frames: torch.Tensor, path, fps: int = 16, log=print) -> Path:
    """Write ``frames [F, 3, H, W]`` as an mp4 at ``fps``: H.264 (``avc1``) where OpenCV has it, else the next of
    :data:`CODECS`, said in one line through ``log``."""
    import cv2

    rgb = video_to_uint8(frames)
    with written_atomically(path) as temporary:  # same suffix: OpenCV picks the container by it
        writer, fourcc = _open_writer(temporary, float(fps), (rgb.shape[2], rgb.shape[1]))
        try:
            for frame in rgb:
                writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        finally:
            writer.release()
    if fourcc != "avc1":
        name = dict(CODECS)[fourcc]
        log(
            f"{Path(path).name}: this OpenCV build has no H.264 (avc1) encoder; wrote {fourcc} ({name}) instead "
            "(the GIF beside it plays anywhere)"
        )
    return Path(path)


def upscale_factor(height: int, width: int, pixels: int = VIEWABLE_PIXELS) -> int:
    """The integer factor that brings the shorter side to at least ``pixels`` (1 if it is already there)."""
    return max(1, -(-pixels // min(height, width)))


def upscale(rgb: np.ndarray, factor: int) -> np.ndarray:
    """Nearest-neighbour: every pixel of ``[..., H, W, 3]`` becomes a ``factor x factor`` block."""
    return rgb.repeat(factor, axis=-3).repeat(factor, axis=-2)


def write_gif(frames: torch.Tensor, path, fps: int = 16) -> Path:
    """``frames [F, 3, H, W]`` as a looping GIF at ``fps`` (PIL), upscaled nearest-neighbour to a viewable size."""
    from PIL import Image

    rgb = video_to_uint8(frames)
    big = upscale(rgb, upscale_factor(*rgb.shape[1:3]))
    images = [Image.fromarray(frame) for frame in big]
    with written_atomically(path) as temporary:
        images[0].save(
            temporary,
            format="GIF",
            save_all=True,
            append_images=images[1:],
            loop=0,
            duration=max(round(1000 / fps), 20),
            disposal=1,
        )
    return Path(path)


def frame_grid(frames: torch.Tensor, count: int = 8, columns: int = 4, pixels: int = VIEWABLE_PIXELS) -> np.ndarray:
    """``count`` evenly spaced frames tiled ``columns`` wide (uint8 ``[rows * (label + h), columns * w, 3]``), each
    upscaled nearest-neighbour so its shorter side is at least ``pixels`` and labelled ``frame i / F`` above."""
    from PIL import Image, ImageDraw

    rgb = video_to_uint8(frames)
    picks = np.unique(np.linspace(0, len(rgb) - 1, min(count, len(rgb))).round().astype(int))
    columns = min(columns, len(picks))
    rows = -(-len(picks) // columns)
    tiles = upscale(rgb[picks], upscale_factor(*rgb.shape[1:3], pixels))
    height, width = tiles.shape[1:3]
    label = 20
    canvas = Image.new("RGB", (columns * width, rows * (label + height)), "white")
    draw = ImageDraw.Draw(canvas)
    for slot, (index, tile) in enumerate(zip(picks, tiles)):
        r, c = divmod(slot, columns)
        top = r * (label + height)
        canvas.paste(Image.fromarray(tile), (c * width, top + label))
        draw.text((c * width + 4, top + 3), f"frame {index} / {len(rgb)}", fill="black")
    return np.asarray(canvas)


def write_png(array: np.ndarray, path) -> Path:
    from PIL import Image

    with written_atomically(path) as temporary:
        Image.fromarray(array).save(temporary, format="PNG")
    return Path(path)


def write_rig_plot(trajectory, path, title: str) -> Path:
    """The trajectory's frusta coloured by time (:func:`mmpos.viz.cameras.plot_rig`)."""
    from mmpos.viz.cameras import plot_rig
    from mmpos.viz.figure_files import pyplot, save_figure

    fig = pyplot().figure(figsize=(6, 5))
    plot_rig(fig.add_subplot(projection="3d"), trajectory, title=title)
    return save_figure(fig, path)


def report_resampling(spec, poses: int, frames: int, log=print) -> None:
    """One line when a pose file's ``poses`` are resampled to the video's ``frames``."""
    if poses != frames:
        log(f"--camera {spec}: {poses} poses resampled to {frames} frames (geodesic rotations, linear centres)")


def warn_longer_than_trained(frames: int, trained: int, hint: str, log=print) -> None:
    """A warning line when ``frames`` exceeds the ``trained`` frame count."""
    if frames > trained:
        log(f"warning: --frames {frames} is more than the {trained} frames the model was trained on; {hint}")


def resized_first_frame(image, name, width: int, height: int, log=print):
    """``image`` (PIL) resized to ``width x height``, said in one line when its size changes."""
    if image.size != (width, height):
        log(
            f"--image {name}: resized {image.size[0]}x{image.size[1]} -> {width}x{height} (the model's size"
            + (", aspect changed)" if image.size[0] * height != image.size[1] * width else ")")
        )
        image = image.resize((width, height))
    return image
