"""Cosmos3 inference runtime: plain torch, no ComfyUI imports.

    import cosmos3_runtime
    pipe = cosmos3_runtime.load("path/to/Cosmos3-Nano")
    print(pipe.variant.describe())
"""

from .checkpoint import Checkpoint, Variant, detect_variant
from .errors import CheckpointError, Cosmos3Error, InputError
from .pipeline import Cosmos3Pipeline, load
from .transformer import Cosmos3Transformer, TextKV, TransformerConfig

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "Cosmos3Error",
    "Cosmos3Pipeline",
    "Cosmos3Transformer",
    "InputError",
    "TextKV",
    "TransformerConfig",
    "Variant",
    "detect_variant",
    "load",
]
