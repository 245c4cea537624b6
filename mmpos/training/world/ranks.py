"""What the world trainers share to run on N processes while one process keeps its draws.

Each world trainer draws a step's batch and noise from its own generator. On N processes every process makes the
same draws for the *global* batch (``batch_size`` x processes samples, what one process at N times the batch would
draw) and keeps its slice (:func:`local`), so the processes read disjoint samples and one process draws exactly
what it drew before. The losses call parts of a model (``.encode``, ``.text_encoder``, hooks on a frozen base),
which DDP cannot wrap, so the model is not wrapped: after the backward pass :func:`average_gradients` all-reduces
the gradients (their mean, DDP's rule). One process does no communication at all.
"""

from __future__ import annotations

import base64

import torch

from ..._validation import check_finite_loss
from ..scaffold_config import check_data_parallel
from ..scaffold_folders import kept_checkpoint_note, latest_checkpoint


def make_accelerator(mixed_precision: str = "no", device: str | None = None):
    """accelerate's ``Accelerator``, on the CPU (gloo between torchrun processes) without CUDA or with
    ``device="cpu"``."""
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision=mixed_precision, cpu=device == "cpu" or not torch.cuda.is_available())
    check_data_parallel(accelerator, "the world trainers")
    return accelerator


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


def step_generator(seed: int, step: int) -> torch.Generator:
    """The CPU generator of update ``step``'s draws: batches and noise are a function of ``(seed, step)``."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def update(accelerator, optimizer, parameters: list, loss: torch.Tensor, lr: float, step: int, out) -> float:
    """One update of the NVS and video trainers from this process's ``loss`` at learning rate ``lr``: the NaN stop
    first (every process's loss; the message names ``out``'s newest checkpoint), then the backward pass, the
    gradients averaged over the processes and clipped to norm 1, the step. Returns the loss averaged over the
    processes (what is logged)."""
    check_finite_loss(
        accelerator.gather(loss.detach()[None]), step + 1, lambda: kept_checkpoint_note(latest_checkpoint(out))
    )
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    average_gradients(accelerator, parameters)
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()
    return mean_loss(accelerator, loss)


def mean_loss(accelerator, loss: torch.Tensor) -> float:
    """The loss averaged over the processes (what is logged)."""
    if accelerator.num_processes == 1:
        return loss.item()
    return accelerator.reduce(loss.detach().float().clone(), reduction="mean").item()


def generator_state(generator: torch.Generator) -> str:
    """A generator's state as JSON text (base64 of its bytes)."""
    return base64.b64encode(generator.get_state().cpu().numpy().tobytes()).decode("ascii")


def set_generator_state(generator: torch.Generator, text: str) -> None:
    data = bytearray(base64.b64decode(text.encode("ascii"), validate=True))
    generator.set_state(torch.frombuffer(data, dtype=torch.uint8))


def any_process(accelerator, flag: bool) -> bool:
    """True on every process when ``flag`` is true on any (a time budget or SIGTERM stops all together)."""
    if accelerator.num_processes == 1:
        return bool(flag)
    import torch.distributed as dist

    value = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def check_shared(accelerator, out) -> None:
    """On N processes: every process must see ``out`` (one shared folder), else
    :class:`~mmpos.training.scaffold_checkpoint.UnshareOutError` on every process before any update."""
    if accelerator.num_processes > 1:
        from pathlib import Path

        from ..scaffold import check_shared_out

        Path(out).mkdir(parents=True, exist_ok=True)
        check_shared_out(accelerator, Path(out))
