"""fp8 weights: float8_e4m3fn with one scale per output channel, made at load time from bf16 checkpoints
(or read from ModelOpt fp8 checkpoints, whose per-tensor scale is broadcast to the rows; those with a static input
scale run as their checkpoint says, see `modelopt_fp8`).

Each quantized linear keeps `weight` [out, in] in float8_e4m3fn and `scale` [out] in float32
(amax of the row / 448, the format's largest value). Two ways to run it:
- weight-only (`quantize="fp8"`, the default): the forward upcasts the weight to the activations' dtype,
  multiplies by the scale and runs a normal matmul, so the arithmetic is the bf16 model's with rounded weights.
- scaled (`quantize="fp8_scaled"`, opt-in): the activations are quantized to fp8 per token too and one fp8 matmul
  runs (`torch._scaled_mm`, row-wise scales). Measured on CPU (`benchmarks/bench_fp8.py`, latents against bf16):
  every layer scaled has 2.3-2.6x the weight-only error, most of it from the patch projections and the MLPs, so
  it runs only on the media tower's attention projections and MLPs (the FLOPs), first and last layer excluded
  (`scaled_layer`): 1.7-1.9x the weight-only error.
  Linears that read the same input (q, k and v; an MLP's gate and up) quantize it once (`SharedQuantized`), and
  on a GPU with Triton the quantization (row amax, divide, cast) runs as one compiled kernel.
Weight memory is about half of bf16 either way. The time embedder stays fp32, and the action head's per-domain
tables (embedding tables used as weight matrices) stay in full precision.
"""

import functools
import logging
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from .devices import facts
from .errors import CheckpointError, InputError
from .modelopt_fp8 import (FP8, FP8_MAX, Quantization, ScaleLayout, quantize_static, runs_w8a8, scale_layout,
                           w8a8_linear)

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
    def __init__(self, linear: nn.Linear, stored: bool = False, calibrated: bool = False, pathway: str | None = None):
        """From a full-precision linear, or (`stored`) an empty shell for fp8 weights and scales read from a
        pre-quantized checkpoint (official FP8: a per-tensor scale, broadcast to the rows; `calibrated`: with the
        static `input_scale` that W8A8 quantizes the activations by, for a linear of `pathway`)."""
        super().__init__()
        if stored:
            shape = linear.weight.shape
            self.weight = nn.Parameter(torch.empty(shape, dtype=FP8, device="meta"), requires_grad=False)
            self.scale = nn.Parameter(torch.empty(shape[0], device="meta"), requires_grad=False)
        else:
            self.weight, self.scale = per_row_fp8(linear.weight.data)
        self.input_scale = nn.Parameter(torch.empty((), device="meta"), requires_grad=False) if calibrated else None
        self.input_key = None  # input_scale as a number (`remember_input_ranges`): equal scales share a quantization
        self.pathway = pathway
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    scaled = False  # one fp8 matmul with activations quantized per token, instead of upcasting the weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a host's memory manager may leave this layer in CPU memory: its fp8 bytes come over at use
        weight, scale = self.weight.to(x.device, non_blocking=True), self.scale.to(x.device, non_blocking=True)
        bias = None if self.bias is None else self.bias.to(x.device, x.dtype)
        if self.input_scale is not None and runs_w8a8(self.pathway):  # tensorwise scales: every row holds the same
            input_scale = self.input_scale.to(x.device)
            x8 = static_quantized(x, input_scale, key=self.input_key)
            return w8a8_linear(x, weight, scale[0].float(), input_scale, bias, x8)
        if self.scaled and self.in_features % 16 == 0 and self.out_features % 16 == 0:
            return scaled_fp8_linear(x, weight, scale, bias)
        return F.linear(x, weight.to(x.dtype) * scale.to(x.dtype)[:, None], bias)


def quantize_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [N, in] -> (fp8 rows, float32 scale [N, 1]): each row's largest magnitude maps to 448."""
    x_scale = (rows.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)
    return (rows.float() / x_scale).to(FP8), x_scale


@functools.cache
def fused_quantize_rows():
    """`quantize_rows` as one kernel (torch.compile): eager runs it as four passes over the activations."""
    return torch.compile(quantize_rows, dynamic=True)


