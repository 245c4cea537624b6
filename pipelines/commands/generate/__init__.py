"""``mmpos generate``: text to image (``generate image``, also plain ``generate``: FLUX.1, Qwen-Image or the world
t2i model) and camera-controlled video (``generate video``: Wan, or the mini-world's image-to-video model). The
options are declared here; the runs (:mod:`mmpos.pipelines.commands.generate.image`, :mod:`mmpos.pipelines.commands.generate.video`)
are imported when the command runs."""

from __future__ import annotations

import argparse

from mmpos._arguments import finite_float_arg, positive_int_arg
from mmpos._camera_motions import vocabulary_help

from .._options import add_run_options
from .video import SPATIAL

VIDEO_DESCRIPTION = (
    "``mmpos generate video``: a camera-controlled video (Wan, or a camera family's pipeline folder) from the command "
    "line."
)


# The text-to-image families of the diffusers family registry (mmpos.integrations.diffusers.families) and their
# pipelines, written out so that ``--help`` imports neither torch nor diffusers; a test keeps it equal to the
# registry's builtin families without a time axis.
IMAGE_FAMILIES = {
    "bria": ("BriaPipeline",),
    "bria_fibo": ("BriaFiboPipeline", "BriaFiboEditPipeline"),
    "bria_fibo2": ("BriaFibo2Pipeline",),
    "chroma": ("ChromaPipeline", "ChromaImg2ImgPipeline", "ChromaInpaintPipeline"),
    "cogview4": ("CogView4Pipeline", "CogView4ControlPipeline"),
    "ernie_image": ("ErnieImagePipeline",),
    "flux": ("FluxPipeline", "FluxFillPipeline", "FluxKontextPipeline"),
    "flux2": ("Flux2Pipeline", "Flux2KleinPipeline", "Flux2KleinInpaintPipeline"),
    "flux3": ("Flux3ModularPipeline", "Flux3DistilledModularPipeline"),
    "glm_image": ("GlmImagePipeline",),
    "hidream": ("HiDreamImagePipeline",),
    "hunyuan_image": ("HunyuanImagePipeline",),
    "hunyuandit": ("HunyuanDiTPipeline", "HunyuanDiTControlNetPipeline", "HunyuanDiTPAGPipeline"),
    "ideogram4": ("Ideogram4Pipeline",),
    "krea2": ("Krea2Pipeline",),
    "longcat_image": ("LongCatImagePipeline", "LongCatImageEditPipeline"),
    "lumina2": ("Lumina2Pipeline",),
    "lumina_next": ("LuminaPipeline",),
    "nucleusmoe_image": ("NucleusMoEImagePipeline",),
    "ovis_image": ("OvisImagePipeline",),
    "prx": ("PRXPipeline", "PRXPixelPipeline"),
    "qwen": (
        "QwenImagePipeline",
        "QwenImageEditPipeline",
        "QwenImageEditPlusPipeline",
        "QwenImageImg2ImgPipeline",
        "QwenImageInpaintPipeline",
    ),
    "qwenimage21": ("QwenImage21Pipeline",),
    "z_image": (
        "ZImagePipeline",
        "ZImageImg2ImgPipeline",
        "ZImageInpaintPipeline",
        "ZImageControlNetPipeline",
        "ZImageControlNetInpaintPipeline",
        "ZImageOmniPipeline",
    ),
}


def with_image_families(parser) -> None:
    """``parser``'s help ends with the text-to-image families (:data:`IMAGE_FAMILIES`) and their pipelines."""
    plain = parser.format_help
    rows = "\n".join(f"  {name}: {', '.join(pipelines)}" for name, pipelines in IMAGE_FAMILIES.items())

    def format_help() -> str:
        return f"{plain()}\ntext-to-image families (--model's model_index.json picks one):\n{rows}\n"

    parser.format_help = format_help


