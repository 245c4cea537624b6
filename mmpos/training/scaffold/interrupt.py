"""Stop a training run on SIGINT / SIGTERM at the next update boundary: checkpoint, one resume line, exit 130.

    with StopOnSignal() as stop:
        for step in ...:
            ...  # one whole update
            if stop.requested(accelerator):
                folder = save_checkpoint(...)          # every process: the scaffold's barriers, rank 0 writes
                stop.exit(accelerator, folder)         # prints the resume command once, raises TrainingInterrupted

The first signal only sets a flag (the update in flight finishes); the same signal a second time interrupts at
once (Python's default for it). With several processes the flag is reduced over them each update, so all stop at the same update.
"""

from __future__ import annotations

import shlex
import signal
import sys
import threading
from pathlib import Path

EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(SystemExit):
    """Raised after the checkpoint is written: exits with code 130 and no traceback."""

    def __init__(self, checkpoint: Path | None):
        super().__init__(EXIT_CODE)
        self.checkpoint = checkpoint


def resume_command(argv: list[str] | None = None) -> str:
    """The command line that continues this run: the same arguments, ``--overwrite`` and any ``--resume
    [FOLDER]`` dropped, then ``--resume`` (the newest checkpoint)."""
    argv = list(sys.argv if argv is None else argv)
    program = Path(argv[0])
    rest, skip = [], False
    for i, arg in enumerate(argv[1:], 1):
        if skip:
            skip = False
        elif arg == "--resume":
            skip = i + 1 < len(argv) and "checkpoint-" in argv[i + 1]
        elif arg != "--overwrite" and not arg.startswith("--resume="):
            rest.append(arg)
    head = [sys.executable, str(argv[0])] if program.suffix == ".py" else [program.name]
    return shlex.join(head + rest + ["--resume"])


class StopOnSignal:
    """A context that turns SIGINT / SIGTERM into a stop request read at update boundaries."""

    def __init__(self):
        self.received: int | None = None
        self._previous = {}

    def __enter__(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}

    def _handle(self, number, frame) -> None:
        self.received = self.received or number
        # the same signal again: its default (stop now, no checkpoint); the other one keeps the request (a launcher
        # such as torchrun answers a terminal's SIGINT with SIGTERM to every process)
        signal.signal(number, self._previous.get(number, signal.SIG_DFL))

    def requested(self, accelerator) -> bool:
        """True on every process once any process has received a signal (a collective call with N processes)."""
        if accelerator.num_processes == 1:
            return self.received is not None
        import torch

        flag = torch.tensor([0 if self.received is None else 1], device=accelerator.device)
        return bool(accelerator.reduce(flag, reduction="sum").item())

    def exit(self, accelerator, checkpoint: Path | None, argv: list[str] | None = None):
        """Print (main process) the one resume line and raise :class:`TrainingInterrupted`."""
        if accelerator.is_main_process:
            name = signal.Signals(self.received).name if self.received else "a signal on another process"
            print(f"interrupted ({name}): saved {checkpoint}; resume with: {resume_command(argv)}", flush=True)
        raise TrainingInterrupted(checkpoint)
