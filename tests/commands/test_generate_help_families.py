"""`mmpos generate --help` lists every text-to-image family of the diffusers family registry (issue 46 item 7)."""

import subprocess
import sys

from mmpos.integrations.diffusers.families import builtin_families, get_family
from mmpos.pipelines.commands.generate import IMAGE_FAMILIES


def test_the_help_table_is_the_registry_s_image_families():
    registry = {
        name: tuple(get_family(name).pipelines)
        for name in builtin_families()
        if get_family(name).time_axis is None and get_family(name).pipelines
    }
    assert IMAGE_FAMILIES == registry


def test_generate_help_names_every_image_family_and_its_pipelines():
    for words in (["generate"], ["generate", "image"]):
        result = subprocess.run(
            [sys.executable, "-m", "mmpos.cli", *words, "--help"], capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0
        listed = result.stdout.split("text-to-image families")[1]
        for name, pipelines in IMAGE_FAMILIES.items():
            assert f"  {name}: {', '.join(pipelines)}" in listed
        assert "Flux2KleinPipeline" in listed and "ZImagePipeline" in listed
