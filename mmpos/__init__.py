"""mmpos: positional encodings for vision and multimodal transformers and diffusion models.

    import mmpos
    pe = mmpos.create_pe("rope_axial", head_dim=128, axes_dims=(16, 56, 56), theta=10000, layout="interleaved")
    q, k = pe(q, k, ids)        # q, k: [B, H, L, D]; ids: [L, 3] float

The exports below are loaded on first use (``import mmpos`` alone imports no torch), so the ``mmpos`` command
parses its arguments before any heavy import.
"""

from importlib import import_module

_EXPORTS = dict.fromkeys(
    ("Capabilities", "PEKind", "RotaryPE", "create_pe", "list_pes", "pe_capabilities", "pe_class", "register_pe"),
    ".encodings",
)
__all__ = [
    "create_pe",
    "list_pes",
    "pe_capabilities",
    "pe_class",
    "register_pe",
    "Capabilities",
    "PEKind",
    "RotaryPE",
    "__version__",
]


_SUBPACKAGES = (
    "camera",
    "coords",
    "encodings",
    "integrations",
    "models",
    "ops",
    "spectrum",
    "training",
    "viz",
    "world",
)


DISTRIBUTION = "mmpos-toolbox"  # the name on the package index (pyproject.toml); the import name is mmpos


def _installed_version() -> str:
    """The version of the installed distribution: pyproject.toml is the one place it is written."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # a checkout imported without `pip install -e .`
        return "0+unknown"


def __getattr__(name):
    if name == "__version__":
        globals()["__version__"] = value = _installed_version()
        return value
    if name in _SUBPACKAGES:  # `import mmpos; mmpos.encodings.RotaryPE` as when the exports were imported eagerly
        return import_module(f".{name}", __name__)
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | {"__version__"})
