"""One training scaffold: a task defines its data, model and loss; the scaffold runs it on 1 or N processes.

    class MyTask(TrainingTask):
        def dataset(self): ...                        # map-style, len() samples
        def build_model(self): ...                    # the trained module (what checkpoints hold)
        def loss(self, model, batch, noise): ...      # mean over this process's samples

    result = train(MyTask(config), resume=None, overwrite=False)

What every task gets (:func:`train`):

* **N processes == 1 process at N times the batch.** Update ``s`` reads the global batch ``s`` of a seeded
  permutation per epoch (``--batch-size`` x processes samples, the last partial batch of an epoch dropped);
  process ``r`` takes its ``r``-th slice, so the processes read disjoint samples. Each sample's randomness (noise,
  timesteps, augmentation) comes from its own generator (:class:`SampleNoise`), seeded by (seed, update, place in
  the global batch), so it does not depend on which process reads the sample. Gradients are averaged over the
  processes (DDP), which is the gradient of the mean loss over the global batch. The weights start from one seed
  on every process and the EMA starts from them after ``prepare``, so weights and EMA are equal across processes.
* **Resume bit-identical mid-epoch**, the data stream included: the stream's position is a function of the update
  (recorded in ``progress.json`` and checked on resume), every generator is restored.
* **Checkpoints** ``checkpoint-<step>/`` (:mod:`.checkpoint`), written by the main process (every process
  writes only its ``rng_<r>.json``), renamed into place once complete; ``--out`` must be one folder every process
  sees (checked at start: :class:`UnshareOutError`).
* **Ctrl-C / SIGTERM**: the update in flight finishes, a checkpoint is written, one line prints the resume
  command, and every process exits with code 130 (:mod:`.interrupt`).
* **A NaN stop**: the first non-finite loss on any process stops every process before the update
  (:class:`~mmpos._validation.NonFiniteLossError`, naming the step and the last checkpoint, which is kept). Every
  trainer of the package takes its backward pass through :func:`backward`, the one place that calls it.
* **Logged losses are the mean over the processes** (``log.jsonl``, main process; a resumed run drops the lines
  after its checkpoint).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from ..._validation import NonFiniteLossError, check_finite_loss  # noqa: F401 - the NaN stop's error
from .checkpoint import RunState, load_checkpoint, save_checkpoint, saved_config
from .config import ConfigError, check_resume_config, resolved
from .folders import check_run, kept_checkpoint_note, latest_checkpoint, remove_earlier_run
from .interrupt import StopOnSignal
from .processes import average_gradients, check_shared_out, make_accelerator, mean_loss

SEED_STRIDE = 1_000_003


class TrainingTask:
    """A task: its config (a :class:`~.config.TrainConfig`), data, model and loss; optional hooks."""

    outputs: tuple[str, ...] = ()  # what the run writes into --out besides checkpoints and log.jsonl

    def __init__(self, config):
        self.config = config

    def dataset(self):
        raise NotImplementedError

    def collate(self, items):
        return torch.utils.data.default_collate(items)

    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def build_optimizer(self, model) -> torch.optim.Optimizer:
        params = [p for p in model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=self.config.lr, weight_decay=self.config.weight_decay)

    def build_scheduler(self, optimizer):
        return None

    def setup(self, accelerator) -> None:
        """Frozen parts on the device (after the model is built, before the first batch)."""

    def loss(self, model, batch, noise: "SampleNoise") -> torch.Tensor:
        raise NotImplementedError

    def step_scope(self):
        """A context held over one update's loss and backward pass (processors that stay installed)."""
        from contextlib import nullcontext

        return nullcontext()

    def checkpoint_extras(self, folder: Path, model, ema) -> None:
        """Task files in a checkpoint (main process)."""

    def finish(self, accelerator, model, ema) -> None:
        """Outputs after the last update (main process)."""


class SampleNoise:
    """One generator per sample of this process's batch, seeded by (seed, update, place in the global batch):
    ``randn((C, H, W))`` is ``[B, C, H, W]`` whichever process draws it."""

    def __init__(self, seed: int, step: int, positions: list[int], device):
        self.device = device
        self.generators = [torch.Generator().manual_seed(sample_seed(seed, step, p)) for p in positions]

    def __len__(self):
        return len(self.generators)

    def randn(self, shape) -> torch.Tensor:
        return torch.stack([torch.randn(tuple(shape), generator=g) for g in self.generators]).to(self.device)

    def rand(self, shape=()) -> torch.Tensor:
        return torch.stack([torch.rand(tuple(shape), generator=g) for g in self.generators]).to(self.device)

    def randint(self, high: int, shape=()) -> torch.Tensor:
        return torch.stack([torch.randint(high, tuple(shape), generator=g) for g in self.generators]).to(self.device)


def sample_seed(seed: int, step: int, position: int) -> int:
    return ((seed * SEED_STRIDE + step) * SEED_STRIDE + position) % (2**63)


