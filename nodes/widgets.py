"""Widgets several nodes share: a size, an option whose 0 means automatic."""

from ..cosmos3_runtime.geometry import SPATIAL_FACTOR
from ..cosmos3_runtime.request import MAX_SIZE, help_of


def auto_help(name: str) -> str:
    return f"{help_of(name)}; 0 = automatic"


def size_widgets() -> dict:
    """The width and height widgets of the samplers (0: the variant's default)."""
    return {name: ("INT", {"default": 0, "min": 0, "max": MAX_SIZE, "step": SPATIAL_FACTOR, "tooltip": auto_help(name)})
            for name in ("width", "height")}
