"""Edit pairs with ground truth for the three editing tasks, and instruction pairs for Kontext training.

- :func:`transplant_pair` (PE transplant / PosBridge): put a given reference object at a given box.
- :func:`harmonise_pair` (LooseRoPE): an object pasted from a scene of another style, with the scene
  it should become (same shape, colour and place; the scene's pattern; no pasted background).
- :func:`style_set` (band modulation): a reference scene and other layouts rendered in its style.
- :func:`instruction_pair`: (context, instruction, target) triples the Kontext-style model trains on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .render import Rendered, render_scene
from .scene import (
    COLOURS,
    PATTERN_WORDS,
    PATTERNS,
    SHAPES,
    ObjectSpec,
    SceneSpec,
    SceneStyle,
    check_box,
    sample_box,
    sample_objects,
    sample_scene,
    sample_style,
)

HARMONISE_INSTRUCTION = "blend the pasted object into the image"
REFERENCE_BACKGROUND = "white"  # the plain tile a reference object is shown on


@dataclass
class TransplantPair:
    """``background`` + ``reference`` object -> ``target`` with the object drawn in ``box``."""

    background: Rendered
    reference: Rendered  # the object alone, centred on a plain white tile
    box: tuple[int, int, int, int]
    target: Rendered
    mask: np.ndarray  # bool [S, S]: pixels of the inserted object in ``target``
    caption: str  # the target's caption


@dataclass
class HarmonisePair:
    """``collage`` (scene + pasted patch) -> ``target`` (the object redrawn in the scene's style)."""

    scene: Rendered  # before the paste
    source: Rendered  # the scene the patch was cut from
    collage: np.ndarray  # uint8 [S, S, 3]
    paste_mask: np.ndarray  # bool [S, S]: the pasted rectangle
    object_mask: np.ndarray  # bool [S, S]: the object's pixels in both collage and target
    target: Rendered
    instruction: str = HARMONISE_INSTRUCTION


@dataclass
class StyleSet:
    """A style ``reference`` and ``targets``: other layouts drawn in the reference's style (ground truth)."""

    reference: Rendered
    targets: list[Rendered]
    prompts: list[str]  # the targets' captions without style words (what a user would type)


def _object_at(obj: ObjectSpec, box) -> ObjectSpec:
    return ObjectSpec(obj.shape, obj.colour, tuple(int(v) for v in box), obj.size)


def _centred_box(image_size: int, side: int):
    start = (image_size - side) // 2
    return (start, start, start + side, start + side)


def transplant_pair(seed: int, image_size: int = 64, box=None, obj: ObjectSpec | None = None) -> TransplantPair:
    """A scene, an object to insert and where; ``box`` and ``obj`` are sampled unless given."""
    rng = np.random.default_rng(seed)
    scene = sample_scene(int(rng.integers(2**31)), image_size, max_objects=2)
    if box is None:
        box = sample_box(rng, image_size, "large", [o.box for o in scene.objects]) or sample_box(
            rng, image_size, "small", [o.box for o in scene.objects]
        )
        if box is None:  # crowded scene: drop its objects rather than overlap them
            scene = scene.with_objects(())
            box = sample_box(rng, image_size, "large")
    box = check_box("box", tuple(box), image_size)
    if obj is None:
        colours = [c for c in COLOURS if c not in (scene.style.background, REFERENCE_BACKGROUND)]
        obj = ObjectSpec(str(rng.choice(SHAPES)), str(rng.choice(colours)), box, "large")
    placed = _object_at(obj, box)
    reference_spec = SceneSpec(
        image_size,
        SceneStyle(REFERENCE_BACKGROUND, "flat", scene.style.object_pattern),
        (_object_at(obj, _centred_box(image_size, image_size // 2)),),
    )
    target = render_scene(scene.with_objects(scene.objects + (placed,)))
    return TransplantPair(
        render_scene(scene), render_scene(reference_spec), box, target, target.masks[-1], target.spec.caption()
    )


def harmonise_pair(seed: int, image_size: int = 64, margin: int = 2) -> HarmonisePair:
    """The pasted patch keeps ``margin`` pixels of its source background around the object's box."""
    rng = np.random.default_rng(seed)
    style = sample_style(rng)
    other = [p for p in PATTERNS if p != style.object_pattern]
    source_style = SceneStyle(
        str(rng.choice([c for c in COLOURS if c != style.background])),
        str(rng.choice(PATTERNS)),
        str(rng.choice(other)),
    )
    scene = SceneSpec(image_size, style, sample_objects(rng, image_size, style, int(rng.integers(1, 3))))
    colours = [c for c in COLOURS if c not in (style.background, source_style.background)]
    box = sample_box(rng, image_size, "large", [o.box for o in scene.objects], gap=margin + 1)
    if box is None:
        scene, box = scene.with_objects(()), sample_box(rng, image_size, "large")
    obj = ObjectSpec(str(rng.choice(SHAPES)), str(rng.choice(colours)), box, "large")
    source = render_scene(SceneSpec(image_size, source_style, (obj,)))
    patch = np.zeros((image_size, image_size), dtype=bool)
    x0, y0, x1, y1 = box
    patch[max(y0 - margin, 0) : y1 + margin, max(x0 - margin, 0) : x1 + margin] = True
    before = render_scene(scene)
    collage = before.image.copy()
    collage[patch] = source.image[patch]
    target = render_scene(scene.with_objects(scene.objects + (obj,)))
    return HarmonisePair(before, source, collage, patch, target.masks[-1], target)


def style_set(seed: int, count: int = 4, image_size: int = 64) -> StyleSet:
    """``count`` layouts sharing the reference's style; none has the background colour as an object."""
    rng = np.random.default_rng(seed)
    reference = sample_scene(int(rng.integers(2**31)), image_size)
    targets = [sample_scene(int(rng.integers(2**31)), image_size, style=reference.style) for _ in range(count)]
    return StyleSet(
        render_scene(reference), [render_scene(t) for t in targets], [t.caption(include_style=False) for t in targets]
    )


def _recolour(rng, scene: SceneSpec):
    i = int(rng.integers(len(scene.objects)))
    obj = scene.objects[i]
    colour = str(rng.choice([c for c in COLOURS if c not in (obj.colour, scene.style.background)]))
    objects = list(scene.objects)
    objects[i] = ObjectSpec(obj.shape, colour, obj.box, obj.size)
    return f"make the {obj.colour} {obj.shape} {colour}", scene.with_objects(objects)


def _remove(rng, scene: SceneSpec):
    i = int(rng.integers(len(scene.objects)))
    obj = scene.objects[i]
    return f"remove the {obj.colour} {obj.shape}", scene.with_objects(scene.objects[:i] + scene.objects[i + 1 :])


def _add(rng, scene: SceneSpec):
    added = sample_objects(rng, scene.size, scene.style, 1, [o.box for o in scene.objects])
    if not added:
        return _remove(rng, scene)
    obj = added[0]
    return f"add a {obj.size} {obj.colour} {obj.shape} at {obj.position_word(scene.size)}", scene.with_objects(
        scene.objects + added
    )


def _restyle(rng, scene: SceneSpec):
    pattern = str(rng.choice([p for p in PATTERNS if p != scene.style.object_pattern]))
    style = SceneStyle(scene.style.background, scene.style.background_pattern, pattern)
    return f"make the objects {PATTERN_WORDS[pattern]}", SceneSpec(scene.size, style, scene.objects)


INSTRUCTION_KINDS = {"recolour": _recolour, "remove": _remove, "add": _add, "restyle": _restyle}


def instruction_pair(seed: int, image_size: int = 64, harmonise_fraction: float = 0.3):
    """``(context uint8 [S,S,3], instruction, target Rendered)``; a ``harmonise_fraction`` of them are
    LooseRoPE-style paste harmonisations, the rest recolour/remove/add/restyle one scene."""
    rng = np.random.default_rng(seed)
    if rng.random() < harmonise_fraction:
        pair = harmonise_pair(int(rng.integers(2**31)), image_size)
        return pair.collage, pair.instruction, pair.target
    scene = sample_scene(int(rng.integers(2**31)), image_size)
    kind = str(rng.choice(list(INSTRUCTION_KINDS)))
    instruction, edited = INSTRUCTION_KINDS[kind](rng, scene)
    return render_scene(scene).image, instruction, render_scene(edited)


def fill_example(seed: int, image_size: int = 64):
    """``(Rendered, mask bool [S,S])`` for inpainting: an object's dilated box half the time, else a
    random rectangle."""
    rng = np.random.default_rng(seed)
    rendered = render_scene(sample_scene(int(rng.integers(2**31)), image_size))
    mask = np.zeros((image_size, image_size), dtype=bool)
    if rng.random() < 0.5 and rendered.spec.objects:
        x0, y0, x1, y1 = rendered.spec.objects[int(rng.integers(len(rendered.spec.objects)))].box
        pad = int(rng.integers(0, 4))
        mask[max(y0 - pad, 0) : y1 + pad, max(x0 - pad, 0) : x1 + pad] = True
    else:
        h, w = (int(v) for v in rng.integers(image_size // 6, image_size // 2, size=2))
        y, x = (int(v) for v in rng.integers(0, image_size - max(h, w), size=2))
        mask[y : y + h, x : x + w] = True
    return rendered, mask
