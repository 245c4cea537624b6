"""Train a camera adapter (ucpe | prope | plucker) on a frozen Wan transformer with flow matching.

    accelerate launch scripts/train_camera_adapter.py --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --data DATA \\
        --kind ucpe --out runs/ucpe --steps 20000 --batch-size 1 --frames 49 --height 480 --width 832 \\
        --bf16 --gradient-checkpointing
    python scripts/train_camera_adapter.py --data DATA --out runs/tiny --steps 4     # tiny offline Wan, CPU

Only the adapter's parameters train (the transformer, VAE and text encoder are frozen). Data: clip folders
(:mod:`mmpos.pipelines.camera_clips`: RealEstate10K pose files or `mmpos world clip` output). Checkpoints
(``OUT/checkpoint-STEP``: adapter via ``save_pretrained``, optimiser and RNG states) are written to a temporary
folder and renamed into place; ``--resume`` continues from the latest. Batches, noise and timesteps are drawn
from generators seeded by ``(seed, step)``, so a resumed run takes the same steps as an uninterrupted one.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from mmpos.integrations.diffusers.camera_adapter import ADAPTER_KINDS, CameraAdapter, camera_conditioning
from mmpos.camera.video import stack_cameras, video_cameras
from mmpos.pipelines.camera_clips import find_clips, load_sample
from mmpos.pipelines.lens_augment import LENS_MODELS, LensAugmentation


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="train_camera_adapter", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="folder of clip folders")
    p.add_argument("--model", default="tiny", help="Wan diffusers pipeline path or hub id (default: tiny offline)")
    p.add_argument("--kind", default="ucpe", choices=ADAPTER_KINDS)
    p.add_argument("--head-dim", type=int, help="adapter head dim (default: UCPE's sizing, dim / 8)")
    p.add_argument("--out", required=True, help="run folder (checkpoints, log.jsonl)")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--frames", type=int, default=9, help="video frames per sample, 4k+1")
    p.add_argument("--height", type=int, default=32)
    p.add_argument("--width", type=int, default=48)
    p.add_argument("--max-zoom", type=float, default=1.0, help="random focal augmentation: centre crops up to "
                   "this zoom, intrinsics scaled to match (UCPE-style; 1 = off)")
    p.add_argument("--lens-models", nargs="+", choices=LENS_MODELS, help="random camera-model augmentation "
                   "(UCPE-style): each sample is re-rendered with one of these models (OpenCV radial k1, k2; unified "
                   "xi: fisheye-like), zoomed up to --max-zoom, and the adapter gets its rays (default: off)")
    p.add_argument("--max-sequence-length", type=int, default=512)
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision; frozen parts stored in bf16")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--checkpoint-every", type=int, default=500)
    p.add_argument("--resume", action="store_true", help="continue from the latest OUT/checkpoint-*")
    p.add_argument("--seed", type=int, default=0)
    return p


class AdapterTraining(nn.Module):
    """The trainable module accelerate wraps: the adapter; the frozen transformer is held, not registered. The
    adapter reaches the transformer through its installed processors (:func:`camera_conditioning`, kept
    installed through the backward pass, which gradient checkpointing recomputes)."""

    def __init__(self, adapter: CameraAdapter, transformer):
        super().__init__()
        self.adapter = adapter
        self.__dict__["transformer"] = transformer  # not a submodule: not in the state dict, not DDP-synced

    def forward(self, noisy, timestep, text):
        return self.transformer(hidden_states=noisy, timestep=timestep, encoder_hidden_states=text,
                                return_dict=False)[0]


def load_parts(model: str, dtype):
    from mmpos.pipelines import CameraControlWanPipeline

    if model == "tiny":
        from mmpos.pipelines.tiny_wan import tiny_wan_components

        return CameraControlWanPipeline(**tiny_wan_components())
    return CameraControlWanPipeline.from_pretrained(model, torch_dtype=dtype)


def latest_checkpoint(out: Path):
    found = sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    return found[-1] if found else None


def batch_for(args, clips, pipe, adapter, device, generator):
    """Videos -> normalised latents, captions -> text embeddings, paths -> cameras on the latent grid."""
    picks = torch.randint(len(clips), (args.batch_size,), generator=generator).tolist()
    size = (args.height, args.width)
    if args.lens_models:
        augmentation = LensAugmentation(tuple(args.lens_models), args.max_zoom)
        samples = [load_sample(clips[i], args.frames, size, lens=augmentation.sample(generator)) for i in picks]
    else:
        zooms = (1 + (args.max_zoom - 1) * torch.rand(args.batch_size, generator=generator)).tolist()
        samples = [load_sample(clips[i], args.frames, size, z) for i, z in zip(picks, zooms)]
    video = torch.stack([s[0] for s in samples]).to(device, pipe.vae.dtype)
    with torch.no_grad():
        latents = pipe.vae.encode(video).latent_dist.mode()
        mean = torch.tensor(pipe.vae.config.latents_mean, device=device).view(1, -1, 1, 1, 1)
        std = torch.tensor(pipe.vae.config.latents_std, device=device).view(1, -1, 1, 1, 1)
        latents = ((latents.float() - mean) / std)
        text, _ = pipe.encode_prompt([s[2] for s in samples], do_classifier_free_guidance=False,
                                     max_sequence_length=args.max_sequence_length, device=device)
    _, _, frames, rows, cols = latents.shape
    patch = pipe.transformer.config.patch_size
    grid = (frames, rows // patch[1], cols // patch[2])
    offset = tuple(adapter.config.ray_offset)
    cameras = stack_cameras([video_cameras(s[1], grid, (args.height, args.width), device=device, offset=offset)
                             for s in samples])
    return latents, text, cameras


def train(argv=None) -> dict:
    from accelerate import Accelerator

    parser = build_parser()
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    resume_from = latest_checkpoint(out)
    if resume_from is not None and not args.resume:
        parser.exit(2, f"{parser.prog}: error: {out} has checkpoints; pass --resume or another --out\n")
    accelerator = Accelerator(mixed_precision="bf16" if args.bf16 else "no")
    device = accelerator.device
    frozen_dtype = torch.bfloat16 if args.bf16 else torch.float32
    pipe = load_parts(args.model, frozen_dtype)
    pipe.to(device)
    if args.bf16:
        for part in (pipe.transformer, pipe.text_encoder):
            part.to(dtype=torch.bfloat16)
    for part in (pipe.transformer, pipe.vae, pipe.text_encoder):
        part.requires_grad_(False)
    if args.gradient_checkpointing:
        pipe.transformer.enable_gradient_checkpointing()
    options = {} if args.head_dim is None else dict(head_dim=args.head_dim)
    torch.manual_seed(args.seed)
    adapter = CameraAdapter.for_transformer(pipe.transformer, args.kind, **options)
    if adapter.dtype != torch.float32:
        adapter = adapter.to(dtype=torch.float32)  # fp32 master weights; bf16 only inside autocast
    model = AdapterTraining(adapter, pipe.transformer)
    optimizer = torch.optim.AdamW(adapter.parameters(), lr=args.lr)
    model, optimizer = accelerator.prepare(model, optimizer)
    start = 0
    if resume_from is not None:
        accelerator.load_state(str(resume_from))
        start = json.loads((resume_from / "step.json").read_text())["step"]
    clips = find_clips(args.data)
    losses = {}
    for step in range(start + 1, args.steps + 1):
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + step * accelerator.num_processes
                                                  + accelerator.process_index)
        latents, text, cameras = batch_for(args, clips, pipe, adapter, device, generator)
        noise = torch.randn(latents.shape, generator=generator).to(device)
        sigma = torch.rand(latents.shape[0], generator=generator).to(device)
        noisy = (1 - sigma.view(-1, 1, 1, 1, 1)) * latents + sigma.view(-1, 1, 1, 1, 1) * noise
        with camera_conditioning(pipe.transformer, adapter, cameras):
            with accelerator.autocast():
                prediction = model(noisy.to(pipe.transformer.dtype), sigma * 1000, text)
            loss = F.mse_loss(prediction.float(), (noise - latents).float())
            accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses[step] = loss.item()
        if accelerator.is_main_process:
            with (out / "log.jsonl").open("a") as log:
                log.write(json.dumps({"step": step, "loss": losses[step]}) + "\n")
        if step % args.checkpoint_every == 0 or step == args.steps:
            save_checkpoint(accelerator, model, out, step)
    return losses


def save_checkpoint(accelerator, model, out: Path, step: int) -> Path:
    """``OUT/checkpoint-STEP``: accelerate state + ``adapter/`` (save_pretrained), renamed into place."""
    final = out / f"checkpoint-{step}"
    temporary = out / f".checkpoint-{step}.partial"
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shutil.rmtree(temporary, ignore_errors=True)
    accelerator.save_state(str(temporary))
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).adapter.save_pretrained(temporary / "adapter")
        (temporary / "step.json").write_text(json.dumps({"step": step}))
        temporary.rename(final)
    accelerator.wait_for_everyone()
    return final


def main(argv=None) -> int:
    losses = train(argv)
    if losses:
        last = max(losses)
        print(f"trained to step {last}: loss {losses[last]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
