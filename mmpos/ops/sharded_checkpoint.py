"""Atomic checkpoints of a sharded model (FSDP2, :func:`~.sharding.fully_shard_blocks`) and its optimizer, on torch's
distributed checkpoint: every process writes its own shards, none gathers the whole model.

``checkpoint-100/`` holds DCP's files (``.metadata``, ``__<rank>_0.distcp``: the model and optimizer state by
parameter name), ``rng_<rank>.json`` (each process's generators) and ``sharded_checkpoint.json`` (format, process
count, ``extra``), written last. The folder is written as ``.checkpoint-100.partial`` and renamed into place once
complete, in the project's order: rank 0 empties the partial folder, barrier, every rank writes, barrier, rank 0
writes the manifest and renames, barrier.

A checkpoint folder is a file a user may be handed, so loading one runs no code and reads nothing outside it. DCP's
``.metadata`` is a pickle: it is read by an unpickler that admits only DCP's metadata classes, ``torch.Size``,
dtypes, layouts and paths (anything else is refused naming it). Every storage path it lists must lie inside the
folder (no ``..``, no absolute path, no symlink out), checked before any shard is read. Tensors in the shards are
read by DCP's ``torch.load(weights_only=True)``, and so are the non-tensor items (an optimizer's ``lr``, ``betas``),
which DCP itself would unpickle unrestricted: an item that needs more than tensors and plain values is refused
naming it. DCP's own failures (a ``BaseException``) reach the caller as :class:`ShardedCheckpointError`.

    from mmpos.ops.sharded_checkpoint import load_sharded_checkpoint, save_sharded_checkpoint
    save_sharded_checkpoint("run/checkpoint-100", model, optimizer, extra={"step": 100})  # in every process
    extra = load_sharded_checkpoint("run/checkpoint-100", model, optimizer)  # built, sharded, optimizer made
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

MANIFEST = "sharded_checkpoint.json"
FORMAT = 1


class ShardedCheckpointError(ValueError):
    """A sharded checkpoint folder that cannot be loaded (into this model and optimizer), or saved."""


class IncompleteCheckpointError(ShardedCheckpointError):
    """A folder that is not a complete sharded checkpoint (a ``.partial`` folder, DCP files or manifest missing)."""


class RefusedCheckpointError(ShardedCheckpointError):
    """A checkpoint file that needs more than plain data to read (a pickled object that could run code), or a
    storage path outside the checkpoint folder."""


def save_sharded_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``model`` and ``optimizer`` (sharded or not) to the folder ``path``, atomically; call it in every process.

    Args:
        path: the checkpoint folder (on a file system every process sees); it must not exist unless ``overwrite``.
        model: the model (after ``fully_shard``); its state is saved by parameter name.
        optimizer: its optimizer (built after sharding).
        extra: JSON values to keep with it (the step, a scheduler's state), returned by :func:`load_sharded_checkpoint`.
        overwrite: replace a complete checkpoint at ``path`` (once the new one is complete).
    Returns:
        ``path``.
    """
    path = Path(path)
    try:
        manifest = json.dumps(dict(format=FORMAT, processes=_world(), model=_model_shape(model), extra=extra or {}))
    except TypeError as error:
        raise TypeError(f"save_sharded_checkpoint: extra must hold JSON values ({error})") from None
    if path.exists() and not overwrite:
        raise FileExistsError(f"save_sharded_checkpoint: {path} exists; pass overwrite=True to replace it")
    partial = path.parent / f".{path.name}.partial"
    if _rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    _barrier()
    with _named_failures(partial, "save_sharded_checkpoint"):
        _dcp().save(_state(model, optimizer), checkpoint_id=partial)
    from .._safe_state import rng_state, write_json

    write_json(partial / f"rng_{_rank()}.json", rng_state())
    _barrier()
    if _rank() == 0:
        (partial / MANIFEST).write_text(manifest, encoding="utf-8")
        _replace(partial, path)
    _barrier()
    return path


