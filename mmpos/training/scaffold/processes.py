"""What every trainer needs to run on N processes: the one accelerator factory and what the processes share.

:func:`make_accelerator` is accelerate's ``Accelerator`` on every machine (the CPU and a gloo group without CUDA),
refusing the sharded engines. The scaffold's own tasks wrap their model in DDP; the world trainers' losses call
parts of a model (``.encode``, ``.text_encoder``, hooks on a frozen base), which DDP cannot wrap, so they draw the
*global* batch (``batch_size`` x processes samples, what one process at N times the batch would draw) on every
process, keep their slice (:func:`local`) and, after the backward pass, :func:`average_gradients` (DDP's rule: the
mean). One process does no communication at all.
"""

from __future__ import annotations

import base64
import secrets
from pathlib import Path

import torch

from .config import ConfigError

SHARDED_ENGINES = ("FSDP", "DEEPSPEED")  # accelerate's distributed types that shard the model


class UnshareOutError(RuntimeError):
    """The processes of one run do not see one ``--out`` folder (node-local storage on a multi-node run)."""


def make_accelerator(
    mixed_precision: str = "no",
    trainer: str = "the trainer",
    *,
    cpu: bool = False,
    error: type[Exception] = ConfigError,
    **options,
):
    """accelerate's ``Accelerator`` for ``trainer`` (named in errors): on the CPU without CUDA or with ``cpu``, so
    torchrun / ``accelerate launch`` processes join one gloo group (without it accelerate runs each as an
    independent single-process run); ``options`` go to ``Accelerator``. FSDP and DeepSpeed are refused
    (:func:`check_data_parallel`)."""
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision=mixed_precision, cpu=cpu or not torch.cuda.is_available(), **options)
    check_data_parallel(accelerator, trainer, error)
    return accelerator


def check_data_parallel(accelerator, trainer: str, error: type[Exception] = ConfigError) -> None:
    """Refuse accelerate's FSDP and DeepSpeed for ``trainer``: the trainers keep one whole model per process (DDP or
    their own gradient all-reduce) and write whole-model checkpoints, which a sharded model would not give."""
    engine = str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type))
    if engine in SHARDED_ENGINES:
        raise error(
            f"{trainer} trains one whole model per process (DDP), not under accelerate's distributed_type {engine}: "
            "launch it without an FSDP / DeepSpeed config (docs/scaling.md, 'Sharded engines: what is covered')"
        )


def check_shared_out(accelerator, out: Path) -> None:
    """Every process must see the file the main process writes into ``out``: else :class:`UnshareOutError` on
    every process (node-local run folders would lose the other nodes' generators and break ``--resume``)."""
    from accelerate.utils import broadcast

    token = torch.tensor([secrets.randbits(62) if accelerator.is_main_process else 0], device=accelerator.device)
    token = broadcast(token)
    marker = out / ".run" / "shared"
    if accelerator.is_main_process:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(int(token.item())))
    accelerator.wait_for_everyone()
    seen = marker.is_file() and marker.read_text().strip() == str(int(token.item()))
    missing = accelerator.gather(torch.tensor([0 if seen else 1], device=accelerator.device))
    if int(missing.sum()):
        ranks = [r for r, m in enumerate(missing.tolist()) if m]
        raise UnshareOutError(
            f"--out {out}: processes {ranks} do not see what process 0 wrote there; put --out on "
            "storage every node sees (one shared folder)"
        )


def check_shared(accelerator, out) -> None:
    """:func:`check_shared_out` on N processes (``out`` made first); nothing on one process."""
    if accelerator.num_processes > 1:
        Path(out).mkdir(parents=True, exist_ok=True)
        check_shared_out(accelerator, Path(out))


def local(accelerator, batch_size: int) -> slice:
    """This process's rows of a global batch of ``batch_size`` x processes."""
    return slice(accelerator.process_index * batch_size, (accelerator.process_index + 1) * batch_size)


def average_gradients(accelerator, parameters) -> None:
    """Replace every gradient by its mean over the processes (nothing on one process)."""
    if accelerator.num_processes == 1:
        return
    import torch.distributed as dist

    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= accelerator.num_processes
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def mean_loss(accelerator, loss: torch.Tensor) -> float:
    """The loss averaged over the processes (what is logged)."""
    if accelerator.num_processes == 1:
        return loss.item()
    return accelerator.reduce(loss.detach().float().clone(), reduction="mean").item()


def any_process(accelerator, flag: bool) -> bool:
    """True on every process when ``flag`` is true on any (a time budget or SIGTERM stops all together)."""
    if accelerator.num_processes == 1:
        return bool(flag)
    import torch.distributed as dist

    value = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def step_generator(seed: int, step: int) -> torch.Generator:
    """The CPU generator of update ``step``'s draws: batches and noise are a function of ``(seed, step)``."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def generator_state(generator: torch.Generator) -> str:
    """A generator's state as JSON text (base64 of its bytes)."""
    return base64.b64encode(generator.get_state().cpu().numpy().tobytes()).decode("ascii")


def set_generator_state(generator: torch.Generator, text: str) -> None:
    data = bytearray(base64.b64decode(text.encode("ascii"), validate=True))
    generator.set_state(torch.frombuffer(data, dtype=torch.uint8))
