"""Training the world video model in three stages, each resumable and seeded:

- ``vae``: the world VAE fine-tuned on clip frames (the textured 3D world has finer detail than its 2D scenes);
- ``base``: the video transformer (:mod:`mmpos.models.world.video`) on clips, without camera input;
- ``ucpe`` / ``plucker`` / ``prope``: a camera adapter (:class:`~mmpos.integrations.diffusers.camera_adapter.
  CameraAdapter`) on the frozen base, told each clip's trajectory.

A run folder holds the training scaffold's checkpoints ``checkpoint-<step>/`` (model, optimiser, every process's
generators, and ``video_progress.json``: config, step, losses, CPU seconds, finished; written every
``checkpoint_every`` steps and when time runs out; a ``state.pt`` of the earlier layout resumes too) and, when the
run finishes, the model in diffusers layout (``vae/``, ``transformer/`` or ``camera_adapter/``, each from
``save_pretrained``). Batches and noise are functions of ``(seed, step)``, so a resumed run takes the steps an
uninterrupted one would, bit for bit.

On N processes (torchrun; :mod:`..scaffold.processes`) ``batch_size`` is per process: every process draws the global batch's
clips, frames, sigmas and noise (one process draws what it always drew) and trains on its slice; the gradients are
averaged, the main process writes. The VAE stage's posterior noise is each process's own generator's.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..._atomic import folder_written_atomically
from ..._safe_state import load_torch_file, read_json, write_json
from ...models.world.video import encode_frames, flow_loss, world_video_transformer
from ..scaffold.checkpoint import RunState, load_checkpoint, save_checkpoint
from ..scaffold.config import check_resume_config
from ..scaffold.folders import latest_checkpoint
from ..scaffold.loop import update_averaging_gradients
from ..scaffold.processes import any_process, check_shared, local, make_accelerator, step_generator
from ..task_configs import VIDEO_STAGE_NAMES, WorldVideoConfig
from ..world.losses import vae_loss
from .nvs import learning_rate  # warm-up then cosine, from a config's lr, warmup and steps

STAGES = VIDEO_STAGE_NAMES
EXPORTED = {"vae": "vae", "base": "transformer"}  # camera stages export ``camera_adapter``


class VideoStage:
    """One stage's trainable module, frozen parts and per-step loss, over clips ``data`` (see
    :mod:`mmpos.world.video_data`)."""

    rows = slice(None)  # this process's rows of the global batch (train_stage sets it on N processes)
    global_batch = None  # batch_size x processes (None: batch_size)

    def __init__(self, config: WorldVideoConfig, data: dict, vae, base=None, device="cpu"):
        self.config, self.data, self.device = config, data, torch.device(device)
        self.vae, self.base = vae.to(self.device), None if base is None else base.to(self.device)
        torch.manual_seed(config.seed)
        if config.stage == "vae":
            self.trained = self.vae.train().requires_grad_(True)
            return
        self.latents = encode_frames(self.vae.eval(), data["frames"]).to(self.device)
        if config.stage == "base":
            self.trained = world_video_transformer().to(self.device)
            if config.init_from is not None:
                self._continue_from(Path(config.init_from))
            return
        from ...integrations.diffusers.camera_adapter import CameraAdapter

        if self.base is None:
            raise ValueError(
                f"stage {config.stage!r} trains a camera adapter: base (the trained transformer) is required"
            )
        self.base.eval().requires_grad_(False)
        self.trained = CameraAdapter.for_transformer(self.base, config.stage)
        if config.init_from is not None:
            self._continue_from(Path(config.init_from))

    def _continue_from(self, run: Path) -> None:
        """Start from the exported weights of a finished run of the same stage (a fresh optimiser and schedule)."""
        folder = run / EXPORTED.get(self.config.stage, "camera_adapter")
        state = read_stage_state(run)
        if state is None or not state["finished"] or state["recipe"]["stage"] != self.config.stage:
            raise ValueError(f"init_from must be a finished {self.config.stage!r} run folder, got {run}")
        self.trained.load_state_dict(type(self.trained).from_pretrained(folder).state_dict())

    def loss(self, generator: torch.Generator) -> torch.Tensor:
        """This process's loss; the draws are the global batch's (see the module docstring), sliced by ``rows``."""
        count, rows = len(self.data["frames"]), self.rows
        index = torch.randint(count, (self.global_batch or self.config.batch_size,), generator=generator)
        if self.config.stage == "vae":
            frame = torch.randint(self.data["frames"].shape[1], (len(index),), generator=generator)
            images = self.data["frames"][index[rows], frame[rows]].to(self.device).float() / 127.5 - 1
            return vae_loss(self.vae, images, kl_weight=1e-6)[0]
        sigmas = torch.sigmoid(torch.randn(len(index), generator=generator))[rows].to(self.device)
        noise = torch.randn((len(index), *self.latents.shape[1:]), generator=generator)[rows].to(self.device)
        index = index[rows]
        latents = self.latents[index.to(self.device)]
        if self.config.stage == "base":
            return flow_loss(self.trained, latents, sigmas, noise)
        from ...integrations.diffusers.camera_adapter import camera_conditioning

        with camera_conditioning(self.base, self.trained, self.cameras(index, latents.shape)):
            return flow_loss(self.base, latents, sigmas, noise)

    def cameras(self, index: torch.Tensor, latent_shape):
        from ...camera.video import stack_cameras, video_cameras
        from ...world.video_data import clip_trajectory

        _, _, frames, height, width = latent_shape
        patch = self.base.config.patch_size
        grid = (frames, height // patch[1], width // patch[2])
        size = tuple(self.data["frames"].shape[-2:])
        offset = tuple(self.trained.config.ray_offset)
        return stack_cameras(
            [
                video_cameras(clip_trajectory(self.data, int(i)), grid, size, offset=offset, device=self.device)
                for i in index
            ]
        )

    def export(self, out: Path) -> Path:
        folder = out / EXPORTED.get(self.config.stage, "camera_adapter")
        model = self.trained.eval().requires_grad_(False)
        if self.config.stage == "vae":  # latent normalisation measured on the clips, as the world VAE's
            model.register_to_config(shift_factor=0.0, scaling_factor=1.0)
            latents = encode_frames(model, self.data["frames"][:128])
            model.register_to_config(shift_factor=latents.mean().item(), scaling_factor=1 / latents.std().item())
        with folder_written_atomically(folder) as temporary:
            model.save_pretrained(temporary)
        return folder


def read_stage_state(run) -> dict | None:
    """A run folder's progress (config, step, losses, cpu_seconds, finished): its newest ``checkpoint-<step>/``,
    else a ``state.pt`` of the earlier layout (``weights_only=True``: a pickled object is refused by name, nothing
    runs); None when it has neither."""
    run = Path(run)
    latest = latest_checkpoint(run)
    if latest is not None:
        return dict(read_json(latest / "video_progress.json"), folder=str(latest))
    if (run / "state.pt").exists():
        return load_torch_file(run / "state.pt")
    return None


def train_stage(
    config: WorldVideoConfig,
    data: dict,
    out,
    vae,
    base=None,
    max_minutes: float = math.inf,
    stop_at: int | None = None,
    device="cpu",
    log=print,
) -> dict:
    """Train (or resume from ``out``'s newest checkpoint) until ``config.steps``, ``max_minutes`` of wall time or
    step ``stop_at``; returns the state (config, step, losses, cpu_seconds, finished). A finished run exports its
    model into ``out``. ``device``: where the models train (``"cuda"`` on a GPU; each process's own GPU on N);
    batches and noise are drawn on the CPU, so a run is the same sequence on any device. A non-finite loss stops
    before its update (:class:`~mmpos._validation.NonFiniteLossError`), keeping the last checkpoint."""
    out = Path(out)
    accelerator = make_accelerator("no", "the world trainers", cpu=str(device) == "cpu")
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    check_shared(accelerator, out)
    if accelerator.num_processes > 1:
        device = accelerator.device
    stage = VideoStage(config, data, vae, base, device)
    stage.accelerator = accelerator
    stage.rows = local(accelerator, config.batch_size)
    stage.global_batch = config.batch_size * accelerator.num_processes
    if accelerator.num_processes > 1:  # each process its own VAE posterior noise (one process: unchanged)
        torch.manual_seed(config.seed * 1_000_003 + accelerator.process_index)
    parameters = [p for p in stage.trained.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=config.lr, weight_decay=0.0)
    state = _resume(out, config, stage, optimizer, accelerator)
    wall_start, last = time.time(), config.steps if stop_at is None else min(stop_at, config.steps)
    while state["step"] < last and not any_process(accelerator, (time.time() - wall_start) >= max_minutes * 60):
        started = time.process_time()
        step = state["step"]
        loss = stage.loss(step_generator(config.seed, step))
        mean = update_averaging_gradients(
            accelerator, optimizer, parameters, loss, learning_rate(config, step), step, out
        )
        state["losses"].append(round(mean, 6))
        state["step"] += 1
        state["cpu_seconds"] += time.process_time() - started
        if state["step"] % config.checkpoint_every == 0:
            _save_state(accelerator, out, state, stage, optimizer)
            recent = state["losses"][-config.checkpoint_every :]
            if accelerator.is_main_process:
                log(
                    f"{config.stage} step {state['step']} loss {sum(recent) / len(recent):.5f} "
                    f"cpu {state['cpu_seconds'] / 60:.1f} min"
                )
    state["finished"] = state["step"] >= config.steps
    _save_state(accelerator, out, state, stage, optimizer)
    if state["finished"] and accelerator.is_main_process:
        stage.export(out)
    accelerator.wait_for_everyone()
    return state


def _resume(out: Path, config: WorldVideoConfig, stage: VideoStage, optimizer, accelerator) -> dict:
    """The run's state: fresh, or from ``out``'s newest checkpoint (or a ``state.pt`` of the earlier layout)."""
    state = dict(recipe=asdict(config), step=0, losses=[], cpu_seconds=0.0, finished=False)
    saved = read_stage_state(out)
    if saved is None:
        return state
    check_resume_config(config, saved["recipe"], out)  # a key that defines the run, changed: refused
    if "folder" in saved:
        load_checkpoint(accelerator, Path(saved.pop("folder")), RunState(stage.trained, optimizer))
        return saved
    saved = load_torch_file(out / "state.pt", map_location=stage.device)
    stage.trained.load_state_dict(saved.pop("model"))
    optimizer.load_state_dict(saved.pop("optimizer"))
    return saved


def _save_state(accelerator, out: Path, state: dict, stage: VideoStage, optimizer) -> None:
    run = RunState(stage.trained, optimizer, step=state["step"])
    save_checkpoint(
        accelerator,
        out,
        run,
        dict(state["recipe"]),
        keep=2,
        extras=lambda folder: write_json(folder / "video_progress.json", state),
    )


def cached_clips(out: Path, scenes: int, frames: int, size: int) -> dict:
    """The training clips, rendered once per run folder (``OUT/clips-train.pt``; read as plain tensors only)."""
    import os

    from ..._atomic import written_atomically
    from ...world.video_data import make_clips

    path = out / "clips-train.pt"
    if path.exists():
        data = load_torch_file(path)
        if tuple(data["frames"].shape[:2]) == (scenes * 4, frames) and data["frames"].shape[-1] == size:
            return data
    main = int(os.environ.get("RANK", "0")) == 0  # every process renders the same clips; the main one caches them
    data = make_clips("train", scenes, frames=frames, size=size, progress=main)
    if main:
        with written_atomically(path) as temporary:
            torch.save(data, temporary)
    return data


def earlier_run(out: Path) -> list[Path]:
    """What a run left in ``out``: checkpoints (also partial ones) and a ``state.pt`` of the earlier layout."""
    if not out.is_dir():
        return []
    names = ("checkpoint-", ".checkpoint-")
    return sorted(p for p in out.iterdir() if p.name == "state.pt" or p.name.startswith(names))


def run_command(config: WorldVideoConfig, resume: bool, overwrite: bool) -> int:
    """``mmpos train world_video``: the clips (cached in ``out``), the VAE (``config.vae``, default the shipped
    one) and base, then :func:`train_stage` until ``steps`` or ``max_minutes`` (rerun with ``resume`` to go on)."""
    import os

    from diffusers import AutoencoderKL, WanTransformer3DModel

    from ...models.world.image import DEFAULT_ASSETS
    from ..scaffold.folders import refuse_earlier_run, remove_paths

    out = Path(config.out)
    earlier = earlier_run(out)
    refuse_earlier_run(f"--out {out} holds an earlier run ({earlier[0].name})" if earlier else None, resume, overwrite)
    if config.stage not in ("vae", "base") and not config.base:
        raise ValueError(
            f"--stage {config.stage} trains a camera adapter: pass --base (the transformer folder of a finished "
            "base run)"
        )
    if config.threads:
        torch.set_num_threads(config.threads)
    out.mkdir(parents=True, exist_ok=True)
    if overwrite and int(os.environ.get("RANK", "0")) == 0:
        remove_paths(earlier)
    data = cached_clips(out, config.train_scenes, config.frames, config.size)
    vae = AutoencoderKL.from_pretrained(config.vae or DEFAULT_ASSETS / "world-vae")
    base = WanTransformer3DModel.from_pretrained(config.base) if config.base else None
    state = train_stage(
        config,
        data,
        out,
        vae,
        base,
        max_minutes=config.max_minutes,
        device=config.device,
        log=lambda line: print(line, flush=True),
    )
    done = "finished" if state["finished"] else "stopped (rerun with --resume)"
    print(f"{config.stage}: {done} at step {state['step']}, {state['cpu_seconds'] / 60:.1f} CPU minutes")
    return 0