def register(subparsers) -> None:
    """Register ``generate`` (its own options: ``generate image``'s) with ``image`` and ``video`` beneath it."""
    generate = subparsers.add_parser(
        "generate",
        help="text-to-image with any registered diffusers family (FLUX.1, FLUX.2, Qwen-Image, Z-Image, ...; or the "
        "world t2i model), optionally above the training size; "
        "`generate video`: camera-controlled Wan video",
        description="Generate images with the stock pipeline of a registered diffusers family (listed below; the "
        "--model's model_index.json decides; configs/generate.yaml; --model world: the shipped world t2i model, "
        "configs/generate_world.yaml). --extrapolate dype|ntk|yarn|pi|... extrapolates the RoPE beyond "
        "extrapolate.train_size (auto: 1024 px for FLUX.1, 1328 px for Qwen-Image; DyPE follows the "
        "denoising step). Camera-controlled Wan videos: `mmpos generate video --help`.",
    )
    add_image_arguments(generate)
    generate.set_defaults(func=run)
    with_image_families(generate)
    kinds = generate.add_subparsers(dest="generate_command", metavar="{image,video}")
    image = kinds.add_parser(
        "image", help="text-to-image (what `mmpos generate` alone runs)", description=generate.description
    )
    add_image_arguments(image)
    with_image_families(image)
    video = kinds.add_parser(
        "video",
        help="camera-controlled video: Wan, a camera family's pipeline folder, or the mini-world's image-to-video "
        "model",
        description=VIDEO_DESCRIPTION,
    )
    add_video_arguments(video)
    video.set_defaults(video_parser=video)


