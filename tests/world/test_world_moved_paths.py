"""The old paths of moved modules still import, for one release: the same module object as the new path, with a
DeprecationWarning naming both paths (``mmpos.world.<module>`` for what moved out of the world). ``mmpos.pipelines``
keeps no old path: ``mmpos.pipelines.camera_clips`` and the like are gone."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import mmpos.world
from mmpos._deprecation import MovedModules, moved_modules

PACKAGES = (mmpos.world,)
MOVES = [(package.__name__, old, new) for package in PACKAGES for old, new in sorted(package.MOVED.items())]


@pytest.mark.parametrize("package, old, new", MOVES, ids=[f"{p}.{old}" for p, old, _ in MOVES])
def test_an_old_path_is_the_new_module_with_a_deprecation_warning(package, old, new):
    sys.modules.pop(f"{package}.{old}", None)
    pattern = rf"{package.replace('.', '[.]')}[.]{old} moved to {new.replace('.', '[.]')}"
    with pytest.warns(DeprecationWarning, match=pattern):
        module = importlib.import_module(f"{package}.{old}")
    assert module is importlib.import_module(new)
    assert module.__name__ == new and module.__spec__.name == new  # the import did not rename the module


def test_every_import_form_of_an_old_path_works_in_a_fresh_interpreter():
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "import mmpos.training.world.trainer as new, mmpos.models.world.image as image\n"
        "for statement in ('import mmpos.world.trainer', 'from mmpos.world import trainer',\n"
        "                  'from mmpos.world.models import load_world_pipeline'):\n"
        "    try:\n"
        "        exec(statement)\n"
        "        raise SystemExit(statement + ': no warning')\n"
        "    except DeprecationWarning as warning:\n"
        "        assert 'moved to' in str(warning), warning\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "import mmpos.world.trainer as old\n"
        "from mmpos.world.models import load_world_pipeline\n"
        "assert old is new and load_world_pipeline is image.load_world_pipeline\n"
        "import mmpos.world\n"
        "assert mmpos.world.trainer is new\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_pipelines_keep_no_old_module_path():
    """What moved below the pipelines (the camera adapter's clips, lens augmentation, the tiny Wan) is imported from
    its one home; the old ``mmpos.pipelines`` paths fail like any unknown module or name."""
    for old in ("camera_clips", "lens_augment", "tiny_wan"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(f"mmpos.pipelines.{old}")
    import mmpos.pipelines

    with pytest.raises(AttributeError, match="camera_clips"):
        mmpos.pipelines.camera_clips  # noqa: B018


def test_the_warning_names_the_importing_line(tmp_path):
    script = tmp_path / "user.py"
    script.write_text("import warnings\nwarnings.simplefilter('always')\n\nimport mmpos.world.metrics\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert f"{script}:4: DeprecationWarning: mmpos.world.metrics moved to mmpos.eval.metrics" in result.stderr


def test_names_that_did_not_move_are_not_caught():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mmpos.world.no_such_module")
    assert not any(isinstance(f, MovedModules) and "scene" in f.moves for f in sys.meta_path)
    assert importlib.import_module("mmpos.world.scene").__file__.endswith("mmpos/world/scene.py")


@pytest.mark.parametrize("package", PACKAGES, ids=lambda package: package.__name__)
def test_the_hook_is_installed_once_per_package(package):
    def hooks():
        return [f for f in sys.meta_path if isinstance(f, MovedModules) and f.package == package.__name__]

    before = hooks()
    importlib.reload(package)
    assert len(before) == len(hooks()) == 1
    finder = moved_modules(package.__name__, package.MOVED)  # installing again replaces, never stacks
    assert hooks() == [finder]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda package: package.__name__)
def test_the_old_package_holds_no_moved_module_file(package):
    folder = Path(package.__file__).parent
    assert not [old for old in package.MOVED if (folder / f"{old}.py").exists() or (folder / old).is_dir()]
