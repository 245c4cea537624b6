"""A command-line option changes only the config key it names (issue 31, item 2): for every shipped config and every
option of ``mmpos train vit``, ``mmpos edit METHOD`` and ``mmpos generate`` that maps to a config key,
``--config C OPTION VALUE`` resolves to the config of ``--config C`` alone with exactly that key changed. No model is
built and nothing is trained: the ViT trainer is replaced by one that records the config it is given."""

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from mmpos.pipelines.commands import build_parser
from mmpos.pipelines.commands.edit import edit_config
from mmpos.pipelines.commands.generate.image import generate_config
from mmpos.training import ViTConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# option dest -> (config key, candidate command-line values; None: a flag without a value, meaning True)
VIT_OPTIONS = {
    "model": ("model", ["vit_small_patch16_224", "vit_tiny_patch16_224"]),
    "pe": ("pe", ["rope_mixed", "rope_axial"]),
    "ape": ("ape", ["keep", "resample"]),
    "train_only": ("train_only", ["pe,head", "head"]),
    "data_dir": ("data_dir", ["elsewhere/data", "other/data"]),
    "pretrained": ("pretrained", ["true", "false"]),
    "mixed_precision": ("mixed_precision", ["bf16", "fp16"]),
    "seed": ("seed", ["7", "8"]),
    "steps": ("steps", ["400", "401"]),
    "compile": ("compile", None),
}
VIT_RUN_OPTIONS = {"help", "config", "sets", "resume", "overwrite"}

RUN_OPTIONS = {
    "model": ("model", ["world", "someone/another-model"]),
    "device": ("device", ["cpu", "cuda"]),
    "dtype": ("dtype", ["float32", "bfloat16"]),
    "extrapolate": ("extrapolate.preset", ["ntk", "yarn"]),
    "train_size": ("extrapolate.train_size", ["48", "64"]),
}
EDIT_PROMPT = {"prompt_text": ("prompt", ["a red star", "a blue circle"])}
EDIT_OPTIONS = {
    "band": {
        **RUN_OPTIONS,
        **EDIT_PROMPT,
        "target": ("targets", ["a green square"]),
        "reference_prompt": ("reference.prompt", ["a red star", "a blue circle"]),
        "reference_image": ("reference.image", ["ref.png", "ref2.png"]),
        "image": ("image", ["ctx.png", "c2.png"]),
    },
    "transplant": {**RUN_OPTIONS, **EDIT_PROMPT},
    "loose": {**RUN_OPTIONS, **EDIT_PROMPT},
    "generate": {
        **RUN_OPTIONS,
        "prompt": ("prompts", ["a green square"]),
        "height": ("sampler.height", ["48", "64"]),
        "width": ("sampler.width", ["48", "64"]),
        "dype_shift": ("extrapolate.shift", ["comfyui", "off"]),
    },
}
# options that name inputs or outputs of a run, not config keys
INPUT_OPTIONS = {"help", "config", "config_name", "prompt_embeds", "set", "out", "overwrite", "no_figures"}
REQUIRED = {
    "band": [],
    "generate": [],
    "transplant": ["--background", "bg.png", "--box", "0", "0", "8", "8", "--reference", "ref.png"],
    "loose": ["--image", "collage.png", "--mask", "mask.png"],
}
METHOD_INPUTS = {
    "band": set(),
    "generate": set(),
    "transplant": {"background", "mask", "box", "reference", "reference_mask"},
    "loose": {"image", "mask", "original", "saliency"},
}


def _option_strings(parser) -> dict:
    """dest -> the option's first long spelling."""
    return {
        a.dest: next(s for s in a.option_strings if s.startswith("--")) for a in parser._actions if a.option_strings
    }


def _subparser(parser, *names):
    for name in names:
        action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = action.choices[name]
    return parser


def _with_key(config: dict, dotted: str, value) -> dict:
    """A deep copy of ``config`` with ``dotted`` (``a.b``) set to ``value``."""
    expected = copy.deepcopy(config)
    *sections, leaf = dotted.split(".")
    node = expected
    for section in sections:
        node = node.setdefault(section, {})
    node[leaf] = value
    return expected


