"""``mmpos tiny-pipeline FAMILY --out FOLDER``: the folder it writes runs ``mmpos generate`` (each family's
text-to-image pipeline: the image is the stock pipeline's for the run's seed and sampler, pixel for pixel) and
``mmpos generate video`` (Wan); named one-line errors (exit 2) for an unknown family, a family or pipeline with no
tiny build (saying why) and an --out that holds files; ``--help``'s static family list is the registry's."""

from __future__ import annotations

import inspect
import shlex

import diffusers
import numpy as np
import pytest
import yaml
from PIL import Image

from mmpos.cli import main
from mmpos.integrations.diffusers.families import get_family
from mmpos.integrations.diffusers.tiny_pipelines import EMBEDS_FILE, RECIPES
from mmpos.pipelines.commands.tiny_pipeline import TINY_FAMILIES, passes_prompt_embeds
from mmpos.pipelines.edits.method import seeded_generator
from mmpos.pipelines.images import to_pil
from mmpos.pipelines.inputs import load_prompt_embeds

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT_TO_IMAGE = [  # the first text-to-image pipeline of each image family with a tiny build --prompt-embeds can run
    (family, name)
    for family, recipes in RECIPES.items()
    if get_family(family).time_axis is None and passes_prompt_embeds(next(iter(recipes.values())))
    for name in [next(n for n, r in recipes.items() if not r.inputs(r.side))]
]


def test_help_lists_the_tiny_families_of_the_package():
    assert {family: tuple(recipes) for family, recipes in RECIPES.items()} == TINY_FAMILIES


def printed_commands(out: str, word: str) -> list[str]:
    return [shlex.split(line.strip()) for line in out.splitlines() if line.strip().startswith(word)]


@pytest.mark.parametrize("family, pipeline", TEXT_TO_IMAGE, ids=[f for f, _ in TEXT_TO_IMAGE])
def test_generate_runs_on_the_written_folder_and_is_the_stock_pipeline(family, pipeline, tmp_path, capsys):
    folder = tmp_path / "tiny"
    assert main(["tiny-pipeline", family, "--pipeline", pipeline, "--out", str(folder)]) == 0
    (command,) = printed_commands(capsys.readouterr().out, "mmpos generate")
    assert main([*command[1:], "--out", str(tmp_path / "run")]) == 0
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["pipeline"] == pipeline
    written = np.asarray(Image.open(tmp_path / "run" / "image_0.png").convert("RGB"))
    recipe = RECIPES[family][pipeline]
    assert written.shape == (recipe.side, recipe.side, 3)

    pipe = recipe.build()  # the stock pipeline, as the folder was saved, with the run's sampler and seed
    pipe.set_progress_bar_config(disable=True)
    accepted = inspect.signature(type(pipe).__call__).parameters
    sampler = {key: value for key, value in config["sampler"].items() if key in accepted}
    embeds = load_prompt_embeds(folder / EMBEDS_FILE, ["prompt_embeds"], list(recipe.prompt_embeds(1)))
    images = pipe(**sampler, **embeds, generator=seeded_generator(config["seed"]), output_type="pt").images
    assert np.array_equal(written, np.asarray(to_pil(images[0])))


def test_generate_video_runs_on_a_tiny_wan_folder(tmp_path, capsys):
    folder = tmp_path / "wan"
    assert main(["tiny-pipeline", "wan", "--out", str(folder)]) == 0
    (command,) = printed_commands(capsys.readouterr().out, "mmpos generate video")
    assert main([*command[1:], "--out", str(tmp_path / "video")]) == 0
    assert (tmp_path / "video" / "frames.png").is_file() and (tmp_path / "video" / "video.gif").is_file()
    frames = Image.open(tmp_path / "video" / "video.gif")
    assert frames.n_frames == 5  # --frames 5 (the GIF is enlarged for viewing)


def test_the_printed_python_line_loads_the_folder(tmp_path, capsys):
    folder = tmp_path / "klein"
    assert (
        main(["tiny-pipeline", "flux2", "--pipeline", "Flux2KleinPipeline", "--out", str(folder), "--prompts", "3"])
        == 0
    )
    (line,) = printed_commands(capsys.readouterr().out, "python -c")
    namespace: dict = {}
    exec(line[2].replace("print(", "loaded = ("), namespace)  # noqa: S102 - the line the command printed
    assert type(namespace["loaded"]) is diffusers.Flux2KleinPipeline
    assert load_prompt_embeds(folder / EMBEDS_FILE, ["prompt_embeds"])["prompt_embeds"].shape[0] == 3


def test_a_pipeline_without_prompt_embeds_gets_no_generate_line(tmp_path, capsys):
    assert main(["tiny-pipeline", "hidream", "--out", str(tmp_path / "hidream")]) == 0  # per-encoder embeddings
    out = capsys.readouterr().out
    assert not printed_commands(out, "mmpos generate") and len(printed_commands(out, "python -c")) == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["nope"], "unknown diffusers family 'nope'; expected one of "),
        (["cosmos3"], "family 'cosmos3' has no tiny pipeline: Cosmos3OmniPipeline takes prompt strings only"),
        (["allegro"], "family 'allegro' has no tiny pipeline: AutoencoderKLAllegro decodes only in tiles"),
        (["wan_animate2"], "family 'wan_animate2' has no tiny pipeline: no diffusers pipeline uses"),
        (["chroma", "--pipeline", "ChromaInpaintPipeline"], "not built tiny: diffusers 0.42.1's pipeline reads"),
        (["flux", "--pipeline", "WanPipeline"], "not a pipeline of family 'flux'; its tiny pipelines are "),
    ],
)
def test_refusals_are_one_named_line(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["tiny-pipeline", *argv, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_an_out_folder_with_files_is_kept_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(SystemExit) as exit_info:
        main(["tiny-pipeline", "z_image", "--out", str(out)])
    assert (
        exit_info.value.code == 2 and "holds files; choose another --out or pass --overwrite" in capsys.readouterr().err
    )
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    assert main(["tiny-pipeline", "z_image", "--out", str(out), "--overwrite"]) == 0
    assert (out / "model_index.json").is_file() and not (out / "mine.txt").exists()
