"""``mmpos generate --extrapolate``: resolution extrapolation presets (DyPE, NTK, YaRN, PI) on a Flux or
Qwen-Image pipeline, and an attention rule joined with ``+`` (``dype+ultraimage``: UltraImage's entropy-driven
sharpening; ``dype+spa``: HRDiT's bundle grids on the first 3 steps;
:func:`~mmpos.integrations.diffusers.set_attention_rule`; ``sega``: SEGA's
spectral-energy factors per RoPE pair, on NTK unless another preset is named).

The preset goes to the transformer's row and column axes through ``set_pe(..., "native", extrapolation=...)``;
the training grid is ``train_size / (vae_scale_factor * 2)`` tokens (FLUX.1: 1024 px -> 64 x 64, Qwen-Image:
1328 px -> 83 x 83, the world t2i model: 32 px -> 8 x 8). Above it the chosen schedule acts; at or below it the model is stock, bit for bit.
"""

from __future__ import annotations

import math
import sys

from mmpos.integrations.diffusers import set_pe
from mmpos.spectrum.schedule import PRESETS, extrapolation_preset

CHOICES = ("none", *PRESETS)
RULES = ("ultraimage", "spa", "sega")  # attention rules (set_attention_rule) a preset takes after "+", one at a time
OWN_PRESETS = {"sega": "ntk"}  # the preset a rule brings when none is named (SEGA: the port's NTK ladder)
AXES = ("row", "col")
SHIFTS = ("authors", "comfyui", "off")  # DyPE's noise-schedule shift (mmpos.integrations.diffusers.noise_shift)


def split_rules(text: str) -> tuple[str, list[str]]:
    """``"dype+ultraimage"`` -> ``("dype", ["ultraimage"])``; ``"ultraimage"`` -> ``("none", ["ultraimage"])``;
    ``"sega"`` -> ``("ntk", ["sega"])`` (its own NTK base, :data:`OWN_PRESETS`; ``none+sega``: the stock ladder)."""
    parts = text.split("+")
    rules = [part for part in parts if part in RULES]
    presets = [part for part in parts if part not in RULES]
    if len(presets) > 1:
        raise ValueError(
            f"--extrapolate {text!r}: one position preset and attention rules ({', '.join(RULES)}) joined by '+', "
            f"got {presets}"
        )
    if len(rules) > 1:
        raise ValueError(f"--extrapolate {text!r}: one attention rule at a time ({', '.join(RULES)}), got {rules}")
    default = OWN_PRESETS.get(rules[0], "none") if rules else "none"
    return (presets[0] if presets else default), rules


def parse_rules(text: str) -> list[str]:
    """The attention rules of an ``--extrapolate`` value (see :func:`split_rules`)."""
    return split_rules(text)[1]


def parse_extrapolate(text: str) -> dict:
    """``"dype"`` -> ``{"row": "dype", "col": "dype"}``; ``"row=dype,col=ntk"`` per axis (an axis left out: none);
    attention rules after ``+`` are left out (:func:`parse_rules`)."""
    whole, (text, _) = text, split_rules(text)
    if "=" not in text:
        presets = dict.fromkeys(AXES, text)
    else:
        presets, given = dict.fromkeys(AXES, "none"), set()
        for item in text.split(","):
            axis, _, preset = item.partition("=")
            if axis not in AXES:
                raise ValueError(f"--extrapolate {whole!r}: axis {axis!r} is unknown; expected {AXES}")
            if axis in given:
                raise ValueError(f"--extrapolate {whole!r}: axis {axis!r} is given twice; name each axis once")
            given.add(axis)
            presets[axis] = preset
    for preset in presets.values():
        if preset not in CHOICES:
            raise ValueError(
                f"--extrapolate {whole!r}: preset {preset!r} is unknown; expected one of {CHOICES} "
                f"(and attention rules after '+': {', '.join(RULES)})"
            )
    return presets


