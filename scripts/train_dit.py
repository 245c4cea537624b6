"""Train the reference DiT (mmpos.models.DiT) with any mmpos encoding, on pixels or VAE latents.

Quick CPU check (a tiny model, procedural shapes, three steps):
    python scripts/train_dit.py --tiny --data shapes --steps 3 --output-dir outputs/dit_tiny
A real run (ImageNet-style folder, SD VAE latents, bf16, 4 GPUs):
    accelerate launch --num_processes 4 scripts/train_dit.py --model DiT-B/2 --pe rope_mixed \
        --data folder --data-dir /data/imagenet/train --vae stabilityai/sd-vae-ft-ema --resolution 256 \
        --batch-size 64 --steps 400000 --mixed-precision bf16 --objective flow --output-dir outputs/dit_b2_mixed
Resume with the same command plus ``--resume latest``. Outputs: ``checkpoint-<step>/`` (accelerate state:
model, optimizer, RNG; ``ema.safetensors``; nothing unpickled on resume), ``model/`` and ``model_ema/`` (``DiT.from_pretrained``), ``samples.png``; each is
written under a temporary name and renamed into place, so a killed run keeps its last complete checkpoint. An
--output-dir holding an earlier run is refused without --resume or --overwrite; a NaN or inf loss stops the run
(exit code 1) before it reaches the weights.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from mmpos.models import DIT_PRESETS, EMA, DiT, ProceduralShapes, diffusion_loss, make_noise_scheduler, sample_dit
from mmpos._atomic import folder_written_atomically, replace_folder, written_atomically
from mmpos._validation import (NonFiniteLossError, OneLineErrorParser, check_finite_loss, finite_float_arg,
                               positive_int_arg)
from mmpos.models.dit_training import OBJECTIVES

TINY = dict(depth=2, hidden_size=64, num_heads=2, patch_size=2)


def parse_args(argv=None):
    p = OneLineErrorParser(prog="train_dit.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="DiT-S/2", choices=sorted(DIT_PRESETS), help="size preset")
    p.add_argument("--tiny", action="store_true", help="a 2-block, width-64 model for CPU checks")
    p.add_argument("--pe", default="ape_sincos", help="registered encoding (mmpos list)")
    p.add_argument("--pe-options", type=json.loads, default={}, help='JSON, e.g. \'{"theta": 100}\'')
    p.add_argument("--objective", default="epsilon", choices=OBJECTIVES)
    p.add_argument("--data", default="shapes", choices=("shapes", "random", "folder"))
    p.add_argument("--data-dir", type=Path, help="ImageFolder root for --data folder")
    p.add_argument("--vae", help="AutoencoderKL path or hub id: train on its latents (x scaling_factor)")
    p.add_argument("--resolution", type=int, default=32, help="image side in pixels")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--steps", type=positive_int_arg, default=1000)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--ema-decay", type=float, default=0.9999)
    p.add_argument("--mixed-precision", default="no", choices=("no", "bf16", "fp16"))
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--checkpoint-every", type=positive_int_arg, default=1000)
    p.add_argument("--resume", help="'latest' or a checkpoint-<step> folder")
    p.add_argument("--sample-steps", type=int, default=50, help="sampling steps for samples.png (0: none)")
    p.add_argument("--guidance-scale", type=finite_float_arg, default=1.5)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", type=Path, default=Path("outputs/dit"))
    p.add_argument("--overwrite", action="store_true", help="replace an earlier run in --output-dir")
    args = p.parse_args(argv)
    try:
        check_output_dir(args)
    except (OSError, ValueError) as error:
        p.error(str(error))
    return args


RUN_OUTPUTS = ("model", "model_ema", "samples.png")


def check_output_dir(args) -> None:
    """Before training: --output-dir must be a folder, and an earlier run there needs --resume or --overwrite
    (which deletes that run's checkpoints and outputs, nothing else)."""
    out = args.output_dir
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--output-dir {out} is a file; expected a folder")
    if args.resume and args.overwrite:
        raise ValueError("--resume continues the earlier run and --overwrite replaces it: pass one")
    earlier = sorted(out.glob("checkpoint-*")) + [out / name for name in RUN_OUTPUTS if (out / name).exists()]
    if earlier and not (args.resume or args.overwrite):
        raise FileExistsError(f"--output-dir {out} holds an earlier run ({earlier[0].name}, ...); pass --resume latest "
                              "to continue it or --overwrite to replace it")
    if args.overwrite:
        for path in earlier:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def build_dataset(args, channels: int):
    if args.data == "shapes":
        length = max(args.steps * args.batch_size, 1024)
        return ProceduralShapes(args.resolution, channels, args.num_classes, length=length)
    if args.data == "random":
        g = torch.Generator().manual_seed(args.seed)
        images = torch.randn(256, channels, args.resolution, args.resolution, generator=g).clamp(-1, 1)
        labels = torch.randint(0, args.num_classes, (256,), generator=g)
        return torch.utils.data.TensorDataset(images, labels)
    if args.data_dir is None:
        raise SystemExit("--data folder needs --data-dir")
    from torchvision import datasets, transforms

    tf = transforms.Compose([transforms.Resize(args.resolution), transforms.CenterCrop(args.resolution),
                             transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                             transforms.Normalize([0.5] * 3, [0.5] * 3)])
    return datasets.ImageFolder(args.data_dir, transform=tf)


def build_model(args, in_channels: int, sample_size: int) -> DiT:
    arch = dict(DIT_PRESETS[args.model], **(TINY if args.tiny else {}))
    return DiT(**arch, sample_size=sample_size, in_channels=in_channels, num_classes=args.num_classes, pe=args.pe,
               pe_options=args.pe_options)


def load_vae(args, device):
    if not args.vae:
        return None
    from diffusers import AutoencoderKL

    return AutoencoderKL.from_pretrained(args.vae).to(device).eval().requires_grad_(False)


def latest_checkpoint(output_dir: Path) -> Path | None:
    found = [(int(m.group(1)), p) for p in output_dir.glob("checkpoint-*")
             if (m := re.fullmatch(r"checkpoint-(\d+)", p.name))]
    return max(found)[1] if found else None


def batches(loader):
    while True:
        yield from loader


def main(argv=None) -> int:
    args = parse_args(argv)
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    set_seed(args.seed + accelerator.process_index)
    vae = load_vae(args, accelerator.device)
    in_channels = vae.config.latent_channels if vae else 3
    factor = 2 ** (len(vae.config.block_out_channels) - 1) if vae else 1
    if args.resolution % factor:
        raise SystemExit(f"--resolution {args.resolution} must be divisible by the VAE factor {factor}")
    model = build_model(args, in_channels, args.resolution // factor)
    if args.gradient_checkpointing:
        model.enable_gradient_checkpointing()
    ema = EMA(model, args.ema_decay)
    no_decay = model.no_weight_decay()
    named = list(model.named_parameters())
    groups = [dict(params=[p for n, p in named if n not in no_decay], weight_decay=args.weight_decay),
              dict(params=[p for n, p in named if n in no_decay], weight_decay=0.0)]
    optimizer = torch.optim.AdamW(groups, lr=args.lr)
    loader = torch.utils.data.DataLoader(build_dataset(args, 3), batch_size=args.batch_size, shuffle=True,
                                         drop_last=True, num_workers=args.num_workers)
    if len(loader) == 0:
        raise SystemExit(f"the data set has fewer than --batch-size={args.batch_size} images")
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    ema.to(accelerator.device)  # checkpointed as ema.safetensors (accelerate would pickle a registered object)
    scheduler = make_noise_scheduler(args.objective)

    step = 0
    resume = Path(args.resume) if args.resume and args.resume != "latest" else None
    if args.resume == "latest":
        resume = latest_checkpoint(args.output_dir)
    if resume is not None:
        load_checkpoint(accelerator, resume, ema)
        step = int(resume.name.split("-")[-1])
        accelerator.print(f"resumed from {resume} at step {step}")

    data = batches(loader)
    bar = tqdm(range(step, args.steps), initial=step, total=args.steps, disable=not accelerator.is_main_process)
    for step in bar:
        images, labels = next(data)
        x0 = encode(vae, images) if vae else images
        with accelerator.autocast():
            loss = diffusion_loss(model, x0, labels, args.objective, scheduler)
        check_finite_loss(accelerator.gather(loss.detach()[None]), step + 1, lambda: kept_message(args.output_dir))
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ema.update(accelerator.unwrap_model(model))
        bar.set_postfix(loss=f"{loss.item():.4f}")
        done = step + 1
        if done % args.checkpoint_every == 0 or done == args.steps:
            save_checkpoint(accelerator, args.output_dir / f"checkpoint-{done}", ema)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        save_outputs(args, accelerator.unwrap_model(model), ema.model, vae)
    return 0


def load_checkpoint(accelerator, folder: Path, ema) -> None:
    """``accelerator.load_state`` (safetensors and ``weights_only`` loads only) and ``ema.safetensors``; a missing,
    truncated, foreign or unsafe checkpoint ends the run naming its folder. A checkpoint of earlier versions holds the
    EMA as accelerate's ``custom_checkpoint_0.pkl``: read with ``weights_only=True`` (a pickled object is refused)."""
    import tempfile

    from safetensors import SafetensorError
    from safetensors.torch import load_model

    from mmpos._safe_state import UnsafeStateError, load_torch_file

    if not folder.is_dir():
        raise SystemExit(f"train_dit.py: error: --resume {folder}: no such checkpoint folder")
    old_ema = folder / "custom_checkpoint_0.pkl"
    try:
        if old_ema.is_file():
            ema.load_state_dict(load_torch_file(old_ema, accelerator.device))
            with tempfile.TemporaryDirectory() as view:  # the rest, without the custom object accelerate unpickles
                for part in folder.iterdir():
                    if part != old_ema:
                        (Path(view) / part.name).symlink_to(part.resolve())
                accelerator.load_state(view)
        else:
            accelerator.load_state(str(folder))
            load_model(ema, str(folder / "ema.safetensors"), device=str(accelerator.device))
    except UnsafeStateError as error:
        raise SystemExit(f"train_dit.py: error: {folder}: cannot be resumed ({error})")
    except (OSError, EOFError, RuntimeError, ValueError, KeyError, SafetensorError) as error:
        message = " ".join(str(error).split())
        raise SystemExit(f"train_dit.py: error: {folder}: cannot be resumed ({type(error).__name__}: {message})")


def kept_message(output_dir: Path) -> str:
    kept = latest_checkpoint(output_dir)
    return f"The last checkpoint, {kept}, is kept (--resume latest)." if kept else "No checkpoint was written yet."


def save_checkpoint(accelerator, folder: Path, ema) -> None:
    """``accelerator.save_state`` into a hidden temporary folder (every process writes its part), renamed to
    ``folder`` by the main process once complete."""
    partial = folder.with_name(f".{folder.name}.partial")
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)  # left over by a killed run
    accelerator.wait_for_everyone()
    accelerator.save_state(str(partial))
    if accelerator.is_main_process:
        from safetensors.torch import save_model

        save_model(ema, str(partial / "ema.safetensors"))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        replace_folder(partial, folder)
    accelerator.wait_for_everyone()


@torch.no_grad()
def encode(vae, images):
    return vae.encode(images.to(vae.device, vae.dtype)).latent_dist.sample() * vae.config.scaling_factor


@torch.no_grad()
def save_outputs(args, model, ema_model, vae):
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for name, weights in (("model", model), ("model_ema", ema_model)):
        with folder_written_atomically(args.output_dir / name) as folder:
            weights.save_pretrained(folder)
    if args.sample_steps <= 0:
        return
    from torchvision.utils import save_image

    labels = torch.arange(min(args.num_classes, 16), device=ema_model.device).repeat_interleave(2)
    sampler = make_noise_scheduler(args.objective, sampler="ddim" if args.objective != "flow" else None)
    generator = torch.Generator(ema_model.device).manual_seed(args.seed)
    x = sample_dit(ema_model, sampler, labels, args.sample_steps, args.guidance_scale, generator=generator,
                   progress=True)
    if vae is not None:
        x = vae.decode(x.to(vae.dtype) / vae.config.scaling_factor).sample
    with written_atomically(args.output_dir / "samples.png") as temporary:
        save_image((x.float().clamp(-1, 1) + 1) / 2, temporary, nrow=int(math.sqrt(len(x))) + 1)


def run(argv=None) -> int:
    try:
        return main(argv)
    except NonFiniteLossError as error:
        print(f"train_dit.py: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(run())
