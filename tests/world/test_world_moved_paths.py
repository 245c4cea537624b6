"""``mmpos.world`` is the world as data only: the modules that moved out of it (models, training, metrics, the demo)
are not importable at their old paths. The old paths of ``mmpos.pipelines.<module>`` (the camera adapter's
training data, lens augmentation and tiny Wan, which moved below the pipelines) still import, for one release: the
same module object as the new path, with a DeprecationWarning naming both paths."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import mmpos.pipelines
from mmpos._deprecation import MovedModules, moved_modules

PACKAGES = (mmpos.pipelines,)
MOVES = [(package.__name__, old, new) for package in PACKAGES for old, new in sorted(package.MOVED.items())]


@pytest.mark.parametrize("package, old, new", MOVES, ids=[f"{p}.{old}" for p, old, _ in MOVES])
def test_an_old_path_is_the_new_module_with_a_deprecation_warning(package, old, new):
    sys.modules.pop(f"{package}.{old}", None)
    pattern = rf"{package.replace('.', '[.]')}[.]{old} moved to {new.replace('.', '[.]')}"
    with pytest.warns(DeprecationWarning, match=pattern):
        module = importlib.import_module(f"{package}.{old}")
    assert module is importlib.import_module(new)
    assert module.__name__ == new and module.__spec__.name == new  # the import did not rename the module


@pytest.mark.parametrize("old", ["trainer", "models", "metrics", "demo", "sources", "edit_runs", "video_training"])
def test_the_world_keeps_no_old_path(old):
    sys.modules.pop(f"mmpos.world.{old}", None)
    with pytest.raises(ModuleNotFoundError, match=f"mmpos.world.{old}"):
        importlib.import_module(f"mmpos.world.{old}")


def test_every_import_form_of_an_old_pipelines_path_works_in_a_fresh_interpreter():
    """``from mmpos.pipelines import camera_clips`` goes through the package's lazy ``__getattr__`` first (which
    knows only the pipeline classes) and then to the hook: the moved module, not an AttributeError."""
    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "import mmpos.training.camera_clips as clips, mmpos.models.tiny_wan as wan, mmpos.camera.lens_augment as lens\n"
        "for statement in ('import mmpos.pipelines.tiny_wan', 'from mmpos.pipelines import camera_clips',\n"
        "                  'from mmpos.pipelines.lens_augment import LensAugmentation'):\n"
        "    try:\n"
        "        exec(statement)\n"
        "        raise SystemExit(statement + ': no warning')\n"
        "    except DeprecationWarning as warning:\n"
        "        assert 'moved to' in str(warning), warning\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        "import mmpos.pipelines.tiny_wan as old_wan\n"
        "from mmpos.pipelines import camera_clips\n"
        "from mmpos.pipelines.lens_augment import LensAugmentation\n"
        "assert old_wan is wan and camera_clips is clips and LensAugmentation is lens.LensAugmentation\n"
        "import mmpos.pipelines\n"
        "assert mmpos.pipelines.tiny_wan is wan\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_names_that_did_not_move_are_not_caught():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mmpos.pipelines.no_such_module")
    assert not any(isinstance(f, MovedModules) and "loading" in f.moves for f in sys.meta_path)
    assert importlib.import_module("mmpos.pipelines.loading").__file__.endswith("pipelines/loading.py")


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
