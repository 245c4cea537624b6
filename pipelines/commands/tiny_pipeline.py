"""``mmpos tiny-pipeline FAMILY --out FOLDER [--pipeline CLASS]``: save a tiny random diffusers pipeline of a
registered family (``save_pretrained`` layout) and its prompt embeddings (``FOLDER/prompt_embeds.safetensors``), so
``mmpos generate`` / ``mmpos edit`` / ``DiffusionPipeline.from_pretrained`` run on that family offline, in seconds
on a CPU (the images are noise-like; the plumbing is the real one). The recipes:
:mod:`mmpos.integrations.diffusers.tiny_pipelines`."""

from __future__ import annotations

from mmpos._arguments import positive_int_arg, user_error

# The families with a tiny pipeline and those pipelines (the first is the default), written out so that ``--help``
# imports neither torch nor diffusers; a test keeps it equal to tiny_pipelines.RECIPES.
TINY_FAMILIES = {
    "flux": ("FluxPipeline", "FluxFillPipeline", "FluxKontextPipeline"),
    "flux2": ("Flux2Pipeline", "Flux2KleinPipeline", "Flux2KleinInpaintPipeline"),
    "qwen": (
        "QwenImagePipeline",
        "QwenImageImg2ImgPipeline",
        "QwenImageInpaintPipeline",
        "QwenImageEditPipeline",
        "QwenImageEditPlusPipeline",
    ),
    "z_image": ("ZImagePipeline", "ZImageImg2ImgPipeline", "ZImageInpaintPipeline"),
    "qwenimage21": ("QwenImage21Pipeline",),
    "chroma": ("ChromaPipeline", "ChromaImg2ImgPipeline"),
    "ovis_image": ("OvisImagePipeline",),
    "bria": ("BriaPipeline",),
    "ltx": ("LTXPipeline", "LTXImageToVideoPipeline", "LTXConditionPipeline"),
    "chronoedit": ("ChronoEditPipeline",),
    "skyreels_v2": ("SkyReelsV2Pipeline",),
    "wan_vace": ("WanVACEPipeline",),
    "hunyuan_video15": ("HunyuanVideo15Pipeline",),
    "hunyuan_video": ("HunyuanVideoPipeline", "HunyuanSkyreelsImageToVideoPipeline"),
    "ltx2": ("LTX2Pipeline", "LTX2ImageToVideoPipeline"),
    "sana_video": ("SanaVideoPipeline", "SanaImageToVideoPipeline"),
    "helios": ("HeliosPipeline",),
    "cogvideox": (
        "CogVideoXPipeline",
        "CogVideoXImageToVideoPipeline",
        "CogVideoXVideoToVideoPipeline",
        "CogVideoXFunControlPipeline",
    ),
    "hunyuandit": ("HunyuanDiTPipeline",),
    "kandinsky5": ("Kandinsky5T2VPipeline", "Kandinsky5I2VPipeline"),
    "hidream": ("HiDreamImagePipeline",),
    "lumina2": ("Lumina2Pipeline",),
    "cogview4": ("CogView4Pipeline", "CogView4ControlPipeline"),
    "wan": ("WanPipeline", "WanImageToVideoPipeline", "WanVideoToVideoPipeline"),
    "krea2": ("Krea2Pipeline",),
    "glm_image": ("GlmImagePipeline",),
    "hunyuan_image": ("HunyuanImagePipeline",),
    "nucleusmoe_image": ("NucleusMoEImagePipeline",),
    "prx": ("PRXPipeline", "PRXPixelPipeline"),
    "lumina_next": ("LuminaPipeline",),
    "bria_fibo2": ("BriaFibo2Pipeline",),
    "ernie_image": ("ErnieImagePipeline",),
    "kandinsky6": ("Kandinsky6TI2VAPipeline",),
    "consisid": ("ConsisIDPipeline",),
    "easyanimate": ("EasyAnimatePipeline",),
    "motif_video": ("MotifVideoPipeline", "MotifVideoImage2VideoPipeline"),
    "mochi": ("MochiPipeline",),
    "wan_animate": ("WanAnimatePipeline",),
    "anyflow": ("AnyFlowPipeline",),
    "hunyuan_video_framepack": ("HunyuanVideoFramepackPipeline",),
    "kandinsky6_sr": ("Kandinsky6SRPipeline",),
    "sana_wm": ("SanaWMPipeline",),
}
PROG = "mmpos tiny-pipeline"