def add_image_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``mmpos generate [image]``."""
    parser.add_argument("--prompt", action="append", help="prompt, repeat for more (default: the config's prompts)")
    parser.add_argument(
        "--height",
        type=positive_int_arg,
        help="output height in pixels (default: the config's sampler.height: 1024 FLUX.1, 32 world)",
    )
    parser.add_argument(
        "--width", type=positive_int_arg, help="output width in pixels (default: the config's sampler.width)"
    )
    parser.add_argument(
        "--extrapolate",
        help="none | pi | ntk | yarn | vision_yarn | dype | dype_ntk | dype_yarn, "
        "or per axis: row=dype,col=ntk; with one attention rule after +: ultraimage (UltraImage's per-head "
        "attention sharpening; FLUX.1, FLUX.2, Chroma, Z-Image) or spa (HRDiT's bundle grids on the first 3 "
        "steps; FLUX.1, Chroma) or sega (SEGA's spectral-energy factors per RoPE pair, on NTK unless a preset is "
        "named; FLUX.1, FLUX.2, Chroma, Z-Image, Qwen-Image), past the training size, e.g. dype+ultraimage "
        "(default: the config's extrapolate.preset, none)",
    )
    parser.add_argument(
        "--train-size",
        type=positive_int_arg,
        help="training resolution in pixels (default: the config's "
        "extrapolate.train_size; auto: 1024 FLUX.1, 1328 Qwen-Image, 32 world)",
    )
    parser.add_argument(
        "--dype-shift",
        choices=("authors", "comfyui", "off"),
        help="with a DyPE preset above the training size, the noise schedule's mu: the DyPE authors' (max_shift at "
        "every size), ComfyUI-DyPE's, or off (the pipeline's own; default: the config's extrapolate.shift, authors)",
    )
    add_run_options(parser, "generate", figures=False)  # images and config.yaml only
    parser.set_defaults(method="generate")


def add_video_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``mmpos generate video``."""
    parser.add_argument(
        "--model",
        help="Wan diffusers pipeline (from_pretrained path or hub id), or the saved pipeline folder of a family "
        "that takes camera adapters (HunyuanVideo 1.5, LTX-2, SkyReels-V2, Cosmos); 'world': the "
        "mini-world's trained image-to-video model (32 px, CPU, seconds; see --camera); 'tiny': "
        "offline components with random weights (default: world when assets/world-video is there, "
        "else tiny)",
    )
    parser.add_argument(
        "--image",
        help="first frame (PNG/JPEG): image-to-video (default: none, text-to-video; "
        "--model world: a held-out world scene)",
    )
    parser.add_argument("--prompt", default="a slow camera move around a house", help="text prompt")
    parser.add_argument("--negative-prompt", default="", help="negative prompt")
    parser.add_argument(
        "--prompt-embeds",
        metavar="FILE",
        help="safetensors file of the pipeline's prompt tensors under its __call__ names (prompt_embeds, "
        "prompt_embeds_mask, ...), instead of --prompt: for a pipeline folder saved without text encoders "
        "(default: none, --prompt is encoded)",
    )
    parser.add_argument(
        "--frames",
        help="video frames, 4k+1 (default: 81; tiny: 17), or a multiple of the trained "
        "length: 2x = twice --train-frames' duration (81 -> 161)",
    )
    parser.add_argument("--height", type=positive_int_arg, help="pixels, multiple of 16 (default: 480; tiny: 64)")
    parser.add_argument("--width", type=positive_int_arg, help="pixels, multiple of 16 (default: 832; tiny: 96)")
    parser.add_argument(
        "--camera",
        help=f"a camera motion [preset:]NAME[:AMOUNT]: {vocabulary_help()}; or a "
        "RealEstate10K .txt / mmpos .json trajectory (default: orbit; --model world: orbit:35, and "
        "it was trained on orbit, dolly and pan only: the others run with a note)",
    )
    parser.add_argument(
        "--adapter",
        help="camera adapter folder (CameraAdapter.save_pretrained); without it the "
        "camera is plotted but does not steer the video (default: none; --model world: "
        "MODEL/camera-ucpe, 'none' for the base model alone)",
    )
    parser.add_argument(
        "--compare-motions",
        action="store_true",
        help="--model world: also generate orbit, dolly and pan from the same first frame and seed, print each "
        "one's camera following (RotErr / TransErr, and whether the model follows it) and write motions.png "
        "side by side (every run writes following.json)",
    )
    parser.add_argument(
        "--camera-scale", type=finite_float_arg, default=1.0, help="strength of the adapter (default: 1)"
    )
    parser.add_argument(
        "--extrapolate",
        nargs="+",
        choices=("riflex", "ultravico", "freeloc", *SPATIAL),
        default=[],
        metavar="METHOD",
        help="beyond the trained length and size without training (set_pe): riflex on time, ultravico "
        "(attention decay past the trained length) or freeloc (time positions regrouped into the trained range "
        "past it), each composing with riflex; one of "
        f"{', '.join(SPATIAL)} on rows and columns larger than trained (dype*: follows the "
        "denoising step) (default: none)",
    )
    parser.add_argument(
        "--ultravico-alpha",
        type=finite_float_arg,
        default=0.9,
        help="--extrapolate ultravico: the decay on attention logits beyond half the trained length, in (0, 1] "
        "(default: 0.9, the authors')",
    )
    parser.add_argument(
        "--train-frames",
        type=int,
        help="video frames the model was trained on, for --extrapolate and --frames Nx (default: 81; tiny: 17)",
    )
    parser.add_argument(
        "--riflex-repeat",
        type=positive_int_arg,
        metavar="FRAMES",
        help="--extrapolate riflex: the video frame where the stock model's video first repeats "
        "(RIFLEx's N, observed past the trained length); k is the time pair whose period is "
        "closest to its latent frame (default: --train-frames)",
    )
    parser.add_argument(
        "--train-size",
        help="HEIGHTxWIDTH the model was trained on, for the spatial --extrapolate (default: 480x832; tiny: 64x96)",
    )
    parser.add_argument("--steps", type=positive_int_arg, help="denoising steps (default: 50; tiny: 4)")
    parser.add_argument(
        "--guidance", type=finite_float_arg, default=5.0, help="classifier-free guidance scale (default: 5)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--fps", type=positive_int_arg, default=16, help="frames per second of the mp4 (default: 16)")
    parser.add_argument("--device", help="cpu | cuda (default: cuda when available)")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="model dtype (default: bfloat16 on cuda, float32 on cpu)",
    )
    parser.add_argument("--out", default="outputs/video", help="output folder (default: outputs/video)")
    parser.add_argument("--overwrite", action="store_true", help="replace video.mp4, frames.png, rig.png in --out")


def video_parser() -> argparse.ArgumentParser:
    """``mmpos generate video``'s options on a parser of their own (the old ``video_cli.build_parser``)."""
    from mmpos._arguments import DefaultsHelpFormatter, OneLineErrorParser

    parser = OneLineErrorParser(
        prog="mmpos generate video", description=VIDEO_DESCRIPTION, formatter_class=DefaultsHelpFormatter
    )
    add_video_arguments(parser)
    return parser


def run(args) -> int:
    """Run ``mmpos generate image`` (or plain ``generate``) or ``mmpos generate video``."""
    if args.generate_command == "video":
        from .video import run_video

        return run_video(args, args.video_parser)
    from .image import run_generate

    return run_generate(args)
