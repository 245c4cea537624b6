"""Scene specs of the 2D mini-world: what is drawn where, in which colour and pattern, and its caption.

A :class:`SceneSpec` is the ground truth kept with every image. Sampling is deterministic per seed
(``numpy.random.default_rng(seed)``); rendering is in :mod:`mmpos.world.render`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np

from .._arguments import check_choice, check_positive_int

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "orange": (240, 140, 30),
    "yellow": (235, 215, 40),
    "green": (50, 170, 60),
    "cyan": (40, 200, 210),
    "blue": (40, 80, 220),
    "purple": (140, 60, 200),
    "pink": (240, 130, 190),
    "white": (245, 245, 245),
    "gray": (128, 128, 128),
    "black": (25, 25, 25),
    "brown": (130, 80, 40),
}
SHAPES = ("circle", "square", "triangle", "diamond", "hexagon", "star", "cross")
PATTERNS = ("flat", "stripes", "dots", "gradient")
# Caption words for each pattern (an object is "striped", a background is "striped" too).
PATTERN_WORDS = {"flat": "plain", "stripes": "striped", "dots": "dotted", "gradient": "shaded"}
SIZES = {"small": (14, 20), "large": (22, 30)}  # side of the placement box, fraction of 64 px
POSITION_WORDS = (
    ("top left", "top", "top right"),
    ("left", "center", "right"),
    ("bottom left", "bottom", "bottom right"),
)


@dataclass(frozen=True)
class ObjectSpec:
    """One object: ``box`` is the placement box ``(x0, y0, x1, y1)`` in pixels, end-exclusive."""

    shape: str
    colour: str
    box: tuple[int, int, int, int]
    size: str = "large"

    def __post_init__(self):
        check_choice("shape", self.shape, SHAPES)
        check_choice("colour", self.colour, COLOURS)
        check_choice("size", self.size, SIZES)

    def position_word(self, image_size: int) -> str:
        x0, y0, x1, y1 = self.box
        column = min(int(3 * (x0 + x1) / 2 / image_size), 2)
        row = min(int(3 * (y0 + y1) / 2 / image_size), 2)
        return POSITION_WORDS[row][column]


@dataclass(frozen=True)
class SceneStyle:
    """What band modulation should transfer: background colour and pattern, and the objects' pattern."""

    background: str = "white"
    background_pattern: str = "flat"
    object_pattern: str = "flat"

    def __post_init__(self):
        check_choice("background", self.background, COLOURS)
        check_choice("background_pattern", self.background_pattern, PATTERNS)
        check_choice("object_pattern", self.object_pattern, PATTERNS)


@dataclass(frozen=True)
class SceneSpec:
    """A whole scene: square ``size`` x ``size`` pixels, a style and objects drawn in order."""

    size: int
    style: SceneStyle
    objects: tuple[ObjectSpec, ...] = field(default_factory=tuple)

    def __post_init__(self):
        check_positive_int("size", self.size)
        for i, obj in enumerate(self.objects):
            check_box(f"objects[{i}].box", obj.box, self.size)
            if obj.colour == self.style.background:
                raise ValueError(
                    f"objects[{i}].colour={obj.colour!r} equals the background colour; "
                    "expected a colour that differs from the background"
                )

    def caption(self, include_style: bool = True) -> str:
        return scene_caption(self, include_style)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "SceneSpec":
        objects = tuple(
            ObjectSpec(o["shape"], o["colour"], tuple(o["box"]), o.get("size", "large")) for o in data["objects"]
        )
        return cls(data["size"], SceneStyle(**data["style"]), objects)

    def with_objects(self, objects) -> "SceneSpec":
        return replace(self, objects=tuple(objects))

    def with_style(self, style: SceneStyle) -> "SceneSpec":
        """The same layout in ``style``; objects that would vanish into the background are dropped."""
        return SceneSpec(self.size, style, tuple(o for o in self.objects if o.colour != style.background))


