"""What a Cosmos3 CONDITIONING holds: the prompt itself (tokenized at sampling time, when the latent's
size and frame count are known) and, in the slot where core conditionings keep embeddings, a marker.

The marker is a one-element tensor that refuses every computation. Core nodes that edit
embeddings (ConditioningZeroOut, Concat, Average) and models that are not Cosmos3 would otherwise
turn it into silent nonsense; with the marker they stop with a message that says what happened.
No ComfyUI import: the pack's tests build these without ComfyUI.
"""

import math
from dataclasses import dataclass, field

import torch

PROMPT_KEY = "cosmos3_prompt"
CONTROLS = "COSMOS3_CONTROLS"  # the control nodes' type: {hint: frames}
CONTROLS_KEY = "cosmos3_controls"  # a causal Sim-Transfer's controls in a core conditioning (Cosmos3 Sim Control (core))
ACTION_KEY = "cosmos3_action"  # a causal Sim-Bimanual's actions in a core conditioning (Cosmos3 Sim Actions (core))


@dataclass(frozen=True)
class CorePrompt:
    text: str
    negative: bool  # the unconditional branch: negated metadata templates
    fps: float
    options: dict = field(default_factory=dict)  # Request fields: system prompt, templates, json_captions

    @property
    def token_bound(self) -> int:
        """A quick upper estimate of the tokens for memory planning (the metadata adds well under 100)."""
        return math.ceil(len(self.text.encode("utf-8")) / 2) + 100


class Refusing(torch.Tensor):
    """A placeholder tensor that stops any computation made with it, with `refusal`. Reading what it is
    (shape, dtype, device, size in bytes: ComfyUI's caches measure their entries) still works."""

    refusal = ""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        result = super().__torch_function__(func, types, args, kwargs or {})
        values = result if isinstance(result, (tuple, list)) else (result,)
        if any(isinstance(value, torch.Tensor) for value in values):  # a computation: its result would be nonsense
            raise RuntimeError(f"{getattr(func, '__name__', repr(func))}(): {cls.refusal}")
        return result

    def __deepcopy__(self, memo):
        return self  # immutable


class PromptMarker(Refusing):
    refusal = ("a Cosmos3 CONDITIONING holds a prompt, not text embeddings: core nodes that edit embeddings "
               "(ConditioningZeroOut, ConditioningConcat, ConditioningAverage) do not work on Cosmos3 prompts (for an "
               "unconditional branch use the negative output), and only a Cosmos3 MODEL (Cosmos3 Core Model) can "
               "sample with it")


def refusing(cls: type[Refusing], shape=(1,)) -> Refusing:
    return torch.zeros(shape).as_subclass(cls)


def conditioning(prompt: CorePrompt) -> list:
    """A core CONDITIONING ([[tensor, dict]]) carrying one Cosmos3 prompt."""
    return [[refusing(PromptMarker, (1, 1, 1)), {PROMPT_KEY: prompt}]]
