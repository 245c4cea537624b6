"""One config style for the training scaffold: a dataclass per task, loaded from YAML and the command line.

Values are resolved lowest first: the dataclass defaults, ``--config FILE.yaml``, the task's own flags
(``--batch-size 8``: one per field, ``_`` written ``-``), then ``--set key=value`` (repeatable). Every value is
parsed as a YAML scalar (``--set lr=1e-3`` is a number, ``--set pe_options={theta: 100}`` a mapping) and checked
against its field's type and rule; an unknown key (in the file or after ``--set``) is refused by name.

    @dataclass
    class MyConfig(TrainConfig):
        width: int = option(64, "hidden width", check=positive)

    config = parse_config(MyConfig, build_parser(MyConfig, "my_train"), ["--set", "width=32"])

Torch-free: a command line is checked before anything heavy is imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import typing
from pathlib import Path
from types import UnionType

import yaml

from ..._arguments import OneLineErrorParser


class ConfigError(ValueError):
    """A config key that is unknown, or a value of the wrong type or out of range (the message names the key;
    reported as one line, exit code 2, by the command lines)."""


class Yaml12Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` reading ``1e-3`` / ``5E+4`` as floats (YAML 1.2; PyYAML's 1.1 resolver wants a dot)."""


Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def yaml_value(text: str):
    """``text`` as one YAML value (``1e-3`` -> float, ``[1, 2]`` -> list, ``none`` -> None)."""
    try:
        return yaml.load(text, Loader=Yaml12Loader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as error:
        raise ConfigError(f"{text!r} is not a YAML value ({' '.join(str(error).split())})") from None


def option(
    default,
    help: str = "",
    *,
    check=None,
    choices=None,
    flag: str | None = None,
    aliases: tuple[str, ...] = (),
    resume_may_change: bool = False,
    nargs: str | None = None,
):
    """A config field: its default, help, rule (``check(value) -> message or None``) and whether a resumed run
    may change it (``--steps`` may; the model may not)."""
    metadata = dict(
        help=help,
        check=check,
        choices=choices,
        flag=flag,
        aliases=aliases,
        resume_may_change=resume_may_change,
        nargs=nargs,
    )
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def positive(value) -> str | None:
    return None if value > 0 else "a positive number"


def non_negative(value) -> str | None:
    return None if value >= 0 else "a number >= 0"


def finite(value) -> str | None:
    return None if math.isfinite(value) else "a finite number"


def in_unit_interval(value) -> str | None:
    return None if 0 <= value < 1 else "a number in [0, 1)"


@dataclasses.dataclass
class TrainConfig:
    """What every task shares (the scaffold reads these); a task's config subclasses it."""

    out: str = option(
        "outputs/run",
        "run folder: checkpoints, log, outputs (one folder every node sees)",
        flag="--out",
        aliases=("--output-dir",),
    )
    steps: int = option(1000, "optimizer updates", check=positive, resume_may_change=True)
    batch_size: int = option(
        8,
        "samples per process per update (global batch: this x the number of processes; "
        "a resume keeps the global batch)",
        check=positive,
        resume_may_change=True,
    )
    lr: float = option(1e-4, "learning rate (AdamW)", check=positive)
    weight_decay: float = option(0.0, "AdamW weight decay", check=non_negative)
    grad_clip: float | None = option(1.0, "max gradient norm (none: no clipping)")
    ema_decay: float | None = option(None, "EMA decay in [0, 1) (none: no EMA)")
    mixed_precision: str = option("no", "autocast dtype", choices=("no", "bf16", "fp16"))
    seed: int = option(0, "seed of the weights, the data order and every sample's noise")
    checkpoint_every: int = option(500, "updates between checkpoints", check=positive, resume_may_change=True)
    keep: int = option(2, "newest checkpoints kept", check=positive, resume_may_change=True)
    log_every: int = option(1, "updates between log.jsonl lines", check=positive, resume_may_change=True)
    num_workers: int = option(0, "data loader workers", check=non_negative, resume_may_change=True)


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _allowed(hint) -> tuple[tuple[type, ...], bool]:
    """(accepted types, None allowed) of a field's type hint."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, UnionType):  # float | None, bool | str
        return tuple(a for a in args if a is not type(None)), type(None) in args
    origin = typing.get_origin(hint) or hint
    return ((origin,), False)


def check_value(cls, key: str, value):
    """``value`` for field ``key`` of ``cls``, checked (ints accepted for floats); :class:`ConfigError` if not."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if key not in fields:
        raise ConfigError(f"unknown config key {key!r}; known keys: {', '.join(sorted(fields))}")
    types, nullable = _allowed(_hints(cls)[key])
    meta = fields[key].metadata
    if value is None and nullable:
        return None
    if float in types and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        names = " or ".join(t.__name__ for t in types) + (" or none" if nullable else "")
        raise ConfigError(f"{key}: expected {names}, got {value!r}")
    if meta.get("choices") and any(v not in meta["choices"] for v in (value if meta.get("nargs") else [value])):
        raise ConfigError(f"{key}: expected one of {', '.join(map(str, meta['choices']))}, got {value!r}")
    problem = meta["check"](value) if meta.get("check") else None
    if problem:
        raise ConfigError(f"{key}: expected {problem}, got {value!r}")
    return value


def _flag_type(cls, key: str):
    def parse(text: str):
        try:
            return check_value(cls, key, yaml_value(text) if _allowed(_hints(cls)[key])[0] != (str,) else text)
        except ConfigError as error:
            raise argparse.ArgumentTypeError(str(error).split(": ", 1)[-1]) from None

    parse.__name__ = key
    return parse


def build_parser(cls, prog: str, description: str = "") -> argparse.ArgumentParser:
    """The command line of a task: ``--config``, ``--set``, ``--resume``, ``--overwrite`` and one flag per field."""
    p = OneLineErrorParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(p, cls)
    return p


def add_config_arguments(p: argparse.ArgumentParser, cls) -> None:
    """``--config``, ``--set``, ``--resume``, ``--overwrite`` and one flag per field of ``cls`` on ``p`` (a flag not
    given leaves its key out of the parsed namespace: the file's or the default value stays)."""
    p.argument_default = argparse.SUPPRESS
    p.add_argument(
        "--config",
        type=Path,
        help="YAML file of config keys (the dataclass's fields; default: none, the defaults below)",
    )
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one config key, the value parsed as YAML (repeatable; wins over the flags and the file; default: none)",
    )
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="latest|CHECKPOINT",
        help="continue the run in --out from its latest (or the named) checkpoint-<step> (default: a new run)",
    )
    p.add_argument("--overwrite", action="store_true", default=False, help="replace the run in --out")
    for field in dataclasses.fields(cls):
        meta = field.metadata
        names = [meta.get("flag") or "--" + field.name.replace("_", "-"), *meta.get("aliases", ())]
        if _allowed(_hints(cls)[field.name])[0] == (bool,):
            p.add_argument(*names, dest=field.name, action="store_true", help=_with_default(meta, field))
        elif meta.get("nargs"):  # a list flag: --lens-models opencv unified
            p.add_argument(
                *names,
                dest=field.name,
                nargs=meta["nargs"],
                choices=meta.get("choices"),
                help=_with_default(meta, field),
                metavar=field.name.upper(),
            )
        else:
            p.add_argument(
                *names,
                dest=field.name,
                type=_flag_type(cls, field.name),
                help=_with_default(meta, field),
                metavar=field.name.upper(),
            )


