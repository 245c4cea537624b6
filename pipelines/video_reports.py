"""One line per change a video run makes to what it was given: poses resampled to frames, a first frame resized,
more frames than the model was trained on (shared by ``mmpos generate video`` on Wan and on the world model)."""

from __future__ import annotations


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
