"""Argument checks shared by every module: each error names the argument and what was expected."""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch


def check_finite_number(name: str, value, positive: bool = False) -> float:
    """``value`` as a float: a finite real number (not a bool), and ``> 0`` when ``positive``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return float(value)


def check_choice(name: str, value, choices: Iterable) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; expected one of {choices}")


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_non_negative_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def check_even(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value % 2:
        raise ValueError(f"{name} must be a non-negative even integer (channels rotate in pairs), got {value!r}")
    return value


def check_finite(name: str, tensor: torch.Tensor) -> None:
    """Raise if ``tensor`` has NaN or inf (skipped while ``torch.compile`` traces: a data-dependent branch)."""
    if torch.compiler.is_compiling():
        return
    if not torch.isfinite(tensor).all():
        bad = (~torch.isfinite(tensor)).sum().item()
        raise ValueError(f"{name} contains {bad} non-finite value(s) (NaN or inf); expected finite numbers")


def check_float_coords(name: str, coords: torch.Tensor) -> None:
    """Coordinates must be fp32/fp64: 16-bit floats hold integer positions exactly only up to 256 (bf16)."""
    if not isinstance(coords, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(coords).__name__}")
    if coords.dtype in (torch.float16, torch.bfloat16):
        raise TypeError(
            f"{name} has dtype {coords.dtype}; positions must be float32 or float64 "
            "(16-bit floats round integer positions above 256 or 2048)"
        )
    if coords.is_complex() or coords.dtype == torch.bool:
        raise TypeError(f"{name} has dtype {coords.dtype}; expected a real float or integer tensor")


def per_axis(name: str, value, num_axes: int) -> tuple:
    """Broadcast a scalar option to one value per axis; a sequence must have exactly ``num_axes`` items."""
    if isinstance(value, (list, tuple)):
        if len(value) != num_axes:
            raise ValueError(f"{name} has {len(value)} entries; expected one per axis ({num_axes})")
        return tuple(value)
    return (value,) * num_axes


def as_int_tuple(name: str, value: Sequence[int]) -> tuple[int, ...]:
    try:
        items = tuple(int(v) for v in value)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of integers, got {value!r}") from None
    if any(int(v) != v for v in value):
        raise ValueError(f"{name} must contain integers, got {value!r}")
    return items