def _with_default(meta, field) -> str:
    """A field's help text followed by its default value (``--help`` states every default)."""
    if field.default is not dataclasses.MISSING:
        default = field.default
    elif field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    else:
        return meta.get("help", "")
    if default is None and "None" not in str(field.type):  # a key without a default (CheckedConfig)
        return f"{meta.get('help', '')} (required)".strip()
    shown = ("on" if default else "off") if isinstance(default, bool) else default
    return f"{meta.get('help', '')} (default: {shown})".strip()


def read_config_file(cls, path) -> dict:
    """The keys of a YAML config file, each checked (an unknown one refused naming the file and the key)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"--config {path}: not UTF-8 text (byte {error.start}); save it as UTF-8") from None
    except OSError as error:
        raise ConfigError(f"--config {path}: cannot be read ({' '.join(str(error).split())})") from None
    try:
        values = yaml.load(text, Loader=Yaml12Loader) or {}  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or " ".join(str(error).split())
        raise ConfigError(f"--config {path}: not valid YAML{at}: {problem}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"--config {path}: expected a mapping of config keys, got {type(values).__name__}")
    try:
        return {key: check_value(cls, key, value) for key, value in values.items()}
    except ConfigError as error:
        raise ConfigError(f"--config {path}: {error}") from None


def parse_config(cls, parser: argparse.ArgumentParser, argv=None) -> tuple[object, argparse.Namespace]:
    """(the resolved config, the parsed namespace with ``resume`` / ``overwrite``); errors exit through
    ``parser.error`` (one line, exit code 2)."""
    args = parser.parse_args(argv)
    return config_from_args(cls, args, parser), args


def config_from_args(cls, args: argparse.Namespace, parser: argparse.ArgumentParser):
    """The config of parsed ``args`` (:func:`add_config_arguments`): the file, the flags, then ``--set``; an error
    exits through ``parser.error`` (one line, exit code 2)."""
    try:
        values = read_config_file(cls, args.config) if getattr(args, "config", None) else {}
        names = {f.name for f in dataclasses.fields(cls)}
        values.update({k: v for k, v in vars(args).items() if k in names})
        for item in args.sets:
            key, equals, text = item.partition("=")
            if not equals:
                raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
            field_type = _allowed(_hints(cls).get(key.strip(), str))[0]
            values[key.strip()] = check_value(cls, key.strip(), text if field_type == (str,) else yaml_value(text))
        config = cls(**values)
        for field in dataclasses.fields(cls):  # the defaults too (a subclass may loosen a type by mistake)
            check_value(cls, field.name, getattr(config, field.name))
    except ConfigError as error:
        parser.error(str(error))
    return config


def resolved(config) -> dict:
    """The config as plain YAML-able values (what ``config.yaml`` in a checkpoint holds)."""
    return dataclasses.asdict(config)


def _plain(value):
    """``value`` as YAML / JSON stores it (a tuple is a list)."""
    import json

    return json.loads(json.dumps(value))


def check_resume_config(config, saved: dict, where) -> None:
    """Refuse to resume with changed keys a resumed run may not change (the model, the batch, the seed, ...),
    naming every one."""
    now = resolved(config)
    changed = [
        f"{field.name} is {now[field.name]!r} but the run was started with {saved[field.name]!r}"
        for field in dataclasses.fields(config)
        if not field.metadata.get("resume_may_change")
        and field.name in saved
        and _plain(saved[field.name]) != _plain(now[field.name])
    ]
    if changed:
        raise ConfigError(
            f"--resume: {', '.join(changed)} ({where}); resume with the run's values or start a new --out"
        )


def parse_run(cls, prog: str, description: str = "", outputs: tuple[str, ...] = (), argv=None):
    """:func:`parse_config` plus the run folder check (:func:`~.folders.check_run`), both before any
    training import: a bad value or an existing run without ``--resume`` / ``--overwrite`` is one line, exit 2."""
    parser = build_parser(cls, prog, description)
    config, args = parse_config(cls, parser, argv)
    check_run_of(config, args, parser, outputs)
    return config, args


def check_run_of(config, args: argparse.Namespace, parser: argparse.ArgumentParser, outputs: tuple[str, ...]) -> None:
    """The run folder check (:func:`~.folders.check_run`) of a parsed command line; an error exits through
    ``parser.error``."""
    from .folders import check_run

    try:
        check_run(config.out, args.resume, args.overwrite, outputs)
    except (OSError, ValueError) as error:
        parser.error(str(error))
