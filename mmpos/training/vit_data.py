"""Data of the ViT trainer through timm's factories: ``create_dataset``, ``create_transform``, ``Mixup``.

Augmentation randomness is a function of (seed, epoch, sample index) (:class:`SeededSamples`), so a resumed
run sees the same augmented images as an uninterrupted one, whatever the worker count.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from timm.data import Mixup, create_dataset, create_transform, resolve_data_config

from .scaffold.config import ConfigError
from .task_configs import ViTConfig

SEED_STRIDE = 1_000_003


class SeededSamples(torch.utils.data.Dataset):
    """Wrap a map-style dataset: item ``i`` of epoch ``e`` is drawn with ``random``, ``numpy`` and ``torch``
    seeded from ``(seed, e, i)``. The generators are left seeded (restoring them costs more than the image):
    the trainer reseeds them before each update."""

    def __init__(self, dataset, seed: int):
        self.dataset, self.seed, self.epoch = dataset, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        item_seed = (self.seed * SEED_STRIDE + self.epoch) * SEED_STRIDE + int(index)
        random.seed(item_seed)
        np.random.seed(item_seed % 2**32)
        torch.manual_seed(item_seed)
        return self.dataset[index]


def data_config(config: ViTConfig, model) -> dict:
    """timm's data config of ``model`` (mean, std, interpolation) with the trainer config's overrides."""
    args = {
        k: getattr(config, k) for k in ("mean", "std", "interpolation", "crop_pct") if getattr(config, k) is not None
    }
    return resolve_data_config(args, model=model)


def make_dataset(config: ViTConfig, split: str, transform=None, is_training: bool = False):
    """``timm.data.create_dataset`` on ``config.data_dir`` (ImageFolder ``root/split/<class>/``, tar,
    ``wds/`` or ``hfds/`` names pass through)."""
    if config.data_dir is None and not config.dataset:
        raise ConfigError("config data_dir: expected the folder of the dataset (train/ and val/ inside)")
    if not config.dataset:
        check_split_folder(config.data_dir, split, "val_split" if not is_training else "train_split")
    dataset = create_dataset(
        config.dataset,
        root=config.data_dir,
        split=split,
        is_training=is_training,
        batch_size=config.batch_size,
        seed=config.seed,
    )
    if transform is not None:
        dataset.transform = transform
    return dataset


SPLIT_SYNONYMS = (("train", "training"), ("val", "valid", "validation", "eval", "evaluation"))  # timm's


def check_split_folder(data_dir, split: str, key: str) -> None:
    """A folder dataset must have the split's folder (or one of timm's synonyms for it): timm otherwise reads the
    whole ``data_dir`` (the training images too) as that split without a word."""
    from pathlib import Path

    root = Path(data_dir)
    if not root.exists():
        raise ConfigError(f"config data_dir={str(data_dir)!r}: no such folder or file")
    if not root.is_dir():
        return  # a tar file: timm reads the split inside
    name = split.split("[")[0]
    names = next((group for group in SPLIT_SYNONYMS if name in group), (name,))
    if not any((root / candidate).is_dir() for candidate in (name, *names)):
        raise ConfigError(
            f"config {key}={split!r}: no folder {root / name} (nor {', '.join(n for n in names if n != name)}"
            f"); expected {root}/{name}/<class>/ images"
        )


def train_transform(config: ViTConfig, model):
    base = data_config(config, model)
    return create_transform(
        (3, config.img_size, config.img_size),
        is_training=True,
        scale=tuple(config.scale),
        ratio=tuple(config.ratio),
        hflip=config.hflip,
        color_jitter=config.color_jitter,
        auto_augment=config.auto_augment,
        re_prob=config.reprob,
        interpolation=base["interpolation"],
        mean=base["mean"],
        std=base["std"],
    )


def eval_transform(config: ViTConfig, model, height: int, width: int):
    base = data_config(config, model)
    return create_transform(
        (3, height, width),
        is_training=False,
        interpolation=base["interpolation"],
        mean=base["mean"],
        std=base["std"],
        crop_pct=base["crop_pct"],
    )


def classes_of(dataset) -> dict | None:
    """``class_to_idx`` of a folder / tar dataset (None for datasets without named classes)."""
    mapping = getattr(getattr(dataset, "reader", None), "class_to_idx", None)
    return dict(mapping) if mapping else None


class TrainLabels:
    """Target transform: a label of the validation split -> the training split's label of the same class name."""

    def __init__(self, to_train: list[int]):
        self.to_train = to_train

    def __call__(self, target):
        return self.to_train[int(target)]


def match_classes(dataset, train_classes: dict | None, split: str) -> None:
    """Make ``dataset`` (an evaluation split) label its images with the training split's indices, by class name:
    a split missing some classes is mapped (labels after a gap would otherwise be shifted); one holding a class
    the training split does not have is refused."""
    classes = classes_of(dataset)
    if train_classes is None or classes is None or classes == train_classes:
        return
    unknown = sorted(set(classes) - set(train_classes))
    if unknown:
        shown = ", ".join(map(repr, unknown[:5])) + (", ..." if len(unknown) > 5 else "")
        raise ConfigError(
            f"config val_split={split!r}: its classes {shown} are not classes of the training split; "
            "expected class folders named as in the training split"
        )
    to_train = [0] * len(classes)
    for name, index in classes.items():
        to_train[index] = train_classes[name]
    dataset.target_transform = TrainLabels(to_train)


def check_num_classes(config: ViTConfig, dataset) -> None:
    """``num_classes`` set below the data's class count would give labels the head cannot score."""
    classes = classes_of(dataset)
    if config.num_classes is not None and classes and config.num_classes < len(classes):
        raise ConfigError(
            f"config num_classes={config.num_classes}: the training split has {len(classes)} "
            "classes; expected at least that many (or null)"
        )


def check_one_batch(config: ViTConfig, dataset, num_processes: int = 1) -> None:
    """The loader drops the last incomplete batch: fewer images than one batch per process would train 0 steps."""
    needed = config.batch_size * num_processes
    if len(dataset) < needed:
        raise ConfigError(
            f"config batch_size={config.batch_size}: the training split has {len(dataset)} images, "
            f"fewer than one batch ({config.batch_size} x {num_processes} process(es)); expected a "
            "smaller batch_size or more images"
        )


def num_classes_of(dataset) -> int:
    reader = getattr(dataset, "reader", None)
    mapping = getattr(reader, "class_to_idx", None)
    if mapping:
        return len(mapping)
    raise ConfigError("cannot tell the number of classes of this dataset; set config num_classes")


def make_mixup(config: ViTConfig, num_classes: int):
    """timm ``Mixup`` (mixup/CutMix with label smoothing) or None when both alphas are 0."""
    if not (config.mixup or config.cutmix):
        return None
    return Mixup(
        mixup_alpha=config.mixup,
        cutmix_alpha=config.cutmix,
        prob=config.mixup_prob,
        label_smoothing=config.smoothing,
        num_classes=num_classes,
    )


def train_loader(dataset, config: ViTConfig):
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=config.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=config.num_workers,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=False,
    )


def eval_loader(dataset, config: ViTConfig):
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=config.eval_batch_size or config.batch_size,
        shuffle=False,
        num_workers=config.num_workers,
    )
