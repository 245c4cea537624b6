import os
import resource
import time

import pytest
import torch


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default="cuda",
        help="device of the tests marked cuda (tests/cuda/); --device cpu runs the same checks on the CPU as a dry run",
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` (tests/cuda/) need a CUDA GPU: skipped without one (unless ``--device cpu``)."""
    if torch.cuda.is_available() or not config.getoption("--device").startswith("cuda"):
        return
    needs_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on one: bash scripts/gpu_checks.sh)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(needs_gpu)


@pytest.fixture
def check_device(request) -> str:
    """The device the ``cuda`` tests run their checks on (``--device``, default cuda)."""
    return request.config.getoption("--device")


@pytest.fixture
def one_thread():
    """Tiny models: one thread is ~30x faster than two on a shared, loaded CPU (no spin-waiting). Use with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def bf16_ulp(reference: torch.Tensor) -> torch.Tensor:
    """Spacing of bf16 numbers at |reference| (fp64): 2**(exponent - 7)."""
    exponent = torch.floor(torch.log2(reference.abs().clamp_min(2.0**-126)))
    return 2.0 ** (exponent - 7)


def logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``[..., Lq, Lk]`` dot products."""
    return q @ k.transpose(-1, -2)


def pytest_sessionstart(session):
    session.config._mmpos_lane_start = (time.monotonic(), os.getloadavg()[0])


def pytest_terminal_summary(terminalreporter, config):
    """The lane's cost on this machine: wall time, CPU time (this process and the processes it waited for:
    torchrun, subprocess CLI runs) and the load average at the start and the end, so that a time is quoted with
    the load it was measured under (CONTRIBUTING.md, "Test lanes")."""
    start, load_start = getattr(config, "_mmpos_lane_start", (None, None))
    if start is None:
        return
    cpu = sum(
        r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )
    wall = time.monotonic() - start
    terminalreporter.write_line(
        f"mmpos lane: {wall:.0f} s wall, {cpu:.0f} s CPU (with child processes), "
        f"load average {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, {os.cpu_count()} cores"
    )