def check_box(name: str, box, image_size: int) -> tuple[int, int, int, int]:
    """``box`` must be 4 integers ``x0 < x1``, ``y0 < y1`` inside ``[0, image_size]``."""
    if len(box) != 4 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in box):
        raise ValueError(f"{name} must be 4 integers (x0, y0, x1, y1), got {box!r}")
    x0, y0, x1, y1 = (int(v) for v in box)
    if not (0 <= x0 < x1 <= image_size and 0 <= y0 < y1 <= image_size):
        raise ValueError(
            f"{name}={box!r} is not a box inside the {image_size}x{image_size} image; expected "
            f"0 <= x0 < x1 <= {image_size} and 0 <= y0 < y1 <= {image_size}"
        )
    if min(x1 - x0, y1 - y0) < 4:
        raise ValueError(f"{name}={box!r} is too small to draw a shape; expected sides of at least 4 pixels")
    return x0, y0, x1, y1


def object_phrase(obj: ObjectSpec, pattern: str | None, image_size: int) -> str:
    """``"a large striped red star at top left"``; no pattern word when ``pattern`` is None."""
    words = [
        "a",
        obj.size,
        PATTERN_WORDS[pattern] if pattern else "",
        obj.colour,
        obj.shape,
        "at",
        obj.position_word(image_size),
    ]
    return " ".join(w for w in words if w)


def scene_caption(spec: SceneSpec, include_style: bool = True) -> str:
    """E.g. ``"a large striped red star at top left and a small striped blue circle at right on a dotted
    yellow background"``. Without style: objects only (colours, shapes, sizes, positions)."""
    style = spec.style
    pattern = style.object_pattern if include_style else None
    objects = " and ".join(object_phrase(o, pattern, spec.size) for o in spec.objects)
    if not include_style:
        return objects
    background = f"a {PATTERN_WORDS[style.background_pattern]} {style.background} background"
    return f"{objects} on {background}" if objects else background


def _boxes_overlap(a, b, gap: int) -> bool:
    return not (a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1])


def sample_box(rng: np.random.Generator, image_size: int, size: str, avoid=(), gap: int = 2, tries: int = 50):
    """A square placement box of ``size`` that keeps ``gap`` pixels from the boxes in ``avoid``, or None."""
    low, high = (max(4, round(s * image_size / 64)) for s in SIZES[size])
    for _ in range(tries):
        side = int(rng.integers(low, high + 1))
        x0, y0 = (int(v) for v in rng.integers(1, image_size - side, size=2))
        box = (x0, y0, x0 + side, y0 + side)
        if not any(_boxes_overlap(box, other, gap) for other in avoid):
            return box
    return None


def sample_style(rng: np.random.Generator, background: str | None = None) -> SceneStyle:
    background = background or str(rng.choice(list(COLOURS)))
    return SceneStyle(background, str(rng.choice(PATTERNS)), str(rng.choice(PATTERNS)))


def sample_objects(rng: np.random.Generator, image_size: int, style: SceneStyle, count: int, avoid=()):
    """Up to ``count`` non-overlapping objects in colours other than the background."""
    colours = [c for c in COLOURS if c != style.background]
    objects, boxes = [], list(avoid)
    for _ in range(count):
        size = str(rng.choice(list(SIZES)))
        box = sample_box(rng, image_size, size, boxes)
        if box is None:
            break
        boxes.append(box)
        objects.append(ObjectSpec(str(rng.choice(SHAPES)), str(rng.choice(colours)), box, size))
    return tuple(objects)


def sample_scene(seed: int, image_size: int = 64, max_objects: int = 3, style: SceneStyle | None = None) -> SceneSpec:
    """A random scene, identical for identical arguments. ``style`` fixes the style (else sampled)."""
    check_positive_int("max_objects", max_objects)
    if image_size < 32:
        raise ValueError(f"image_size must be at least 32 pixels, got {image_size}")
    rng = np.random.default_rng(seed)
    style = style or sample_style(rng)
    count = int(rng.integers(1, max_objects + 1))
    return SceneSpec(image_size, style, sample_objects(rng, image_size, style, count))
