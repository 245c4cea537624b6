"""The old ``mmpos.world.<module>`` paths of the modules that moved out of the world still import, for one release:
the same module object as the new path, with a DeprecationWarning naming both paths."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import mmpos.world
from mmpos._deprecation import MovedModules, moved_modules


@pytest.mark.parametrize("old", sorted(mmpos.world.MOVED))
def test_an_old_path_is_the_new_module_with_a_deprecation_warning(old):
    new = mmpos.world.MOVED[old]
    sys.modules.pop(f"mmpos.world.{old}", None)
    with pytest.warns(DeprecationWarning, match=rf"mmpos\.world\.{old} moved to {new.replace('.', '[.]')}"):
        module = importlib.import_module(f"mmpos.world.{old}")
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


def test_the_hook_is_installed_once_per_package():
    before = [f for f in sys.meta_path if isinstance(f, MovedModules) and f.package == "mmpos.world"]
    importlib.reload(mmpos.world)
    after = [f for f in sys.meta_path if isinstance(f, MovedModules) and f.package == "mmpos.world"]
    assert len(before) == len(after) == 1
    finder = moved_modules("mmpos.world", mmpos.world.MOVED)  # installing again replaces, never stacks
    assert [f for f in sys.meta_path if isinstance(f, MovedModules) and f.package == "mmpos.world"] == [finder]


def test_the_world_holds_no_moved_module_file():
    folder = Path(mmpos.world.__file__).parent
    assert not [old for old in mmpos.world.MOVED if (folder / f"{old}.py").exists() or (folder / old).is_dir()]