def _get(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _variant(base: dict, key: str, candidates, parse, action):
    """(argv tail, parsed value) of the first candidate whose value differs from ``base``'s at ``key``."""
    if candidates is None:
        return [], True
    for text in candidates:
        value = parse(text)
        value = [value] if action == "append" else value
        if _get(base, key) != value:
            return [text], value
    raise AssertionError(f"every candidate for {key} equals the config's value {_get(base, key)!r}")


def _kind(parser, dest):
    action = next(a for a in parser._actions if a.dest == dest)
    parse = action.type or str
    return parse, "append" if action.__class__.__name__ == "_AppendAction" else "store"


VIT_CONFIGS = sorted((CONFIGS / "vit").glob("*.yaml"))


def _vit_parser():
    return _subparser(build_parser(), "train", "vit")


def test_every_vit_option_is_a_config_key():
    options = set(_option_strings(_vit_parser()))
    assert options - VIT_RUN_OPTIONS == {field.name for field in dataclasses.fields(ViTConfig)}
    assert set(VIT_OPTIONS) < options


@pytest.fixture()
def recorded_vit_config(monkeypatch, tmp_path):
    """``resolve(argv)``: the config ``mmpos train vit ARGV`` hands the trainer (the trainer is not run)."""
    import mmpos.training.tasks.vit as vit_train

    seen = []
    monkeypatch.setattr(
        vit_train, "train_vit", lambda config, *a, **k: seen.append(dataclasses.asdict(config)) or {"eval": []}
    )
    parser = build_parser()

    def resolve(argv):
        args = parser.parse_args(["train", "vit", "--output-dir", str(tmp_path / "run"), *argv])
        assert args.func(args) == 0
        return seen.pop()

    return resolve


@pytest.mark.parametrize("config_path", VIT_CONFIGS, ids=lambda p: p.stem)
@pytest.mark.parametrize("dest", sorted(VIT_OPTIONS))
def test_a_vit_option_changes_only_its_key(recorded_vit_config, config_path, dest):
    base = recorded_vit_config(["--config", str(config_path)])
    key, candidates = VIT_OPTIONS[dest]
    parser = _vit_parser()
    tail, value = _variant(base, key, candidates, *_kind(parser, dest))
    resolved = recorded_vit_config(["--config", str(config_path), _option_strings(parser)[dest], *tail])
    assert resolved == _with_key(base, key, value)
    changed = sorted(k for k in base if base[k] != resolved[k])
    assert changed == ([] if base[key] == value else [key])


def test_world_relation_steps_keeps_the_recipe(recorded_vit_config):
    """The reported case: --steps 400 left RandAugment and colour jitter on although the config sets them null."""
    resolved = recorded_vit_config(["--config", str(CONFIGS / "vit" / "world_relation.yaml"), "--steps", "400"])
    assert resolved["steps"] == 400
    assert resolved["auto_augment"] is None and resolved["color_jitter"] is None


def _run_configs(method):
    name = "generate" if method == "generate" else f"edit_{method}"
    return sorted(p for p in CONFIGS.glob(f"{name}*.yaml"))


RUN_CASES = [(m, p) for m in EDIT_OPTIONS for p in _run_configs(m)]


@pytest.mark.parametrize("method", sorted(EDIT_OPTIONS))
def test_every_run_option_is_covered(method):
    parser = build_parser()
    sub = _subparser(parser, "generate") if method == "generate" else _subparser(parser, "edit", method)
    options = set(_option_strings(sub)) - INPUT_OPTIONS - METHOD_INPUTS[method]
    assert options == set(EDIT_OPTIONS[method]), f"a new option of {method}: add it to EDIT_OPTIONS"


@pytest.mark.parametrize(("method", "config_path"), RUN_CASES, ids=lambda v: getattr(v, "stem", v))
def test_a_run_option_changes_only_its_key(monkeypatch, method, config_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # --device cuda stays cuda (no cpu fallback)
    parser = build_parser()
    command = ["generate"] if method == "generate" else ["edit", method]
    sub = _subparser(parser, *command)
    resolve = generate_config if method == "generate" else edit_config
    argv = [*command, "--config", str(config_path), *REQUIRED[method]]
    base = resolve(parser.parse_args(argv))
    for dest, (key, candidates) in EDIT_OPTIONS[method].items():
        tail, value = _variant(base, key, candidates, *_kind(sub, dest))
        resolved = resolve(parser.parse_args([*argv, _option_strings(sub)[dest], *tail]))
        assert resolved == _with_key(base, key, value), f"{config_path.name}: {dest}"
