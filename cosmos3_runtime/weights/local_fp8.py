"""Local fp8 (`quantize="fp8"` / `"fp8_scaled"`): float8_e4m3fn weights with one scale per output channel, made at load
time from dense checkpoints.

Each quantized linear keeps `weight` [out, in] in float8_e4m3fn and `scale` [out] in float32 (amax of the row / 448,
the format's largest value). Two ways to run it:
- weight-only (`quantize="fp8"`, the default): the forward upcasts the weight to the activations' dtype,
  multiplies by the scale and runs a normal matmul, so the arithmetic is the bf16 model's with rounded weights.
- scaled (`quantize="fp8_scaled"`, opt-in): the activations are quantized to fp8 per token too and one fp8 matmul
  runs (`torch._scaled_mm`, row-wise scales). Measured on CPU (`benchmarks/bench_fp8.py`, latents against bf16):
  every layer scaled has 2.3-2.6x the weight-only error, most of it from the patch projections and the MLPs, so
  it runs only on the media tower's attention projections and MLPs (the FLOPs), first and last layer excluded
  (`scaled_layer`): 1.7-1.9x the weight-only error.
  Linears that read the same input (q, k and v; an MLP's gate and up) quantize it once (`fp8.shared_quantized`), and
  on a GPU with Triton the quantization (row amax, divide, cast) runs as one compiled kernel.
Weight memory is about half of bf16 either way. The time embedder stays fp32, and the action head's per-domain
tables (embedding tables used as weight matrices) stay in full precision.
"""

import logging

import torch
import torch.nn.functional as F
from torch import nn

from ..devices import facts
from ..errors import InputError
from .files import Dense
from .format import replace_linears
from .fp8 import FP8, FP8_MAX, shared_quantized

# Kept in full precision: the time embedder (fp32 by design), and the action head's per-domain tables, which are
# used as weight matrices, not looked up.
KEEP = ("time_embedder", "action_proj_")
MODES = ("fp8", "fp8_scaled")
log = logging.getLogger(__name__)


