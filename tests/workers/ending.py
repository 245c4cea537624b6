"""The end of a torchrun test worker: every rank past its last collective and its record written before any rank
destroys the process group. A rank that destroys its gloo group while the other still runs (rank 0 writing its
records, say) was seen to abort at exit ("terminate called without an active exception", SIGABRT) on the project's
2-core machine, once in CI and once in a full-suite run (2026-12-03)."""

import torch.distributed as dist


def end_process_group() -> None:
    """Wait for every rank, then destroy the default process group."""
    dist.barrier()
    dist.destroy_process_group()
