"""The ``mmpos app`` page (Gradio Blocks): four tabs over :mod:`mmpos.pipelines.commands.app.workflows`. Every button runs
an ``mmpos`` command in this process; a user error is the command's own line, shown in the page (``gr.Error``);
long runs show tqdm's progress (``gr.Progress(track_tqdm=True)``) and stop on Cancel."""

from __future__ import annotations

import functools
from pathlib import Path

import gradio as gr

from . import workflows
from .runs import CommandError, cancel_running, run_job

PAGE_CSS = (
    ".image-container img, .grid-wrap img, img.pixelated { image-rendering: pixelated; }"  # 32 px previews, sharp
)
WORLD_NOTE = (
    "Runs on the embedded mini-world models (tiny Flux-class image models and a world video model, trained on 32 px "
    "synthetic scenes, CPU): prompts use the world's words, photos are fitted into 32 px; the outputs are toy "
    "previews of what `mmpos` does on FLUX.1 / Wan with `--model`."
)


def _page_errors(function):
    """Run ``function`` as a job Cancel can stop (:func:`~.runs.run_job`); a :class:`CommandError` (the command's
    one-line user error, or the cancelled job) becomes a ``gr.Error``."""

    @functools.wraps(function)
    def wrapped(*args, **kwargs):
        try:
            return run_job(function, *args, **kwargs)
        except CommandError as error:
            raise gr.Error(str(error), print_exception=False) from None

    return wrapped


def build_app(space: workflows.Workspace) -> gr.Blocks:
    """The page over ``space`` (where runs write, which model they use)."""
    with gr.Blocks(title="mmpos") as app:
        gr.Markdown(f"# mmpos\nPositional-encoding edits, extrapolation and camera control. Model: `{space.model}`.")
        if space.world:
            gr.Markdown(WORLD_NOTE)
        running = []
        with gr.Tab("Generate"):
            running += _generate_tab(space)
        with gr.Tab("Edit"):
            running += _edit_tab(space)
        with gr.Tab("Camera video"):
            running += _camera_tab(space)
        with gr.Tab("Encodings"):
            _encodings_tab(space)
        cancel = gr.Button("Cancel the running job", variant="stop", elem_id="cancel")
        cancel.click(lambda: cancel_running() and None, None, None, cancels=running, api_name="cancel")
    return app


def _generate_tab(space):
    side = 32 if space.world else 1024
    with gr.Row():
        with gr.Column():
            prompt = gr.Textbox(label="prompt (empty: the config's)", elem_id="generate-prompt")
            with gr.Row():
                height = gr.Number(2 * side, label="height (px)", precision=0)
                width = gr.Number(2 * side, label="width (px)", precision=0)
            extrapolate = gr.Dropdown(list(workflows.EXTRAPOLATION_PRESETS), value="dype", label="extrapolation preset")
            with gr.Row():
                seed = gr.Number(0, label="seed", precision=0)
                steps = gr.Number(20, label="steps", precision=0, elem_id="generate-steps")
            run = gr.Button("Generate", variant="primary", elem_id="generate-run")
        with gr.Column():
            with gr.Row():
                extrapolated = gr.Image(
                    label="with extrapolation", type="filepath", elem_id="generate-extrapolated", height=256
                )
                plain = gr.Image(
                    label="same seed, no extrapolation", type="filepath", elem_id="generate-plain", height=256
                )
            downloads = gr.File(label="downloads (PNG, config.yaml)", file_count="multiple")

    @_page_errors
    def on_generate(prompt, height, width, extrapolate, seed, steps, progress=gr.Progress(track_tqdm=True)):
        progress(0, desc="loading the model")
        result = workflows.generate(space, prompt, height, width, extrapolate, seed, steps)
        return (
            str(result.extrapolated),
            str(result.plain),
            [str(result.extrapolated), str(result.plain), str(result.config)],
        )

    event = run.click(
        on_generate,
        [prompt, height, width, extrapolate, seed, steps],
        [extrapolated, plain, downloads],
        api_name="generate",
    )
    return [event]