def per_row_fp8(weight: torch.Tensor) -> tuple[nn.Parameter, nn.Parameter]:
    """(fp8 values, float32 scale per row) of a 2-D weight: each row's largest magnitude maps to 448."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / FP8_MAX).clamp(min=1e-12)
    return nn.Parameter((w / scale[:, None]).to(FP8), requires_grad=False), nn.Parameter(scale, requires_grad=False)


class Fp8Linear(nn.Module):
    """A full-precision linear's weight as fp8 with a scale per row, upcast per forward (or, `scaled`, one fp8 matmul
    with the activations quantized per token)."""

    def __init__(self, linear: nn.Linear, scaled: bool = False):
        super().__init__()
        self.weight, self.scale = per_row_fp8(linear.weight.data)
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.scaled = scaled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a host's memory manager may leave this layer in CPU memory: its fp8 bytes come over at use
        weight, scale = self.weight.to(x.device, non_blocking=True), self.scale.to(x.device, non_blocking=True)
        bias = None if self.bias is None else self.bias.to(x.device, x.dtype)
        if self.scaled and self.in_features % 16 == 0 and self.out_features % 16 == 0:
            return scaled_fp8_linear(x, weight, scale, bias)
        return F.linear(x, weight.to(x.dtype) * scale.to(x.dtype)[:, None], bias)


def scaled_fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias) -> torch.Tensor:
    """x @ (weight * scale).T with x quantized to fp8 per row: one fp8 matmul (Hopper and newer GPUs).

    The output is bf16 whatever the activations' dtype: CUDA's row-wise scaled matmul produces bf16 only (fp16 and
    fp32 outputs are refused), so other dtypes are cast afterwards."""
    x8, x_scale = shared_quantized(x)
    out = torch._scaled_mm(x8, weight.t(), scale_a=x_scale, scale_b=scale.float()[None, :], out_dtype=torch.bfloat16)
    out = out.to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], -1)


def scaled_fp8_available(device: torch.device) -> bool:
    """Row-wise scaled fp8 matmuls: CUDA GPUs where cuBLAS runs them (compute capability 9.0 and newer but 12.x,
    probed once per device), and the CPU (slow there: for checking the arithmetic)."""
    return facts(device).fp8_rowwise


def check_mode(quantize: str | None, device: torch.device) -> str | None:
    """The mode a load runs: an unknown quantize value is refused before loading; fp8_scaled on a device without
    row-wise scaled fp8 matmuls (A100, RTX 30xx and 40xx, RTX 50xx whose cuBLAS refuses them) runs weight-only fp8,
    the same memory, with a note."""
    if quantize not in (None, *MODES):
        raise InputError(f"quantize must be None, 'fp8' or 'fp8_scaled', got {quantize!r}")
    if quantize == "fp8_scaled" and not scaled_fp8_available(device):
        record = facts(device)
        card = f" (compute capability {record.capability[0]}.{record.capability[1]})" if record.capability else ""
        official = (" NVIDIA's official FP8 checkpoints (tensorwise scales) do run their fp8 matmuls here." if
                    record.fp8_tensorwise else "")
        log.warning("quantize='fp8_scaled' needs row-wise scaled fp8 matmuls, which %s%s does not run; loading "
                    "weight-only fp8 instead (the same memory).%s", device, card, official)
        return "fp8"
    return quantize


def scaled_layer(name: str, num_layers: int) -> bool:
    """Whether the linear `name` runs scaled under fp8_scaled: the media tower's attention projections and MLPs
    of every layer but the first and the last (the text tower runs once per prompt, and the patch and head
    projections cost the most precision for the fewest FLOPs)."""
    parts = name.split(".")
    if parts[0] != "layers" or parts[1] in ("0", str(num_layers - 1)):
        return False
    return "_moe_gen." in name or ".add_" in name or ".to_add_out" in name


def quantize_fp8(model: nn.Module, mode: str = "fp8") -> None:
    """Replace every nn.Linear and nn.Embedding of `model` (except KEEP) by its fp8 form, one at a time, in place.

    `mode` "fp8_scaled": the linears `scaled_layer` names run scaled fp8 matmuls instead of upcasting."""
    num_layers = len(getattr(model, "layers", ()))

    def fp8(name: str, module: nn.Module) -> nn.Module | None:
        if name.startswith(KEEP):
            return None
        if isinstance(module, nn.Embedding):
            return Fp8Embedding(module)
        return Fp8Linear(module, mode == "fp8_scaled" and scaled_layer(name, num_layers))

    replace_linears(model, fp8, (nn.Linear, nn.Embedding))


class Fp8Embedding(nn.Module):
    """Token embeddings with one scale per row (per token), upcast on lookup."""

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        self.weight, self.scale = per_row_fp8(embedding.weight.data)
        self.dtype = embedding.weight.dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight.view(torch.uint8)[ids].view(FP8)  # gathered as bytes: torch 2.7's CPU cannot index fp8
        return rows.to(self.dtype) * self.scale[ids].to(self.dtype)[:, None]


class LocalFp8(Dense):
    """A dense checkpoint read, then each linear and embedding made fp8 in place (`quantize_fp8`)."""

    def __init__(self, folder, mode: str):
        super().__init__(folder)
        self.name = self.mode = mode

    def describe(self) -> str:
        how = "scaled fp8 matmuls in the media blocks" if self.mode == "fp8_scaled" else "weight-only"
        return f"fp8 made at load ({how})"

    def read(self, model: nn.Module, dtype: torch.dtype, device: torch.device, rename, keep_fp32=()) -> None:
        super().read(model, dtype, device, rename, keep_fp32)
        quantize_fp8(model, self.mode)

    def resident_bytes(self, name: str, layer: nn.Module) -> int | None:
        if name.startswith(KEEP):
            return None
        rows, columns = layer.weight.shape
        return rows * columns + rows * 4  # fp8 values and a float32 scale per row