def register(subparsers) -> None:
    rows = "\n".join(f"  {name}: {', '.join(pipelines)}" for name, pipelines in TINY_FAMILIES.items())
    parser = subparsers.add_parser(
        "tiny-pipeline",
        help="save a tiny random pipeline of a diffusers family (and its prompt embeddings) to try mmpos offline",
        description="Save a tiny random diffusers pipeline of a registered family (save_pretrained layout, seeded "
        "random weights, seconds on a CPU) and its prompt embeddings (OUT/prompt_embeds.safetensors, for "
        "--prompt-embeds), then print the commands that run it. The images are noise-like: it tries the plumbing "
        "(mmpos generate / edit, set_pe, from_pretrained) without downloading weights. A registered family without a "
        "tiny pipeline is refused, saying why.",
    )
    parser.add_argument("family", metavar="FAMILY", help="a registered diffusers family (required; listed below)")
    parser.add_argument("--out", required=True, help="the folder to write (required; refused if it holds files)")
    parser.add_argument(
        "--pipeline", metavar="CLASS", help="one of the family's pipelines listed below (default: its first)"
    )
    parser.add_argument(
        "--prompts",
        type=positive_int_arg,
        default=1,
        help="how many prompts the saved embeddings hold (batch size B) (default: 1)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an --out folder that holds files (default: refuse)"
    )
    parser.set_defaults(func=run)
    plain = parser.format_help
    parser.format_help = lambda: f"{plain()}\nfamilies with a tiny pipeline (the first is the default):\n{rows}\n"


def run(args) -> int:
    from mmpos._atomic import OutputTakenError, output_folder_written
    from mmpos.integrations.diffusers.tiny_pipelines import save_tiny_pipeline, tiny_pipeline

    try:
        recipe = tiny_pipeline(args.family, args.pipeline)
    except ValueError as error:
        raise user_error(PROG, error) from None
    try:
        with output_folder_written(args.out, args.overwrite) as folder:
            save_tiny_pipeline(recipe, folder, args.prompts)
    except OutputTakenError as error:
        raise user_error(PROG, error) from None
    embeds = "and its prompt embeddings" if recipe.prompt_embeds(1) else "(it takes no prompt)"
    print(f"wrote {args.out}: a tiny random {recipe.pipeline} ({recipe.family}) {embeds}")
    print("try it:")
    for line in try_commands(recipe, args.out):
        print(f"  {line}")
    return 0


def passes_prompt_embeds(recipe) -> bool:
    """Whether ``--prompt-embeds`` passes every tensor ``recipe``'s pipeline takes: not HiDream's per-encoder ones,
    HunyuanDiT's second prompt nor Krea 2's per-layer ``[B, L, layers, D]``."""
    from mmpos.pipelines.inputs import EMBED_DIMS

    tensors = recipe.prompt_embeds(1)
    return all(name in EMBED_DIMS and tensor.dim() == len(EMBED_DIMS[name]) for name, tensor in tensors.items())


def try_commands(recipe, folder) -> list[str]:
    """The command lines that run the saved tiny ``recipe`` in ``folder``: ``mmpos generate`` (a text-to-image
    pipeline whose embeddings ``--prompt-embeds`` passes) or ``mmpos generate video`` (Wan), the ``mmpos edit`` methods that take its pipeline, and Python."""
    from mmpos.integrations.diffusers.families import get_family
    from mmpos.integrations.diffusers.tiny_pipelines import EMBEDS_FILE
    from mmpos.pipelines.edits import get_edit, list_edits
    from mmpos.pipelines.loading import missing_components

    side, embeds = recipe.side, f"{folder}/{EMBEDS_FILE}"
    lines = []
    if get_family(recipe.family).time_axis is None and not recipe.inputs(side) and passes_prompt_embeds(recipe):
        # over the config's sampler; += also adds a key the config has not (use_resolution_binning)
        sampler = "".join(f" --set sampler.{key}+={value}" for key, value in recipe.call.items())
        lines.append(
            f"mmpos generate --model {folder} --prompt-embeds {embeds} --height {side} --width {side} --device cpu "
            f"--dtype float32 --set sampler.num_inference_steps=2{sampler}"
        )
    elif recipe.pipeline in ("WanPipeline", "WanImageToVideoPipeline"):
        lines.append(
            f"mmpos generate video --model {folder} --frames {recipe.frames} --height {side} --width {side} --steps 2 "
            "--device cpu"
        )
    methods = [name for name in list_edits() if recipe.pipeline in get_edit(name).pipelines]
    if methods:
        lines.append(f"mmpos edit {'|'.join(methods)} --model {folder} --prompt-embeds {embeds} ... (docs/editing.md)")
    import diffusers

    saved_without = missing_components(folder, getattr(diffusers, recipe.pipeline))
    none = "".join(f", {name}=None" for name in saved_without)  # saved without them: passed as None
    lines.append(
        f"python -c \"import diffusers; print(diffusers.DiffusionPipeline.from_pretrained('{folder}'{none}))\""
    )
    return lines
