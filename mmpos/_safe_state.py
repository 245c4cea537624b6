"""Training state read and written without pickle: tensors in safetensors files, everything else in JSON.

Checkpoints and caches are files people are given; unpickling one runs whatever code it names. So nothing here
unpickles: RNG states are JSON (the byte tensors of torch's generators as base64), an optimizer is a safetensors
file of its per-parameter tensors plus JSON for the rest. Files in a torch format written by earlier versions are
read with ``torch.load(weights_only=True)`` (tensors, containers, numbers and strings only): one that holds any
other object is refused naming the file, and nothing in it runs.
"""

from __future__ import annotations

import base64
import json
import pickle
import random
from pathlib import Path

import numpy as np
import torch


class UnsafeStateError(ValueError):
    """A state file that is not plain tensors and values (a pickled object that could run code), or unreadable."""


def load_torch_file(path, map_location="cpu", allow_numpy: bool = False):
    """``torch.load(path, weights_only=True)``: tensors, dicts, lists, tuples, numbers and strings only (with
    ``allow_numpy`` also numpy arrays and dtypes, as accelerate's RNG files hold). Anything else, a truncated or a
    foreign file raises :class:`UnsafeStateError` naming ``path``; no code in the file runs."""
    from contextlib import nullcontext

    safe = nullcontext()
    if allow_numpy:
        safe = torch.serialization.safe_globals(_numpy_globals())
    try:
        with safe:
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UnsafeStateError(
            f"{path}: refused: it holds pickled objects other than tensors and plain values "
            f"(loading it could run code; {first})"
        ) from None
    except (OSError, EOFError, RuntimeError, ValueError, KeyError) as error:
        raise UnsafeStateError(
            f"{path}: cannot be read ({type(error).__name__}: {' '.join(str(error).split())})"
        ) from None


def _numpy_globals() -> list:
    globals_ = [np.ndarray, np.dtype] + ([np.dtypes.UInt32DType] if hasattr(np, "dtypes") else [])
    try:  # numpy >= 2 moved the module; old pickles name either
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # pragma: no cover - numpy 1
        from numpy.core.multiarray import _reconstruct
    globals_.append(_reconstruct)
    try:
        from accelerate.utils.other import TORCH_SAFE_GLOBALS  # the exact functions its RNG files name

        globals_ += [g for g in TORCH_SAFE_GLOBALS if g not in globals_]
    except ImportError:  # pragma: no cover
        pass
    return globals_


def read_json(path) -> dict:
    """A JSON file, or :class:`UnsafeStateError` naming it (missing, truncated, not UTF-8)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise UnsafeStateError(f"{path}: cannot be read ({type(error).__name__}: {error})") from None


def write_json(path, value) -> None:
    Path(path).write_text(json.dumps(value), encoding="utf-8")


def read_tensors(path, device="cpu") -> dict[str, torch.Tensor]:
    """A safetensors file as ``{name: tensor}``, or :class:`UnsafeStateError` naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=str(device))
    except (OSError, SafetensorError, RuntimeError, ValueError) as error:
        raise UnsafeStateError(f"{path}: cannot be read ({type(error).__name__}: {error})") from None


def write_tensors(path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file({name: t.detach().cpu().contiguous() for name, t in tensors.items()}, str(path))


# ---------------------------------------------------------------------------------------------------- RNG


def _bytes_to_text(state: torch.Tensor) -> str:
    return base64.b64encode(state.cpu().numpy().tobytes()).decode("ascii")


def _text_to_bytes(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text.encode("ascii"), validate=True)), dtype=torch.uint8)


def rng_state() -> dict:
    """The generators of python, numpy, torch (CPU and every CUDA device) as JSON-able values."""
    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "torch": _bytes_to_text(torch.get_rng_state()),
    }
    if torch.cuda.is_available():
        state["cuda"] = [_bytes_to_text(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned (also accelerate's RNG dict of earlier checkpoints)."""
    if "random_state" in state:  # accelerate's random_states_N.pkl
        random.setstate(state["random_state"])
        np.random.set_state(state["numpy_random_seed"])
        torch.set_rng_state(state["torch_manual_seed"])
        if torch.cuda.is_available() and "torch_cuda_manual_seed" in state:
            torch.cuda.set_rng_state_all(state["torch_cuda_manual_seed"])
        return
    version, internal, gauss = state["python"]
    random.setstate((int(version), tuple(int(v) for v in internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((str(name), np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(_text_to_bytes(state["torch"]))
    if torch.cuda.is_available() and state.get("cuda"):
        torch.cuda.set_rng_state_all([_text_to_bytes(s) for s in state["cuda"]])


# ---------------------------------------------------------------------------------------------------- optimizer


def split_optimizer_state(state_dict: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """``optimizer.state_dict()`` -> (tensors ``{"<param id>/<name>": tensor}``, JSON-able rest)."""
    tensors, values = {}, {}
    for param_id, entries in state_dict["state"].items():
        values[str(param_id)] = {}
        for name, value in entries.items():
            if torch.is_tensor(value):
                tensors[f"{param_id}/{name}"] = value
            else:
                values[str(param_id)][name] = value
    return tensors, {"param_groups": state_dict["param_groups"], "values": values}


def join_optimizer_state(tensors: dict[str, torch.Tensor], rest: dict, like: dict) -> dict:
    """Inverse of :func:`split_optimizer_state`; ``like`` (the live optimizer's state dict) gives back the tuples
    JSON turned into lists (``betas``)."""
    state = {int(param_id): dict(entries) for param_id, entries in rest["values"].items()}
    for key, tensor in tensors.items():
        param_id, name = key.split("/", 1)
        state.setdefault(int(param_id), {})[name] = tensor
    groups = []
    for saved, live in zip(rest["param_groups"], like["param_groups"] + [{}] * len(rest["param_groups"])):
        groups.append(
            {k: tuple(v) if isinstance(live.get(k), tuple) and isinstance(v, list) else v for k, v in saved.items()}
        )
    return {"state": state, "param_groups": groups}