class DataStream:
    """Global batch ``step``: ``global_batch`` indices of a permutation of ``range(length)`` seeded per epoch."""

    def __init__(self, length: int, global_batch: int, seed: int):
        if length < global_batch:
            raise ConfigError(
                f"batch_size: the data set has {length} samples, fewer than one global batch of "
                f"{global_batch} (batch_size x processes)"
            )
        self.length, self.global_batch, self.seed = length, global_batch, seed
        self.per_epoch = length // global_batch
        self._epoch, self._order = None, None

    def position(self, step: int) -> dict:
        return {
            "epoch": step // self.per_epoch,
            "batch": step % self.per_epoch,
            "global_batch": self.global_batch,
            "length": self.length,
            "seed": self.seed,
        }

    def indices(self, step: int) -> list[int]:
        epoch, batch = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed * SEED_STRIDE + epoch)
            self._epoch, self._order = epoch, torch.randperm(self.length, generator=generator).tolist()
        return self._order[batch * self.global_batch : (batch + 1) * self.global_batch]


class RankBatches(torch.utils.data.Sampler):
    """A ``DataLoader`` batch sampler: this process's slice of the global batches ``start .. steps - 1``."""

    def __init__(self, stream: DataStream, start: int, steps: int, rank: int, per_rank: int):
        self.stream, self.start, self.steps, self.rank, self.per_rank = stream, start, steps, rank, per_rank

    def __len__(self):
        return max(self.steps - self.start, 0)

    def __iter__(self):
        for step in range(self.start, self.steps):
            yield self.stream.indices(step)[self.rank * self.per_rank : (self.rank + 1) * self.per_rank]


@dataclass
class TrainResult:
    losses: dict  # update -> loss (mean over processes) of the updates this call ran
    model: torch.nn.Module  # unwrapped
    ema: torch.nn.Module | None
    accelerator: object
    checkpoint: Path | None  # the last one written


def backward(accelerator, loss: torch.Tensor, step: int, newest) -> None:
    """The one backward pass of every trainer, update ``step`` (0-based): the NaN stop first (every process's loss
    gathered: a non-finite one on any process raises :class:`NonFiniteLossError` on every process before the
    update, naming the step and ``newest()``, the newest checkpoint, which is kept), then accelerate's backward
    (the loss over the gradient-accumulation steps, scaled under fp16)."""
    check_finite_loss(accelerator.gather(loss.detach().float()[None]), step + 1, lambda: kept_checkpoint_note(newest()))
    accelerator.backward(loss)


def update_averaging_gradients(accelerator, optimizer, parameters: list, loss, lr: float, step: int, out) -> float:
    """One update of a model that is not wrapped in DDP (the NVS and world-video trainers: every process draws the
    global batch and trains on its slice, :mod:`.processes`) from this process's ``loss`` at learning rate ``lr``:
    the :func:`backward` pass (its NaN stop names ``out``'s newest checkpoint), the gradients averaged over the
    processes and clipped to norm 1, the step. Returns the loss averaged over the processes (what is logged)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    backward(accelerator, loss, step, lambda: latest_checkpoint(out))
    average_gradients(accelerator, parameters)
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()
    return mean_loss(accelerator, loss)


def task_accelerator(config):
    """The accelerator of a scaffold task (its config's ``mixed_precision``; errors name the task)."""
    return make_accelerator(config.mixed_precision, f"the {type(config).__name__.removesuffix('Config')} trainer")


def prepare_out(accelerator, task, resume, overwrite) -> Path | None:
    out = Path(task.config.out)
    start = check_run(out, resume, overwrite, task.outputs)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if overwrite:
            remove_earlier_run(out, task.outputs)
        out.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    check_shared_out(accelerator, out)
    return start


def train(task: TrainingTask, resume: str | None = None, overwrite: bool = False) -> TrainResult:
    """Run ``task`` (see the module docstring); ``resume``: ``"latest"`` or a ``checkpoint-<step>`` folder."""
    from accelerate.utils import set_seed

    config = task.config
    accelerator = task_accelerator(config)
    start_from = prepare_out(accelerator, task, resume, overwrite)
    set_seed(config.seed)  # the same initial weights on every process
    model = task.build_model()
    task.setup(accelerator)
    optimizer = task.build_optimizer(model)
    scheduler = task.build_scheduler(optimizer)
    model, optimizer = accelerator.prepare(model, optimizer)
    ema = None
    if config.ema_decay is not None:
        from ...models.ema import EMA

        ema = EMA(accelerator.unwrap_model(model), config.ema_decay).to(accelerator.device)
    state = RunState(model, optimizer, scheduler, ema)
    if start_from is not None:
        check_resume_config(config, saved_config(start_from), start_from / "config.yaml")  # before any weight
        load_checkpoint(accelerator, start_from, state)
        accelerator.print(f"resumed from {start_from} at update {state.step}")
    losses, last = _loop(task, accelerator, state)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        task.finish(accelerator, accelerator.unwrap_model(model), ema)
    accelerator.wait_for_everyone()
    return TrainResult(losses, accelerator.unwrap_model(model), ema, accelerator, last)


def train_command(prog: str, task: TrainingTask, resume: str | None, overwrite: bool) -> TrainResult | None:
    """:func:`train` for a script's ``main``: an unreadable checkpoint or a config error ends it with one line and
    exit code 2 (``SystemExit``); a non-finite loss or a checkpoint that could not be written (a full disk: the
    earlier checkpoints are intact) is one line on stderr and None (the script exits with code 1)."""
    from ..._arguments import user_error
    from .checkpoint import CheckpointWriteError
    from .folders import UnreadableCheckpointError

    try:
        return train(task, resume, overwrite)
    except NonFiniteLossError as error:
        print(f"{prog}: error: NonFiniteLossError: {error}", file=sys.stderr)
    except CheckpointWriteError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
    except (UnreadableCheckpointError, ConfigError) as error:
        raise user_error(prog, error) from None
    return None


def _loader(task, accelerator, dataset, stream: DataStream, start: int):
    config = task.config
    sampler = RankBatches(stream, start, config.steps, accelerator.process_index, config.batch_size)
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, collate_fn=task.collate, num_workers=config.num_workers
    )


