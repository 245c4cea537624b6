"""The three ``mmpos edit`` methods: each loads its pipeline, runs the edit (and a strength sweep) and returns
the images and figures to save (see :func:`mmpos.pipelines.commands.edit.run`)."""
from __future__ import annotations

import json

from .run_inputs import (
    image_side,
    load_cli_pipeline,
    load_grid_image,
    load_mask,
    prompt_kwargs,
    rescale_box,
    sampler_options,
    seeded_generator,
)


def load_edit_pipeline(kind: str, config):
    """The editing pipeline, with ``config["extrapolate"]``'s schedule installed under the edit (``set_pe``)."""
    from .extrapolate import install_extrapolation, parse_extrapolate

    pipe = load_cli_pipeline("edit", kind, config)
    setting = config["extrapolate"]
    installed = install_extrapolation(pipe, parse_extrapolate(str(setting["preset"])), setting["train_size"],
                                      setting.get("options"))
    if installed["schedules"] is not None:
        setting["installed"] = installed
        print(f"extrapolation: {json.dumps(installed)}")
    return pipe


def run_band(args, config, tqdm) -> dict:
    from .figures import band_attention_maps, band_diagnostic

    variant = config.get("variant", "flux")
    kind = "band" if variant == "flux" else "band_kontext"
    pipe = load_edit_pipeline(kind, config)
    band = dict(config["band"])
    figure = config.get("figure", {})
    sampler = sampler_options(config)
    probe_layer = min(int(figure.get("diagnostic_layer", 0)), len(pipe.transformer.transformer_blocks)
                      + len(pipe.transformer.single_transformer_blocks) - 1)
    side, guidance = image_side(config, kind), config.get("guidance")
    if variant == "flux":
        targets = args.target or config["targets"]
        prompts = [args.reference_prompt or config["reference"]["prompt"], *targets]
        call = dict(**prompt_kwargs(args, prompts, pipe, guidance), **sampler)
        reference = args.reference_image or config["reference"].get("image")
        if reference:
            call.update(reference_image=load_grid_image(reference, "reference image", pipe.token_pixels, side),
                        reference_seed=config["reference"].get("seed", 0),
                        reference_mode=config["reference"].get("mode", "noise"))
    else:
        image_path = args.image or config.get("image")
        if not image_path:
            raise ValueError("the Kontext variant needs --image (the context/reference image)")
        context_image = load_grid_image(image_path, "image", pipe.token_pixels, side)
        height, width = context_image.shape[-2:]  # the output takes the context image's size
        sampler.update(height=height, width=width, max_area=height * width, _auto_resize=False)
        call = dict(image=context_image, **prompt_kwargs(args, config.get("prompt"), pipe, guidance), **sampler)

    def run(strength, probe=None):
        return pipe(band={**band, "strength": strength}, generator=seeded_generator(config["seed"]), output_type="pt",
                    probe=probe, **call).images

    images = run(band["strength"], probe=(probe_layer, float(figure.get("diagnostic_step", 0.5))))
    probe = pipe.probe
    sweep = {f"strength={s}": run(s)[-1] for s in tqdm(figure.get("sweep", []), desc="strength sweep")}
    if variant == "flux":
        inputs = {"reference": images[0]}
        edited = {f"target {i}": image for i, image in enumerate(images[1:], 1)}
        target = 1
    else:
        inputs, edited, target = {"context": call["image"][0]}, {"edited": images[0]}, 0
    tokens = pipe.token_pixels
    grid = (call.get("height", images.shape[-2]) // tokens, call.get("width", images.shape[-1]) // tokens)
    token = (grid[0] // 2) * grid[1] + grid[1] // 2
    axes = pipe.transformer.config.axes_dims_rope

    def diagnostic(path):
        maps = band_attention_maps(probe.query, probe.key, axes, grid, token, target)
        return band_diagnostic(maps, grid, token, path, next(iter(inputs.values())))

    return dict(inputs=inputs, edited=edited, sweep=sweep, diagnostic=diagnostic,
                title=f"band modulation ({variant}): s_hf {band['s_hf']}, s_lf {band['s_lf']}, beta {band['beta']}")


def run_transplant(args, config, tqdm) -> dict:
    from .figures import transplant_diagnostic
    from .images import load_image

    if args.box:  # a box outside the background fails before the model loads
        rescale_box(args.box, image_height_width(args.background), image_height_width(args.background))
    pipe = load_edit_pipeline("transplant", config)
    background = load_grid_image(args.background, "background", pipe.token_pixels, image_side(config, "transplant"))
    size = tuple(background.shape[-2:])
    references = [load_image(p) for p in args.reference]  # any size: each is fitted into its tile
    reference_masks = None
    if args.reference_mask:
        reference_masks = [load_mask(p, r.shape[-2:]) for p, r in zip(args.reference_mask, references)]
    where = {"mask_image": load_mask(args.mask, size)} if args.mask else \
        {"target_box": target_box(args.box, args.background, size)}
    call = dict(image=background, references=references, reference_masks=reference_masks, **where,
                **prompt_kwargs(args, config.get("prompt"), pipe, config.get("guidance")), **sampler_options(config))
    transplant = dict(config["transplant"])

    def run(tau):
        return pipe(transplant={**transplant, "tau": tau}, generator=seeded_generator(config["seed"]), output_type="pt",
                    **call)

    result = run(transplant["tau"])
    sweep = {f"tau={t}": run(t).images[0] for t in tqdm(config.get("figure", {}).get("sweep", []), desc="tau sweep")}
    inputs = {"background": background[0], **{f"reference {i}": r[0] for i, r in enumerate(references)}}
    return dict(inputs=inputs, edited={"inserted": result.images[0]}, sweep=sweep,
                diagnostic=lambda path: transplant_diagnostic(result.canvas, result.ids, result.native_ids, path),
                title=f"PE transplant ({transplant['layout']}, tau={transplant['tau']})")


def target_box(box, background_path, size) -> list[int]:
    """``--box`` (L T R B pixels of the background file) on the background as the pipeline gets it (``size``)."""
    original = image_height_width(background_path)
    scaled = list(rescale_box(box, original, size))
    if original != tuple(size):
        print(f"--box {' '.join(map(str, box))} of the {original[0]}x{original[1]} background is "
              f"{' '.join(map(str, scaled))} of the {size[0]}x{size[1]} model input")
    return scaled


def image_height_width(path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as image:
        return image.height, image.width


def run_loose(args, config, tqdm) -> dict:
    from .figures import loose_diagnostic
    from .loose import LooseConfig

    pipe = load_edit_pipeline("loose", config)
    side = image_side(config, "loose")
    collage = load_grid_image(args.image, "image", pipe.token_pixels, side)
    size = tuple(collage.shape[-2:])
    pasted = {"crop_mask": load_mask(args.mask, size)} if args.mask else \
        {"original": load_grid_image(args.original, "original", pipe.token_pixels, side)}
    call = dict(image=collage, **pasted, **prompt_kwargs(args, config.get("prompt"), pipe, config.get("guidance")),
                **sampler_options(config))
    if args.saliency:
        from .images import area_resize, load_image

        call["saliency"] = area_resize(load_image(args.saliency)[0].mean(0), size).clamp(0, 1)
    loose = dict(config["loose"])

    def run(strength):
        return pipe(loose={**loose, "strength": strength}, generator=seeded_generator(config["seed"]), output_type="pt",
                    **call)

    result = run(loose["strength"])
    sweep = {f"strength={s}": run(s).images[0] for s in tqdm(config.get("figure", {}).get("sweep", []),
                                                               desc="strength sweep")}
    return dict(inputs={"collage": collage[0]}, edited={"harmonised": result.images[0]}, sweep=sweep,
                diagnostic=lambda path: loose_diagnostic(result.maps, LooseConfig(**loose), path, collage[0]),
                title=f"LooseRoPE ({loose['num_bins']} bins, boost {loose['saliency_boost']})")