@functools.cache
def fused_quantize_static():
    """`quantize_static` as one kernel (torch.compile)."""
    return torch.compile(quantize_static, dynamic=True)


class SharedQuantized:
    """The fp8 form of the last activation quantized, kept while that activation lives: q, k and v (and an MLP's
    gate and up) read the same tensor, which is then quantized once, not three times; on a GPU with Triton in one
    compiled kernel. Per row (fp8_scaled's dynamic scales), or by a static scale (`*scale`, official FP8's W8A8:
    shared only between linears whose calibrated ranges are equal, the same `key`)."""

    def __init__(self, quantize, fused):
        self.quantize, self.fused = quantize, fused
        self.entry = None  # (weak reference to the activation, key, its quantization)

    def __call__(self, x: torch.Tensor, *scale: torch.Tensor, key: float | None = None):
        rows = x.reshape(-1, x.shape[-1])
        if torch.compiler.is_compiling():  # inside a compiled block the compiler shares and fuses it itself
            return self.quantize(rows, *scale)
        shared = key is not None or not scale  # a static scale of unknown value shares nothing
        entry = self.entry
        if shared and entry is not None and entry[0]() is x and entry[1] == key:
            return entry[2]
        device = facts(x.device)  # one fused kernel needs Triton, which Windows installs often lack: eager there
        result = (self.fused() if device.cuda and device.triton else self.quantize)(rows, *scale)
        if shared:
            self.entry = (weakref.ref(x, self._drop), key, result)
        return result

    def _drop(self, ref) -> None:
        if self.entry is not None and self.entry[0] is ref:
            self.entry = None


# (the fused kernels are compiled on first use, not at import)
shared_quantized = SharedQuantized(quantize_rows, lambda: fused_quantize_rows())
static_quantized = SharedQuantized(quantize_static, lambda: fused_quantize_static())


def remember_input_ranges(model: nn.Module) -> None:
    """Note each calibrated fp8 linear's input scale as a number, once after loading (a host read per linear, never in
    a step): linears reading one activation with equal scales (q, k and v were calibrated on the same inputs) then
    share its quantization."""
    for m in model.modules():
        if isinstance(m, Fp8Linear) and m.input_scale is not None:
            m.input_key = float(m.input_scale)


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
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if full.startswith(KEEP):
                continue
            if isinstance(child, nn.Linear):
                setattr(module, child_name, Fp8Linear(child))
                getattr(module, child_name).scaled = mode == "fp8_scaled" and scaled_layer(full, num_layers)
            elif isinstance(child, nn.Embedding):
                setattr(module, child_name, Fp8Embedding(child))


class Fp8Embedding(nn.Module):
    """Token embeddings with one scale per row (per token), upcast on lookup."""

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        self.weight, self.scale = per_row_fp8(embedding.weight.data)
        self.dtype = embedding.weight.dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.weight.view(torch.uint8)[ids].view(FP8)  # gathered as bytes: torch 2.7's CPU cannot index fp8
        return rows.to(self.dtype) * self.scale[ids].to(self.dtype)[:, None]


def expect_stored_fp8(model: nn.Module, headers: dict, rename, pathway_of=lambda name: None,
                      quantization: Quantization | None = None) -> ScaleLayout:
    """Make fp8 shells (built on the meta device) of the linears whose weight the checkpoint (its safetensors
    `headers`, keys mapped by `rename`) stores in fp8, with a static input scale where it has one (official FP8);
    `pathway_of(name)` says which pathway's precision a linear follows. Returns how `load_weights` reads the scales
    (`rename` and `convert`). A linear the checkpoint's ignore list names is refused by name."""
    layout = scale_layout(headers, rename)  # every key mapped first: what cannot be read is refused now
    calibrated = {name for name in layout.names.values() if name is not None and name.endswith(".input_scale")}
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and f"{full}.weight" in layout.fp8_weights:
                if quantization is not None and quantization.ignores(full):
                    raise CheckpointError(f"{full}.weight is stored in fp8, but the checkpoint's quantization config "
                                          "lists it as ignored (left in full precision); the files and the config "
                                          "come from different exports")
                shell = Fp8Linear(child, stored=True, calibrated=f"{full}.input_scale" in calibrated,
                                  pathway=pathway_of(full))
                setattr(module, child_name, shell)
    return layout


def weight_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