def _check_stream(stream: DataStream, saved: dict, where) -> None:
    if saved and {k: saved.get(k) for k in ("global_batch", "length", "seed")} != {
        k: getattr(stream, k) for k in ("global_batch", "length", "seed")
    }:
        raise ConfigError(
            f"--resume: the run's data stream was {saved} ({where}), this run's "
            f"{stream.position(0)}: keep batch_size x processes, the data and the seed"
        )


def _loop(task, accelerator, state: RunState):
    config = task.config
    out = Path(config.out)
    dataset = task.dataset()
    stream = DataStream(len(dataset), config.batch_size * accelerator.num_processes, config.seed)
    _check_stream(stream, state.data, out)
    log = JsonLog(out / "log.jsonl", accelerator.is_main_process, state.step)
    positions = list(
        range(accelerator.process_index * config.batch_size, (accelerator.process_index + 1) * config.batch_size)
    )
    losses, last = {}, None
    with StopOnSignal() as stop:  # SIGINT / SIGTERM: checkpoint at the update boundary, exit 130
        for step, batch in zip(
            range(state.step, config.steps), _loader(task, accelerator, dataset, stream, state.step)
        ):
            saved = _update(task, accelerator, state, stream, log, positions, step, batch, losses)
            last = saved or last
            if stop.requested(accelerator) and state.step < config.steps:
                stop.exit(accelerator, saved or _save(task, accelerator, state))
    return losses, last


def _update(task, accelerator, state: RunState, stream, log, positions, step: int, batch, losses) -> Path | None:
    """Update ``step`` (0-based) in place of ``state``; returns the checkpoint it wrote, if any."""
    from accelerate.utils import set_seed

    config, out = task.config, Path(task.config.out)
    model, optimizer, ema = state.model, state.optimizer, state.ema
    set_seed(config.seed * SEED_STRIDE + step, device_specific=True)  # what a task draws outside SampleNoise
    model.train()
    with task.step_scope():
        with accelerator.autocast():
            loss = task.loss(model, batch, SampleNoise(config.seed, step, positions, accelerator.device))
        backward(accelerator, loss, step, lambda: latest_checkpoint(out))
    if config.grad_clip is not None:
        accelerator.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    if state.scheduler is not None:
        state.scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    if ema is not None:
        ema.update(accelerator.unwrap_model(model))
    state.step, state.data = step + 1, stream.position(step + 1)
    losses[state.step] = accelerator.reduce(loss.detach().float(), reduction="mean").item()
    if state.step % config.log_every == 0 or state.step == config.steps:
        log.write({"step": state.step, "loss": losses[state.step], "lr": optimizer.param_groups[0]["lr"]})
    if state.step % config.checkpoint_every == 0 or state.step == config.steps:
        return _save(task, accelerator, state)
    return None


def _save(task, accelerator, state: RunState) -> Path:
    config, model, ema = task.config, state.model, state.ema
    return save_checkpoint(
        accelerator,
        Path(config.out),
        state,
        resolved(config),
        config.keep,
        lambda folder: task.checkpoint_extras(folder, accelerator.unwrap_model(model), ema),
    )


class JsonLog:
    """``log.jsonl`` (main process): one line per logged update; opened at ``step``, lines after it are dropped
    (a resumed run's log reads as an uninterrupted one's)."""

    def __init__(self, path: Path, enabled: bool, step: int):
        self.path, self.enabled = path, enabled
        if enabled and path.is_file():
            lines = [line for line in path.read_text().splitlines() if line.strip()]
            kept = [line for line in lines if json.loads(line)["step"] <= step]
            if kept != lines:
                from ..._atomic import written_atomically

                with written_atomically(path) as temporary:
                    temporary.write_text("".join(line + "\n" for line in kept))

    def write(self, row: dict) -> None:
        if self.enabled:
            with self.path.open("a") as log:
                log.write(json.dumps(row) + "\n")
