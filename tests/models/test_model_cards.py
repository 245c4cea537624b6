"""Every model folder under assets/ carries a Hugging Face model card: YAML front matter (license, library, tags,
the pipeline task where one fits) above the card text, the block its exporter writes, and a folder its class
loads."""

import json
from pathlib import Path

import pytest
import yaml

from mmpos.training.model_cards import card_metadata, front_matter, split_front_matter

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "assets"
FOLDERS = {  # shipped model folder -> its card kind (mmpos.training.model_cards.card_metadata)
    "world-vae": "vae",
    "world-t2i": "t2i",
    "world-fill": "fill",
    "world-kontext": "kontext",
    "world-video": "video",
    "world-video/camera-ucpe": "camera-ucpe",
    "world-video/camera-plucker": "camera-plucker",
}
PRESENT = [folder for folder in FOLDERS if (ASSETS / folder).is_dir()]  # world-video is not in every checkout
HUB_TASKS = {"text-to-image", "image-to-image", "image-to-video"}


def model_folders() -> set[str]:
    """Folders ``from_pretrained`` loads: a ``model_index.json`` (a pipeline), or a ``config.json`` that is not a
    component named by the ``model_index.json`` above it (a model of its own: the VAE, a camera adapter)."""
    found = set()
    for path in ASSETS.rglob("*.json"):
        folder = path.parent
        if path.name == "config.json":
            index = folder.parent / "model_index.json"
            if index.is_file() and folder.name in json.loads(index.read_text()):
                continue
        elif path.name != "model_index.json":
            continue
        found.add(folder.relative_to(ASSETS).as_posix())
    return found


def parsed_card(folder: str) -> tuple[dict, str]:
    """``(front matter, text below it)`` of ``folder/README.md``, read with yaml here (not the code under test)."""
    text = (ASSETS / folder / "README.md").read_text()
    lines = text.split("\n")
    assert lines[0] == "---", f"{folder}/README.md must start with a '---' line (YAML front matter)"
    end = lines.index("---", 1)
    return yaml.safe_load("\n".join(lines[1:end])), "\n".join(lines[end + 1 :])


def test_every_shipped_model_folder_has_a_card_entry():
    assert model_folders() == set(PRESENT)


@pytest.mark.parametrize("folder", PRESENT)
def test_the_card_has_the_hub_front_matter_above_the_card_text(folder):
    metadata, body = parsed_card(folder)
    assert {"license", "library_name", "tags"} <= set(metadata)
    assert metadata["license"] == "apache-2.0"  # pyproject.toml: Apache-2.0
    assert metadata["library_name"] in ("diffusers", "mmpos")
    assert {"mmpos", "mini-world"} <= set(metadata["tags"]) and all(isinstance(t, str) for t in metadata["tags"])
    assert metadata.get("pipeline_tag", "text-to-image") in HUB_TASKS
    assert "base_model" not in metadata  # trained from scratch here: no Hub model to point at
    assert metadata == card_metadata(FOLDERS[folder])  # what the exporter writes, so a re-export keeps it
    assert body.lstrip("\n").startswith(f"# {Path(folder).name}\n")  # the card text follows, kept


def test_pyproject_declares_the_cards_license():
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.parametrize("folder", PRESENT)
def test_the_folder_loads_with_its_from_pretrained_class(folder):
    kind = FOLDERS[folder]
    path = ASSETS / folder
    if kind == "vae":
        from diffusers import AutoencoderKL

        assert isinstance(AutoencoderKL.from_pretrained(path), AutoencoderKL)
    elif kind in ("t2i", "fill", "kontext"):
        from diffusers import DiffusionPipeline

        from tests.models.test_world_pipeline_folders import CLASSES  # the pipeline test's classes (it also runs them)

        assert type(DiffusionPipeline.from_pretrained(path)) is CLASSES[kind]
    elif kind == "video":
        from mmpos.pipelines import WorldVideoPipeline

        assert isinstance(WorldVideoPipeline.from_pretrained(path), WorldVideoPipeline)
    else:
        from mmpos.integrations.diffusers.camera_adapter import CameraAdapter

        adapter = CameraAdapter.from_pretrained(path)
        assert isinstance(adapter, CameraAdapter) and f"camera-{adapter.config.kind}" == kind


def test_the_world_model_writer_puts_the_front_matter_above_its_card():
    from mmpos.training.world.export import model_card_markdown

    data = dict(num_examples=8, image_size=32, generator="mmpos.world", seed=0)
    for task in ("vae", "t2i", "fill", "kontext"):
        card = dict(task=task, steps=3, data=data, loss_history=[[1, 0.5], [2, 0.25]])
        metadata, body = split_front_matter(model_card_markdown(card, f"world-{task}"))
        assert metadata == card_metadata(task)
        assert body.startswith(f"# world-{task}\n") and "| steps | 3 |" in body


@pytest.mark.skipif(not (ASSETS / "world-video" / "model_card.json").is_file(), reason="no world video model")
def test_the_video_writers_put_the_front_matter_above_their_cards():
    from mmpos.pipelines.world.video_export import adapter_card_markdown, card_markdown

    card = json.loads((ASSETS / "world-video" / "model_card.json").read_text())
    metadata, body = split_front_matter(card_markdown(card))
    assert metadata == card_metadata("video") and body.startswith("# world-video\n")
    for kind in ("ucpe", "plucker"):
        text = adapter_card_markdown(card, kind)
        metadata, body = split_front_matter(text)
        assert metadata == card_metadata(f"camera-{kind}") and body.startswith(f"# camera-{kind}\n")
        assert f"{card['stages'][kind]['steps']} steps" in body
        assert text == (ASSETS / "world-video" / f"camera-{kind}" / "README.md").read_text()  # the shipped card


def test_front_matter_round_trips_and_bad_input_is_named():
    metadata = card_metadata("camera-prope")  # any camera adapter kind
    assert metadata["library_name"] == "mmpos" and "prope" in metadata["tags"]
    assert split_front_matter(front_matter(metadata) + "# x\n") == (metadata, "# x\n")
    with pytest.raises(ValueError, match="no YAML front matter"):
        split_front_matter("# a card without front matter\n")
    with pytest.raises(ValueError, match="must be a YAML mapping"):
        split_front_matter("---\n- a list\n---\n# x\n")
    with pytest.raises(ValueError, match="kind must be one of"):
        card_metadata("world-t2i")
