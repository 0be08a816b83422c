"""The protocol every weight format implements, and what formats share.

A format is detected from a checkpoint's files before any weight is read (`weights.detect`); then a model is built on
the meta device, `build` puts the format's layers in place of the linears its files store quantized (checking their
tensors' names, dtypes and shapes from the headers: bad files are refused by name here), and `read` fills every
tensor (renamed, converted) on its device. The memory plan asks `resident_bytes` (what a weight takes in memory, its
scales with it) and `step_bytes` (what the format's layers hold while a step runs). A format whose files calibrate
the activations too runs them natively or with 16-bit activations as the step policy says (`precision`).
"""

from collections.abc import Callable
from contextlib import contextmanager
from typing import Protocol

import torch
from torch import nn

Rename = Callable[[str], str | None]  # a file's key -> the model's parameter name (None: not read)
Pathway = Callable[[str], str | None]  # a linear's name -> the precision pathway it follows ("media", "text", None)


class WeightFormat(Protocol):
    name: str  # as the memory plan and `describe` name it
    quantization: object | None  # what the checkpoint declares (`modelopt.Quantization`); None for the others

    def describe(self) -> str:
        """A few words for the variant line and notes."""

    def build(self, model: nn.Module, rename: Rename, pathway_of: Pathway) -> None:
        """Replace the linears (of `model`, on the meta device) whose weights the files store in this format by the
        format's layers; refuse by name what the files hold that the format cannot read."""

    def read(self, model: nn.Module, dtype: torch.dtype, device: torch.device, rename: Rename,
             keep_fp32: tuple[str, ...] = ()) -> None:
        """Fill `model`'s tensors from the files (`keep_fp32`: name prefixes kept in float32)."""

    def resident_bytes(self, name: str, layer: nn.Module) -> int | None:
        """Bytes the weight of `layer` (a full-precision nn.Linear or nn.Embedding named `name`, built on the meta
        device) takes in memory in this format, its scales included; None where the format keeps it as loaded."""

    def step_bytes(self, config, tokens: int, dtype: torch.dtype, device: torch.device | None) -> dict[str, int]:
        """Memory the format's layers hold while a step runs over `tokens` media tokens, by name (beyond the
        activations `budget` counts)."""


def replace_linears(model: nn.Module, make: Callable[[str, nn.Module], nn.Module | None],
                    kinds: tuple[type, ...] = (nn.Linear,)) -> None:
    """Each submodule of `model` that is one of `kinds` replaced, by its full name, with `make(name, module)` (left as
    it is where that is None), one at a time."""
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, kinds):
                made = make(f"{name}.{child_name}" if name else child_name, child)
                if made is not None:
                    setattr(module, child_name, made)


def slice_values(device: torch.device) -> int:
    """Values a format expands in float32 at once on `device`: 2M on a CPU (8 MiB each temporary, cache-sized), 16M on
    a GPU, where each slice is a dozen kernel launches and smaller slices are launch-bound."""
    return 1 << 21 if device.type == "cpu" else 1 << 24


def planned_bytes(model: nn.Module, weights: WeightFormat, dtype: torch.dtype,
                  keep_fp32: tuple[str, ...] = ("time_embedder.",)) -> dict[str, int]:
    """The memory plan of `model`'s weights (a full-precision model built on the meta device: nothing allocated) once
    read in `weights`, by parameter name: a quantized layer's weight as the format keeps it (`resident_bytes`), every
    other tensor in `dtype` (float32 under `keep_fp32`)."""
    layers = {f"{name}.weight": (name, m) for name, m in model.named_modules()
              if isinstance(m, (nn.Linear, nn.Embedding))}
    sizes = {}
    for name, p in model.named_parameters():
        stored = weights.resident_bytes(*layers[name]) if name in layers else None
        sizes[name] = stored if stored is not None else p.numel() * (4 if name.startswith(keep_fp32) else
                                                                      torch.finfo(dtype).bits // 8)
    return sizes


def weight_bytes(model: nn.Module) -> int:
    """Bytes `model`'s parameters take as they are."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


class ExpandingLinear(nn.Module):
    """A linear whose weight stays quantized in memory and is expanded into the compute dtype where it runs (GGUF,
    NVFP4), one layer at a time: never a whole dequantized copy of the model. `expanded` holds it expanded for a loop
    of many small forwards (`expanded_once`)."""

    expanded: torch.Tensor | None = None
    in_features: int
    out_features: int

    def dequantized(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The weight [out, in] in `dtype` on `device`."""
        raise NotImplementedError

    def runs_natively(self, device: torch.device) -> bool:
        """Whether a forward on `device` now runs the format's own arithmetic, never expanding the weight."""
        return False

    def expanded_weight(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.expanded
        if weight is None or weight.device != x.device or weight.dtype != x.dtype:
            weight = self.dequantized(x.dtype, x.device)
        return weight


def expanding_linears(model: nn.Module, keep=lambda name: True) -> list[ExpandingLinear]:
    """The expanding linears of `model` whose weight's name `keep` accepts."""
    return [m for name, m in model.named_modules() if isinstance(m, ExpandingLinear) and keep(f"{name}.weight")]


def expanded_bytes(layers: list[ExpandingLinear], dtype: torch.dtype) -> int:
    return sum(m.out_features * m.in_features for m in layers) * torch.finfo(dtype).bits // 8


@contextmanager
def expanded_once(layers: list[ExpandingLinear], dtype: torch.dtype, device: torch.device):
    """`layers` expanded to `dtype` on `device` for the block: a loop of many small forwards (the Reasoner's
    tokens) then dequantizes each weight once, not once per call."""
    for m in layers:
        m.expanded = m.dequantized(dtype, device)
    try:
        yield
    finally:
        for m in layers:
            m.expanded = None