def _box_preview(background, box):
    """The background with the box drawn (a red rectangle in the background's pixels)."""
    if not background:
        return None
    from PIL import Image, ImageDraw

    image = Image.open(background).convert("RGB")
    left, top, right, bottom = (int(v or 0) for v in box)
    ImageDraw.Draw(image).rectangle(
        (left, top, right - 1, bottom - 1), outline=(255, 0, 0), width=max(1, image.width // 64)
    )
    return image


def _edit_tab(space):
    events = []
    with gr.Row():
        steps = gr.Number(20, label="steps", precision=0, elem_id="edit-steps")
        seed = gr.Number(0, label="seed", precision=0)
    with gr.Tab("Band modulation"):
        with gr.Row():
            with gr.Column():
                reference = gr.Image(
                    label="reference photo (shown as given)", type="filepath", elem_id="band-reference"
                )
                reference_prompt = gr.Textbox(label="reference prompt (used without a photo; empty: the config's)")
                targets = gr.Textbox(label="targets, one per line (empty: the config's)", lines=2)
                band_strength = gr.Slider(0, 1.5, 1.0, step=0.05, label="band.strength")
                band_run = gr.Button("Run band modulation", variant="primary", elem_id="band-run")
            band_out = _edit_outputs("band")
    with gr.Tab("PE transplant"):
        with gr.Row():
            with gr.Column():
                background = gr.Image(
                    label="background (click two corners of the box)", type="filepath", elem_id="transplant-background"
                )
                reference_object = gr.Image(label="reference object", type="filepath", elem_id="transplant-reference")
                with gr.Row():
                    box = [
                        gr.Number(v, label=n, precision=0, elem_id=f"box-{n}") for n, v in zip("LTRB", (8, 8, 24, 24))
                    ]
                box_status = gr.Markdown(
                    "Box: click its two corners on the background, or type them.", elem_id="box-status"
                )
                preview = gr.Image(
                    label="box on the background", interactive=False, elem_id="transplant-box", height=200
                )
                transplant_prompt = gr.Textbox(label="prompt (the edited scene; empty: the config's)")
                tau = gr.Slider(
                    0.0, 1.01, 0.85, step=0.01, label="transplant.tau (transplanted while sigma > tau; 1.01: off)"
                )
                transplant_run = gr.Button("Run PE transplant", variant="primary", elem_id="transplant-run")
            transplant_out = _edit_outputs("transplant")
        corner = gr.State(None)

        def on_click(background, corner, left, top, right, bottom, evt: gr.SelectData):
            """Two clicks on the background: the box's corners (pixels of the file; right and bottom exclusive)."""
            x, y = (int(v) for v in evt.index)
            if corner is None:  # first corner: wait for the second
                box = (left, top, right, bottom)
                return (x, y), *box, _box_preview(background, box), f"Box: first corner ({x}, {y}); click the other."
            (x0, y0) = corner
            new = (min(x0, x), min(y0, y), max(x0, x) + 1, max(y0, y) + 1)
            return None, *new, _box_preview(background, new), f"Box: {new[0]} {new[1]} {new[2]} {new[3]} (L T R B)."

        background.select(on_click, [background, corner, *box], [corner, *box, preview, box_status], api_name=False)
        for field in [background, *box]:
            field.change(lambda b, *v: _box_preview(b, v), [background, *box], preview, api_name=False)
    with gr.Tab("LooseRoPE"):
        with gr.Row():
            with gr.Column():
                collage = gr.Image(label="collage (object pasted)", type="filepath", elem_id="loose-collage")
                original = gr.Image(label="the picture before pasting", type="filepath", elem_id="loose-original")
                loose_prompt = gr.Textbox(label="instruction (empty: the config's)")
                loose_strength = gr.Slider(0, 1.5, 1.0, step=0.05, label="loose.strength")
                loose_run = gr.Button("Run LooseRoPE", variant="primary", elem_id="loose-run")
            loose_out = _edit_outputs("loose")

    def shown(method, inputs, strength, steps, seed, prompt, progress):
        """Run the edit; (edited images, comparison strip, downloads)."""
        progress(0, desc="loading the model")
        result = workflows.edit(space, method, inputs, strength, steps, seed, prompt)
        files = [*result.edited, *result.fullsize, result.comparison, result.diagnostic, result.config]
        return [str(p) for p in result.edited], str(result.comparison), [str(p) for p in files if p]

    # Gradio passes its progress tracker to a positional parameter whose default is gr.Progress
    @_page_errors
    def on_band(reference, reference_prompt, targets, strength, steps, seed, prompt, progress=gr.Progress(True)):
        inputs = workflows.band_inputs(reference, reference_prompt, targets)
        return shown("band", inputs, strength, steps, seed, prompt, progress)

    @_page_errors
    def on_transplant(background, obj, left, top, right, bottom, tau, steps, seed, prompt, progress=gr.Progress(True)):
        inputs = workflows.transplant_inputs(background, obj, (left, top, right, bottom))
        return shown("transplant", inputs, tau, steps, seed, prompt, progress)

    @_page_errors
    def on_loose(collage, original, strength, steps, seed, prompt, progress=gr.Progress(True)):
        return shown("loose", workflows.loose_inputs(collage, original), strength, steps, seed, prompt, progress)

    events.append(
        band_run.click(
            on_band,
            [reference, reference_prompt, targets, band_strength, steps, seed, gr.State("")],
            band_out,
            api_name="edit_band",
        )
    )
    events.append(
        transplant_run.click(
            on_transplant,
            [background, reference_object, *box, tau, steps, seed, transplant_prompt],
            transplant_out,
            api_name="edit_transplant",
        )
    )
    events.append(
        loose_run.click(
            on_loose,
            [collage, original, loose_strength, steps, seed, loose_prompt],
            loose_out,
            api_name="edit_loose",
        )
    )
    return events


def _edit_outputs(method):
    with gr.Column():
        edited = gr.Gallery(label="edited", elem_id=f"{method}-edited", columns=2, height=260, object_fit="contain")
        comparison = gr.Image(
            label="comparison (inputs, edited, strength sweep)",
            type="filepath",
            elem_id=f"{method}-comparison",
            height=260,
        )
        files = gr.File(label="downloads (PNG, config.yaml)", file_count="multiple")
    return [edited, comparison, files]


def _camera_tab(space):
    with gr.Row():
        with gr.Column():
            mode = gr.Radio(["preset", "actions"], value="preset", label="camera path", elem_id="camera-mode")
            preset = gr.Textbox("orbit:35", label="motion: orbit, arc, pan, tilt, roll, dolly, zoom [:AMOUNT]")
            actions = gr.Textbox(
                "forward 0.4; turn 20; strafe -0.2",
                label="actions, one keyframe each: forward / strafe / rise (scene units), turn / tilt (degrees)",
                elem_id="camera-actions",
            )
            with gr.Row():
                frames = gr.Number(9, label="frames", precision=0)
                steps = gr.Number(24, label="steps", precision=0, elem_id="camera-steps")
                seed = gr.Number(0, label="seed", precision=0)
            if space.world:
                adapter = gr.Dropdown(list(workflows.CAMERA_ADAPTERS), value="ucpe", label="camera adapter")
            else:  # a user's Wan pipeline: the adapter they trained (mmpos train camera_adapter)
                adapter = gr.Textbox("", label="camera adapter folder (CameraAdapter.save_pretrained; empty: none)")
            scale = gr.Slider(0, 2, 1, step=0.1, label="camera_scale")
            with gr.Row():
                plot = gr.Button("Plot the rig", elem_id="camera-plot")
                run = gr.Button("Generate the clip", variant="primary", elem_id="camera-run")
        with gr.Column():
            rig = gr.Image(label="camera rig (before running)", type="filepath", elem_id="camera-rig", height=300)
            video = gr.Video(
                label="world video", elem_id="camera-video", format="mp4", height=256, autoplay=True, loop=True
            )
            frames_png = gr.Image(label="frames", type="filepath", elem_id="camera-frames")
            numbers = gr.JSON(label="camera following (degrees): RotErr / TransErr per frame", elem_id="camera-numbers")
            files = gr.File(label="downloads (MP4, PNG, trajectory)", file_count="multiple")

    @_page_errors
    def on_plot(mode, preset, actions, frames):
        spec = workflows.camera_spec(space, mode, preset, actions)
        return str(workflows.plot_rig(space, spec, frames))

    @_page_errors
    def on_run(mode, preset, actions, frames, steps, seed, adapter, scale, progress=gr.Progress(track_tqdm=True)):
        progress(0, desc="loading the model")
        spec = workflows.camera_spec(space, mode, preset, actions)
        result = workflows.camera_video(space, spec, frames, steps, seed, adapter, scale)
        downloads = [str(result.video), str(result.frames), str(result.rig)] + ([spec] if Path(spec).is_file() else [])
        return str(result.rig), str(result.video), str(result.frames), result.following, downloads

    plot.click(on_plot, [mode, preset, actions, frames], rig, api_name="plot_rig")
    event = run.click(
        on_run,
        [mode, preset, actions, frames, steps, seed, adapter, scale],
        [rig, video, frames_png, numbers, files],
        api_name="camera_video",
    )
    return [event]


def _encodings_tab(space):
    from mmpos.encodings import list_pes

    with gr.Row():
        with gr.Column():
            name = gr.Dropdown(list_pes(), value="rope_axial", label="encoding")
            head_dim = gr.Number(64, label="head_dim", precision=0)
            options = gr.Textbox('{"theta": 100}', label="create_pe options (JSON)")
            size = gr.Number(31, label="logit map size (offsets)", precision=0)
            show = gr.Button("Show", variant="primary", elem_id="encoding-show")
        figure = gr.Image(label="spectrum and content-free logit vs offset", type="filepath", elem_id="encoding-figure")

    @_page_errors
    def on_show(name, head_dim, options, size):
        return str(workflows.encoding_figure(space, name, head_dim, options, size))

    show.click(on_show, [name, head_dim, options, size], figure, api_name="encoding")
