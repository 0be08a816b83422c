"""Cosmos3 inference runtime: plain torch, no ComfyUI imports.

    import cosmos3_runtime
    pipe = cosmos3_runtime.load("path/to/Cosmos3-Nano")
    print(pipe.variant.describe())
    result = pipe.generate("A robot arm stacks two cubes.", seed=1)   # result.frames, result.latents
    answer = pipe.reason("What is on the table?", images=[picture])  # answer.text (the Reasoner)
"""

from .action import ActionRequest
from .checkpoint import Checkpoint, Variant, detect_variant
from .errors import CheckpointError, Cosmos3Error, InputError, NumericalError
from .guardrails import GuardrailBlocked, Guardrails, load as load_guardrails
from .pipeline import Cosmos3Pipeline, load
from .reasoner import Answer, Clip
from .request import Request
from .transformer import Cosmos3Transformer, TextKV, TransformerConfig
from .vae import TileSpec
from .windows import Generation
from .workers import WorkerPool

__all__ = [
    "ActionRequest",
    "Answer",
    "Checkpoint",
    "CheckpointError",
    "Clip",
    "Cosmos3Error",
    "Cosmos3Pipeline",
    "Cosmos3Transformer",
    "Generation",
    "GuardrailBlocked",
    "Guardrails",
    "InputError",
    "NumericalError",
    "Request",
    "TextKV",
    "TileSpec",
    "TransformerConfig",
    "Variant",
    "WorkerPool",
    "detect_variant",
    "load",
    "load_guardrails",
]
