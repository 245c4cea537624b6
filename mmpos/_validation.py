"""Argument checks shared by every module: each error names the argument and what was expected."""

from __future__ import annotations

import math
import numbers
from typing import Sequence

import torch

from ._arguments import (  # noqa: F401  (re-exported: the torch-free checks and argparse helpers)
    DefaultsHelpFormatter,
    OneLineErrorParser,
    check_choice,
    check_even,
    check_non_negative_int,
    check_positive_int,
    finite_float_arg,
    positive_int_arg,
    show_defaults,
)


def check_finite_number(name: str, value, positive: bool = False) -> float:
    """``value`` as a float: a finite real number (not a bool; numpy scalars are numbers), and ``> 0`` when
    ``positive``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return float(value)


def check_theta(name: str, theta) -> None:
    """A frequency base: a finite number above 0 (``inf`` would leave all but the first pair still, ``0`` or a
    negative base gives NaN). A tuple is checked item by item by the caller."""
    if isinstance(theta, torch.Tensor) and theta.numel() == 1:
        theta = theta.item()
    if isinstance(theta, bool) or not isinstance(theta, numbers.Real):
        raise TypeError(f"{name} must be a number (the frequency base), got {theta!r}")
    if not (math.isfinite(theta) and theta > 0):
        raise ValueError(f"{name} must be a finite number above 0 (the frequency base), got {theta!r}")


_SCALAR_TYPES = {  # annotation -> (accepts, what the message says was expected)
    "float": (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool), "a number"),
    "int": (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool), "an integer"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
}


def check_finite_fields(config) -> None:
    """Every scalar field (annotated ``float``, ``int``, ``bool`` or ``str``) of a dataclass ``config`` has its type
    (``tau: high`` would fail deep inside a run), and every float (also inside tuple or list fields) is finite: a
    NaN threshold or strength compares False everywhere and silently switches an edit off. The error names
    ``Class.field``."""
    import dataclasses

    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        annotation = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", None)
        accepts, expected = _SCALAR_TYPES.get(annotation, (None, None))
        if accepts is not None and not accepts(value):
            raise ValueError(f"{type(config).__name__}.{field.name}={value!r}: expected {expected}")
        items = value if isinstance(value, (tuple, list)) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in items):
            raise ValueError(f"{type(config).__name__}.{field.name}={value!r}: expected finite numbers")


def check_finite(name: str, tensor: torch.Tensor) -> None:
    """Raise if ``tensor`` has NaN or inf (skipped while ``torch.compile`` traces: a data-dependent branch)."""
    if torch.compiler.is_compiling():
        return
    check_not_meta(name, tensor)
    if not torch.isfinite(tensor).all():
        bad = (~torch.isfinite(tensor)).sum().item()
        raise ValueError(f"{name} contains {bad} non-finite value(s) (NaN or inf); expected finite numbers")


def check_not_meta(name: str, tensor) -> None:
    """A tensor with values: an encoding computes tables and geometry from data, which a meta tensor has none of
    (torch says only "unsupported scalarType" from autocast, or ".item() cannot be called on meta tensors")."""
    if isinstance(tensor, torch.Tensor) and tensor.device.type == "meta":
        raise ValueError(
            f"{name} is on the meta device: it holds no values to compute with; materialise the model "
            "(to_empty + load the weights) or pass tensors on cpu/cuda"
        )


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
        items = tuple(value)
        ints = tuple(int(v) for v in items)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of integers, got {value!r}") from None
    except (ValueError, OverflowError):  # NaN, inf, text
        raise ValueError(f"{name} must contain integers, got {value!r}") from None
    if any(i != v for i, v in zip(ints, items)):
        raise ValueError(f"{name} must contain integers, got {value!r}")
    return ints


def sequence_length_error(table_length: int, x_shape, seq_dim: int, num_prefix_tokens: int) -> ValueError:
    """The error for a table of ``table_length`` positions that does not fit ``x``'s tokens along ``seq_dim``; when
    the other attention layout's token dim fits, it names the ``seq_dim`` to pass ([B, H, L, D]: -2, the default;
    diffusers' Flux / Wan processors' [B, L, H, D]: -3)."""
    ndim = len(x_shape)
    message = (
        f"the table has {table_length} positions but x has {x_shape[seq_dim]} tokens with "
        f"{num_prefix_tokens} prefix token(s), i.e. {x_shape[seq_dim] - num_prefix_tokens} to rotate"
    )
    other = -3 if seq_dim in (-2, ndim - 2) else -2
    if ndim >= 3 and x_shape[other] - num_prefix_tokens == table_length:
        layout = "[B, L, H, D] (diffusers' Flux / Wan layout)" if other == -3 else "[B, H, L, D] (the default layout)"
        message += f"; x {tuple(x_shape)} looks like {layout}: pass seq_dim={other}"
    return ValueError(message)


class NonFiniteLossError(FloatingPointError):
    """Training diverged: the loss is NaN or inf (raised before it reaches the weights)."""


def check_finite_loss(loss: torch.Tensor, step: int, kept) -> None:
    """Raise :class:`NonFiniteLossError` if ``loss`` (any shape, e.g. gathered from every process) is not finite;
    ``kept()`` says what the user still has (the last checkpoint). One host sync."""
    finite = torch.isfinite(loss.detach())
    if not bool(finite.all()):
        value = loss.detach().flatten()[~finite.flatten()][0].item()
        raise NonFiniteLossError(
            f"loss is {value} at step {step}: training "
            f"diverged (lower the learning rate?); stopped before this step's update. {kept()}"
        )