def extrapolate_setting(config: dict, preset, train_size, command: str, default_train_size="auto") -> dict:
    """``config["extrapolate"]`` with the command line's ``--extrapolate`` / ``--train-size`` over it; a bad
    preset is one line on stderr naming it and exit code 2, before anything loads."""
    setting = config.setdefault("extrapolate", {"preset": "none", "train_size": default_train_size, "options": {}})
    if preset:
        setting["preset"] = preset
    if train_size:
        setting["train_size"] = train_size
    try:
        check_extrapolate_setting(setting, parse_extrapolate(str(setting.get("preset", "none"))))
    except ValueError as err:
        print(f"{command}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    return setting


OPTION_KEYS = (
    "lambda_s",
    "lambda_t",
    "start_sigma",
    "schedule_magnitude",
    "convention",
)  # ExtrapolationSchedule's tunables


def check_extrapolate_setting(setting, presets: dict) -> None:
    """ValueError naming the key unless ``setting`` (the config's ``extrapolate``) is a mapping whose ``train_size``
    is ``auto``, a positive number of pixels or ``[height, width]``, and whose ``options`` are schedule keywords
    (:data:`OPTION_KEYS`) that each chosen preset accepts."""
    import math

    if not isinstance(setting, dict):
        raise ValueError(f"extrapolate: expected a mapping (preset, train_size, options), got {setting!r}")
    size = setting.get("train_size", "auto")
    items = size if isinstance(size, (list, tuple)) and len(size) == 2 else [size]
    if size != "auto" and not all(
        not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in items
    ):
        raise ValueError(
            f"extrapolate.train_size={size!r}: expected 'auto', a positive number of pixels or [height, width]"
        )
    shift = setting.get("shift", "authors")
    if shift not in SHIFTS:
        raise ValueError(f"extrapolate.shift={shift!r}: expected one of {SHIFTS}")
    options = setting.get("options") or {}
    if not isinstance(options, dict):
        raise ValueError(f"extrapolate.options={options!r}: expected a mapping of {', '.join(OPTION_KEYS)}")
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise ValueError(f"extrapolate.options: unknown key(s) {unknown}; expected some of {list(OPTION_KEYS)}")
    for preset in set(presets.values()) - {"none"}:
        try:
            extrapolation_preset(preset, (64.0,), **options)
        except (TypeError, ValueError) as error:
            raise ValueError(f"extrapolate.options={options!r} with preset {preset!r}: {error}") from None


def install_extrapolation(pipe, presets: dict, train_size, options: dict | None = None, rules=()) -> dict:
    """Put the per-axis ``presets`` on ``pipe.transformer``'s image row and column axes (``set_pe`` native; the
    family's other axes, e.g. Flux's text/index axis or Qwen-Image's frame axis, are left alone) and the attention
    ``rules`` (:data:`RULES`) past the training grid; returns what was installed, as plain values for the config.
    A family the rule does not reach: ValueError naming it."""
    from mmpos.integrations.diffusers.families import family_for

    family = family_for(pipe.transformer)
    token_pixels = pipe.vae_scale_factor * 2
    train_h, train_w = (train_size, train_size) if isinstance(train_size, (int, float)) else train_size
    grid = (train_h / token_pixels, train_w / token_pixels)
    options = dict(options or {})
    per_axis = [None] * len(family.axis_names)
    image = {}
    for axis, index, length in zip(AXES, family.image_axes, grid):
        preset = presets[axis]
        image[axis] = per_axis[index] = (
            None if preset == "none" else extrapolation_preset(preset, (length,), **options)[0]
        )
    if all(entry is None for entry in per_axis) and not rules:
        return {"presets": presets, "train_size": [train_h, train_w], "schedules": None}
    if rules:
        install_rules(pipe.transformer, rules, grid, per_axis)
    else:
        set_pe(pipe.transformer, "native", extrapolation=per_axis)
    schedules = {axis: None if entry is None else entry.describe() for axis, entry in image.items()}
    return {
        "presets": presets,
        "train_size": [train_h, train_w],
        "trained_grid": list(grid),
        "options": options,
        "schedules": schedules,
        "rules": list(rules),
    }


def install_rules(transformer, rules, grid, per_axis) -> None:
    """``set_pe`` with ``per_axis`` (native; ``rope_axial``, the same spectrum, where a family's native install
    keeps its stock processors, which no rule reaches; SEGA on Qwen-Image: native, it scales the seam's tables) and
    each rule at the training ``grid``."""
    from mmpos.integrations.diffusers import set_attention_rule
    from mmpos.integrations.diffusers.attention_rules import IMAGE_RULES as FAMILIES_OF
    from mmpos.integrations.diffusers.attention_rules import TABLE_FAMILIES, encoding_processors
    from mmpos.integrations.diffusers.families import family_for

    name = family_for(transformer).name
    for rule in rules:
        if name not in FAMILIES_OF[rule]:
            raise ValueError(
                f"--extrapolate {rule}: the {name} family is not supported (the rule does not reach its attention); "
                f"supported: {', '.join(FAMILIES_OF[rule])}"
            )
    set_pe(transformer, "native", extrapolation=per_axis)
    if not encoding_processors(transformer) and not (name in TABLE_FAMILIES and set(rules) == {"sega"}):
        set_pe(transformer, "rope_axial", extrapolation=per_axis)
    for rule in rules:
        set_attention_rule(transformer, rule_config(rule, grid))


def rule_config(rule: str, grid) -> dict:
    """The command line's ``set_attention_rule`` config of ``rule`` for the trained ``(rows, cols)`` grid; SPA's
    ``group_num``: the authors' 80 bundles for FLUX.1's 64 trained tokens a side, scaled to this model."""
    config = {"type": rule, "train_grid": tuple(grid)}
    if rule == "spa":
        config["group_num"] = max(2, math.ceil(max(grid) * 80 / 64))
    return config


def install_noise_shift(pipe, presets: dict, shift: str, trained_grid, height: int, width: int) -> dict:
    """DyPE's noise-schedule shift (``shift``: a convention of :class:`~mmpos.integrations.diffusers.NoiseShift` or
    ``"off"``) on ``pipe``'s scheduler, when a DyPE preset is installed and the ``height x width`` output has more
    tokens than the ``trained_grid`` (at or below it the run stays stock); returns what was done, for the config."""
    from mmpos.integrations.diffusers import NoiseShift, apply_noise_shift
    from mmpos.integrations.diffusers.noise_shift import shift_refusal

    dype = any(PRESETS.get(preset, {}).get("dynamic") for preset in presets.values())
    per_token = pipe.vae_scale_factor * 2
    above = (height // per_token) * (width // per_token) > trained_grid[0] * trained_grid[1]
    if shift == "off" or not dype or not above:
        return {"convention": shift, "mu": None}
    refusal = shift_refusal(pipe)
    if refusal is not None:
        print(f"noise shift: {refusal}; --dype-shift {shift} changes nothing")
        return {"convention": shift, "mu": None}
    mu = apply_noise_shift(pipe, NoiseShift(shift), height, width, trained_grid)
    return {"convention": shift, "mu": mu}