def load_sharded_checkpoint(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore ``model``, ``optimizer`` and this process's generators from a :func:`save_sharded_checkpoint` folder;
    call it in every process, after building and sharding the model and building its optimizer as for the saved run.

    Returns:
        the ``extra`` values saved with it.
    Raises:
        FileNotFoundError: ``path`` does not exist.
        IncompleteCheckpointError: ``path`` is not a complete sharded checkpoint.
        RefusedCheckpointError: a file in it needs more than plain data to read, or names a file outside it.
        ShardedCheckpointError: it does not fit ``model`` and ``optimizer`` (DCP's error, named).
    """
    path = Path(path)
    manifest = read_manifest(path)
    _check_model(path, manifest, model)
    state = _state(model, optimizer)
    reader = _allowlist_reader(path)
    reader.read_metadata()  # refuses a tampered .metadata here, before DCP wraps the error in its own
    with _named_failures(path, "load_sharded_checkpoint"):
        _dcp().load(state, storage_reader=reader, planner=_weights_only_planner(path))
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    _restore_rng(path, manifest)
    extra: dict[str, Any] = manifest["extra"]
    return extra


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a complete checkpoint folder, or the error naming what is missing."""
    if not path.exists():
        raise FileNotFoundError(f"load_sharded_checkpoint: {path} does not exist")
    if path.name.endswith(".partial"):
        raise IncompleteCheckpointError(f"{path}: an unfinished checkpoint (.partial), not a complete one")
    for name in (MANIFEST, ".metadata"):
        if not (path / name).is_file():
            raise IncompleteCheckpointError(f"{path}: not a complete sharded checkpoint (no {name})")
        _refuse_outside(path, name)
    try:
        manifest: dict[str, Any] = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise IncompleteCheckpointError(f"{path / MANIFEST}: cannot be read ({error})") from None
    if manifest.get("format") != FORMAT:
        raise IncompleteCheckpointError(f"{path / MANIFEST}: format {manifest.get('format')!r}, expected {FORMAT}")
    return manifest


def _model_shape(model: nn.Module) -> dict[str, Any]:
    """What a checkpoint must match: the registered name of every encoding module (by module name, ``pe_name``
    of mmpos' registry) and every parameter's whole shape (a sharded parameter's too)."""
    encodings = {
        name: type(m).pe_name for name, m in model.named_modules() if isinstance(getattr(type(m), "pe_name", None), str)
    }
    return {"encodings": encodings, "parameters": {name: list(p.shape) for name, p in model.named_parameters()}}


def _check_model(path: Path, manifest: dict[str, Any], model: nn.Module) -> None:
    """Refuse a checkpoint saved from another model: other encodings (a learned table would be dropped or left
    unmatched without a word), other parameter names or shapes. Checkpoints that recorded no model pass."""
    saved, current = manifest.get("model"), _model_shape(model)
    if not isinstance(saved, dict):
        return
    saved_pes, current_pes = saved.get("encodings", {}), current["encodings"]
    if saved_pes != current_pes:
        names = [f"{n}: {saved_pes.get(n)} saved, {current_pes.get(n)} here" for n in sorted({*saved_pes, *current_pes})
                 if saved_pes.get(n) != current_pes.get(n)]  # fmt: skip
        raise ShardedCheckpointError(
            f"{path}: saved with encoding {_listed(saved_pes)}, this model has {_listed(current_pes)} "
            f"({names[0]}); build the model with the checkpoint's encoding"
        )
    shapes, here = saved.get("parameters", {}), current["parameters"]
    differ = [
        f"{n} {shapes.get(n)} saved, {here.get(n)} here"
        for n in sorted({*shapes, *here})
        if shapes.get(n) != here.get(n)
    ]
    if differ:
        more = f" and {len(differ) - 1} more" if len(differ) > 1 else ""
        raise ShardedCheckpointError(f"{path}: saved from another model: {differ[0]}{more}")


def _listed(encodings: dict[str, str]) -> str:
    return ", ".join(sorted(set(encodings.values()))) or "none"


def _state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The model's and optimizer's state by parameter name (sharded tensors stay sharded)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def _restore_rng(path: Path, manifest: dict[str, Any]) -> None:
    from .._safe_state import read_json, set_rng_state

    rng = path / f"rng_{_rank()}.json"
    if manifest.get("processes") == _world() and rng.is_file():
        _refuse_outside(path, rng.name)
        set_rng_state(read_json(rng))
    else:
        saved = manifest.get("processes")
        warnings.warn(
            f"{path}: saved by {saved} processes, loaded by {_world()}: generators not restored", stacklevel=3
        )


def _replace(partial: Path, path: Path) -> None:
    """Rename the complete ``partial`` folder to ``path``, an earlier checkpoint there removed only afterwards."""
    previous = path.parent / f".{path.name}.previous"
    if path.exists():
        shutil.rmtree(previous, ignore_errors=True)
        path.rename(previous)
    partial.rename(path)
    shutil.rmtree(previous, ignore_errors=True)


def _dcp() -> Any:
    import torch.distributed.checkpoint as dcp

    return dcp


# what DCP's .metadata pickles (torch 2.14): its metadata classes, shapes, dtypes, layouts and the storage paths
_METADATA_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {
        "BytesStorageMetadata", "ChunkStorageMetadata", "Metadata", "MetadataIndex", "StorageMeta",
        "TensorProperties", "TensorStorageMetadata", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"},
}  # fmt: skip


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata`` admitting only :data:`_METADATA_GLOBALS`, ``torch.Size`` and dtypes."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)):
            return getattr(torch, name)
        if name in _METADATA_GLOBALS.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a distributed-checkpoint metadata file")


def _allowlist_reader(path: Path) -> Any:
    """DCP's file-system reader of ``path`` whose ``read_metadata`` uses :class:`_MetadataUnpickler`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class AllowlistReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata_path = self._get_metadata_path(kwargs.get("rank"))
            _refuse_outside(path, Path(metadata_path).name)
            with self.fs.create_stream(metadata_path, "rb") as stream:
                try:
                    metadata = _MetadataUnpickler(stream).load()
                except pickle.UnpicklingError as error:
                    raise IncompleteCheckpointError(f"{metadata_path}: refused ({error})") from None
            _check_storage(path, metadata)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

        def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
            _check_storage(path, metadata)  # every process, on the metadata it was handed, before reading
            super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)

    return AllowlistReader(path)


def _check_storage(path: Path, metadata: Any) -> None:
    """Refuse a ``.metadata`` that is not DCP's ``Metadata`` or whose storage entries are not
    ``(relative_path, offset, length)`` of a file inside ``path``."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata

    where = path / ".metadata"
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise IncompleteCheckpointError(f"{where}: not a distributed-checkpoint metadata file")
    for info in metadata.storage_data.values():
        if not isinstance(info, _StorageInfo) or not isinstance(info.relative_path, str):
            raise RefusedCheckpointError(f"{where}: a storage entry is not a file name, offset and length")
        if not all(isinstance(n, int) and n >= 0 for n in (info.offset, info.length)):
            raise RefusedCheckpointError(f"{where}: storage entry of {info.relative_path!r} has a negative offset")
        _refuse_outside(path, info.relative_path)


def _refuse_outside(path: Path, name: str) -> None:
    """Refuse a file ``name`` of the checkpoint folder ``path`` that lies outside it (absolute, ``..``, or a symlink
    resolving elsewhere)."""
    root = path.resolve()
    if Path(name).is_absolute() or not (root / name).resolve().is_relative_to(root):
        raise RefusedCheckpointError(f"{path}: refused: {name!r} is outside the checkpoint folder")


def _weights_only_planner(path: Path) -> Any:
    """DCP's load planner, its non-tensor items read with ``torch.load(weights_only=True)``: tensors, containers,
    numbers and strings; anything else refused naming the item (DCP's own reads them unrestricted)."""
    import io

    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.planner import ReadItem

    class WeightsOnlyPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
            fqn = read_item.dest_index.fqn
            try:
                item = torch.load(value, map_location="cpu", weights_only=True)
            except pickle.UnpicklingError as error:
                named = re.search(r"GLOBAL ([\w.]+)", str(error))
                raise RefusedCheckpointError(
                    f"{path}: refused: item {fqn!r} holds pickled objects other than tensors and plain values "
                    f"(loading it could run code: {named.group(1) if named else type(error).__name__})"
                ) from None
            except (EOFError, RuntimeError, ValueError) as error:
                raise ShardedCheckpointError(f"{path}: item {fqn!r} cannot be read ({error})") from None
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], item)
            else:
                self.state_dict[fqn] = item

    return WeightsOnlyPlanner()


@contextmanager
def _named_failures(path: Path, caller: str) -> Iterator[None]:
    """Turn DCP's ``CheckpointException`` (a ``BaseException``, which ``except Exception`` misses) into the error
    of the first failing process: an mmpos error or an ``OSError`` as it was, anything else as
    :class:`ShardedCheckpointError` naming ``path``."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as error:
        rank, (failure, _) = min(error.failures.items())
        if isinstance(failure, (ShardedCheckpointError, OSError)):
            raise failure from None
        message = " ".join(str(failure).split()) or type(failure).__name__
        raise ShardedCheckpointError(f"{caller}: {path} (process {rank}): {message}") from None


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
