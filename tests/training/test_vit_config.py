"""The ViT trainer's inputs: every config value checked (type and range) when the config is made, YAML scalars
for ``--set``, unreadable config files named, evaluation classes matched to the training classes by name, too few
images for one batch refused, and a resumed run keeping the config it was started with."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, replace

import pytest

from mmpos.cli import main as mmpos_main
from mmpos.training import ViTConfig, train_vit
from mmpos.training.scaffold.config import ConfigError, build_parser, parse_config, yaml_value
from mmpos.training.tasks.vit import check_names
from mmpos.training.vit_data import classes_of, make_dataset, match_classes
from mmpos.world.positional import write_positional_folder
from tests.training.test_train_vit import TINY_MODEL, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

BAD_VALUES = [  # (--set text, key named, what the message says was expected)
    ("ema_decay=2.0", "ema_decay", "[0, 1)"),
    ("ema_decay=-0.1", "ema_decay", "[0, 1)"),
    ("clip_grad=-1", "clip_grad", ">= 0"),
    ("weight_decay=-1", "weight_decay", ">= 0"),
    ("drop_path=1.5", "drop_path", "[0, 1)"),
    ("drop_path=1", "drop_path", "[0, 1)"),
    ("eval_aspects=[0]", "eval_aspects", "positive"),
    ("eval_aspects=[1, -2]", "eval_aspects", "positive"),
    ("checkpoint_every=0", "checkpoint_every", "positive"),
    ("log_every=0", "log_every", "positive"),
    ("lr=abc", "lr", "float"),
    ("lr=.nan", "lr", "finite number"),
    ("lr=-1e-3", "lr", "positive number"),
    ("steps=1.5", "steps", "int"),
    ("batch_size=true", "batch_size", "int"),
    ("opt=adamz", "opt", "timm optimizer name"),
    ("sched=cosin", "sched", "one of"),
    ("num_classes=0", "num_classes", "positive"),
    ("eval_sizes=[32, 0]", "eval_sizes", "positive integers"),
    ("eval_extrapolation=[pix]", "eval_extrapolation", "one of"),
    ("scale=[0.9, 0.1]", "scale", "min <= max"),
    ("hflip=2", "hflip", "[0, 1]"),
    ("pretrained=1", "pretrained", "bool or str"),
    ("pretrained=openai", "pretrained", "true or false"),
    ("model_kwargs=[1]", "model_kwargs", "dict"),
    ("momentum=1", "momentum", "[0, 1)"),
    ("seed=-1", "seed", ">= 0"),
    ("num_workers=-1", "num_workers", ">= 0"),
]


@pytest.mark.parametrize("text, key, expected", BAD_VALUES)
def test_a_bad_value_is_named_with_what_was_expected(text, key, expected):
    name, _, value = text.partition("=")
    with pytest.raises(ConfigError, match=rf"^{key}: expected .*{re.escape(expected)}"):
        check_names(ViTConfig(**{name: yaml_value(value)}))


@pytest.mark.parametrize("text, key, expected", BAD_VALUES[:6])
def test_the_command_line_reports_a_bad_value_in_one_line(text, key, expected, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        mmpos_main(["train", "vit", "--out", str(tmp_path / "run"), "--set", text])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"{key}: expected" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_set_values_are_yaml_scalars_with_exponents_as_numbers(tmp_path):
    sets = ["lr=1e-3", "min_lr=5E-7", "warmup_lr=2e+0", "eval_sizes=[32,48]", "model_kwargs={depth: 4}"]
    config, _ = parse_config(ViTConfig, build_parser(ViTConfig, "t"), [a for s in sets for a in ("--set", s)])
    assert config.lr == 0.001 and isinstance(config.lr, float)  # was the string '1e-3': a TypeError later
    assert config.min_lr == 5e-7 and config.warmup_lr == 2.0
    assert config.eval_sizes == [32, 48] and config.model_kwargs == {"depth": 4}
    path = tmp_path / "config.yaml"
    path.write_text("lr: 1e-3\nweight_decay: 0\nmodel: vit_tiny_patch16_224\n")
    assert ViTConfig.from_file(path).lr == 0.001


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"lr: [1e-3\n", r"not valid YAML at line 2"),
        (b"lr: 1e-3\n\tsteps: 3\n", r"not valid YAML"),
        (b"lr: \xff\xfe\n", r"not UTF-8 text"),
        (b"lr: !!python/object/apply:os.system ['true']\n", r"not valid YAML.*python/object/apply"),
        (b"- 1\n- 2\n", r"expected a mapping"),
    ],
)
def test_unreadable_config_files_are_named(tmp_path, capsys, content, expected):
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=rf"^--config {path}: {expected}"):
        ViTConfig.from_file(path)
    with pytest.raises(SystemExit) as exit_info:
        mmpos_main(["train", "vit", "--config", str(path), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1 and str(path) in err


def test_a_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"--config .*nothing.yaml: cannot be read"):
        ViTConfig.from_file(tmp_path / "nothing.yaml")


# ---------------------------------------------------------------------------------------------- data


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("vit_config_data")
    write_positional_folder(root / "train", 32, seed=0, task="relation", image_size=32)
    write_positional_folder(root / "val", 12, seed=1, task="relation", image_size=32)
    return root


def test_a_validation_split_missing_a_class_is_labelled_by_name(data_dir, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(data_dir, root)
    train = make_dataset(tiny_config(root), "train")
    train_classes = classes_of(train)
    first = min(train_classes)
    shutil.rmtree(root / "val" / first)  # a gap: every later class folder would get an index one lower
    val = make_dataset(tiny_config(root), "val")
    assert classes_of(val) != {k: v for k, v in train_classes.items() if k != first}  # indices shifted by timm
    match_classes(val, train_classes, "val")
    for index in range(len(val)):
        path, _ = val.reader.samples[index]
        folder = path.split("/")[-2]
        assert val[index][1] == train_classes[folder]  # the training split's label of that class name


def test_a_validation_split_with_a_foreign_class_or_no_val_folder_is_refused(data_dir, tmp_path):
    root = tmp_path / "data"
    shutil.copytree(data_dir, root)
    (root / "val" / "blue_above").rename(root / "val" / "green_above")
    config = tiny_config(root, out=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match=r"val_split='val': its classes 'green_above' are not classes"):
        train_vit(config)
    assert not (tmp_path / "run").exists()  # refused before the run folder is made
    shutil.rmtree(root / "val")  # timm would read the whole data_dir (the training images) as val
    with pytest.raises(ConfigError, match=rf"config val_split='val': no folder {root / 'val'}"):
        train_vit(config)
    with pytest.raises(ConfigError, match=r"config data_dir='/nowhere': no such folder"):
        train_vit(replace(config, data_dir="/nowhere"))  # was: a bare AssertionError from timm


def test_fewer_images_than_one_batch_are_refused_before_training(data_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"batch_size=33: the training split has 32 images, fewer than one batch"):
        train_vit(tiny_config(data_dir, batch_size=33, out=str(tmp_path / "run")))  # was: an endless loop, 0 updates
    assert not (tmp_path / "run").exists()


def test_num_classes_below_the_data_is_refused(data_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"num_classes=2: the training split has 4 classes"):
        train_vit(tiny_config(data_dir, num_classes=2, out=str(tmp_path / "run")))


# ---------------------------------------------------------------------------------------------- resume


@pytest.fixture(scope="module")
def stopped_run(data_dir, tmp_path_factory):
    run = tmp_path_factory.mktemp("stopped") / "run"
    config = tiny_config(
        data_dir, steps=2, checkpoint_every=2, eval_sizes=[32], eval_extrapolation=["none"], out=str(run)
    )
    train_vit(config)
    return config, run


@pytest.mark.parametrize(
    "change",
    [
        {"lr": 1e-2},
        {"steps": 3},
        {"pe": "rope_axial"},
        {"pe_options": {"theta": 10.0}},
        {"model_kwargs": {**TINY_MODEL, "depth": 2}},
    ],
)
def test_resume_with_a_changed_config_is_refused_and_keeps_the_config(stopped_run, change):
    config, run = stopped_run
    before = (run / "config.yaml").read_bytes()
    key = next(iter(change))
    with pytest.raises(ConfigError, match=rf"^--resume: {key} is .* but the run was started with "):
        train_vit(replace(config, **change), resume=True)  # was: continued silently with the new values
    assert (run / "config.yaml").read_bytes() == before


def test_resume_accepts_changes_of_evaluation_and_logging(stopped_run, tmp_path):
    config, run = stopped_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    before = (copy / "config.yaml").read_bytes()
    results = train_vit(replace(config, eval_sizes=[48], log_every=2, num_workers=0, out=str(copy)), resume=True)
    assert [row["size"] for row in results["eval"]] == [48]
    assert (copy / "config.yaml").read_bytes() == before  # the run's own config is kept


def test_resume_from_the_command_line_names_the_changed_keys(stopped_run, tmp_path, capsys):
    config, run = stopped_run
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(asdict(config)))  # JSON is YAML
    argv = ["--config", str(path), "--out", str(run), "--resume", "--set", "lr=1e-3", "--steps", "5"]
    with pytest.raises(SystemExit) as exit_info:
        mmpos_main(["train", "vit", *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "lr is 0.001 but the run was started with 0.0005" in err and "steps is 5 but" in err
