"""NVIDIA's official FP8 checkpoints (Hub revision "fp8"), in both layouts NVIDIA's tools write.

Each quantized linear stores `weight` in float8_e4m3fn with two tensorwise float32 scales beside it (`scale_layout`):
- ModelOpt's unified HF export (NVIDIA's Cosmos3 FP8 exporter, what vLLM and cosmos-framework load): `weight_scale`
  (the weight's amax / 448) and `input_scale` (the calibrated activation amax / 448);
- ModelOpt's `save_pretrained` buffers: `weight_quantizer._scale` (amax / 448), `weight_quantizer._amax` and
  `input_quantizer._amax` (the activation range, divided by 448 when read: the same float32 division both produce).
Where a folder holds both for one linear, the unified export's scales are read and the buffers skipped. Scales may
sit in any shard of the index. Any other quantization tensor (SmoothQuant pre-scales, output or K/V scales, second-
level scales) is refused by name, as are per-channel or block scales. What the files are is declared as
`modelopt.read_quantization` reads it; a linear the ignore list names must not be stored in fp8.

Two ways to run a calibrated linear, as the step policy says (`precision`):
- W8A8 (the checkpoint's native arithmetic): the activations quantized to fp8 with the static input scale, one fp8
  matmul with both tensorwise scales (`torch._scaled_mm` on GPUs with fp8 matmuls, an exact float32 emulation
  elsewhere);
- W8A16 (higher precision): the fp8 weight times its scale in the activations' dtype, a normal matmul.
Weight-only files (no input ranges) run W8A16.

diffusers 0.42.1 (`pipelines/cosmos/mixed_precision.py`) labels the attention projections of the two pathways the
other way round (its "generation" set holds the text tower's `to_q/k/v/out`, its "reasoner" set the media tower's
`add_*`). The pack follows the policy's meaning: the media pathway switches per step, the text pathway (encoded once
per prompt and cached) follows "reasoner".
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..devices import facts
from ..errors import CheckpointError
from .files import load_weights
from .format import replace_linears
from .fp8 import FP8, FP8_MAX, quantize_static, static_quantized
from .modelopt import QUANTIZATION_TENSOR
from .precision import runs_native

# Each scale key's suffix beside `<m>`, and the pack's name for it on the ModelOptFp8Linear (None: not needed).
UNIFIED_SCALES = {".weight_scale": ".scale", ".input_scale": ".input_scale"}
SAVED_SCALES = {".weight_quantizer._scale": ".scale", ".input_quantizer._amax": ".input_scale",
                ".weight_quantizer._amax": None}  # the weight's range: `_scale` is it divided by 448


class ModelOptFp8Linear(nn.Module):
    """An fp8 weight with its tensorwise scale, read from an official FP8 checkpoint (a shell built on the meta
    device); `calibrated`: with the static `input_scale` that W8A8 quantizes the activations by, for a linear of
    `pathway`."""

    kept_float32 = ("scale", "input_scale")

    def __init__(self, linear: nn.Linear, calibrated: bool = False, pathway: str | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(linear.weight.shape, dtype=FP8, device="meta"), requires_grad=False)
        self.scale = nn.Parameter(torch.empty((), device="meta"), requires_grad=False)
        self.input_scale = nn.Parameter(torch.empty((), device="meta"), requires_grad=False) if calibrated else None
        self.input_key = None  # input_scale as a number (`remember_input_ranges`): equal scales share a quantization
        self.pathway = pathway
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a host's memory manager may leave this layer in CPU memory: its fp8 bytes come over at use
        weight, scale = self.weight.to(x.device, non_blocking=True), self.scale.to(x.device, non_blocking=True)
        bias = None if self.bias is None else self.bias.to(x.device, x.dtype)
        if self.input_scale is not None and runs_native(self.pathway):
            input_scale = self.input_scale.to(x.device)
            x8 = static_quantized(x, input_scale, key=self.input_key)
            return w8a8_linear(x, weight, scale.float(), input_scale, bias, x8)
        return F.linear(x, weight.to(x.dtype) * scale.to(x.dtype), bias)


def remember_input_ranges(model: nn.Module) -> None:
    """Note each calibrated fp8 linear's input scale as a number, once after loading (a host read per linear, never in
    a step): linears reading one activation with equal scales (q, k and v were calibrated on the same inputs) then
    share its quantization."""
    for m in model.modules():
        if isinstance(m, ModelOptFp8Linear) and m.input_scale is not None:
            m.input_key = float(m.input_scale)


def w8a8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor,
                bias: torch.Tensor | None, x8: torch.Tensor | None = None) -> torch.Tensor:
    """x @ (weight * weight_scale).T with x quantized to fp8 by the static `input_scale` (both scales tensorwise,
    float32 scalars): ModelOpt's W8A8. `x8`: x already quantized (rows [N, in]). Where a GPU has no fp8 matmul
    (A100, RTX 30xx, ROCm) the same fp8 products run as a bf16 matmul (fp8 values are exact in bf16; GPUs accumulate
    it in fp32), far cheaper there than a float32 one; float32 activations, and the CPU (whose bf16 matmuls are
    slower than its float32 ones unless it has AMX), keep the float32 products: the exact reference."""
    x8 = quantize_static(x.reshape(-1, x.shape[-1]), input_scale) if x8 is None else x8
    device = facts(x.device)
    if device.fp8_tensorwise:
        fused_bias = bias if bias is not None and x.dtype != torch.float32 else None  # fp32 outputs take no bias
        # fast accumulation, as NVIDIA's FP8 path runs its GEMMs (torchao's Float8MMConfig(use_fast_accum=True)) and
        # Transformer Engine its forward ones: Hopper's fp8 tensor cores then skip the periodic fp32 promotion
        out = torch._scaled_mm(x8, weight.t(), scale_a=input_scale, scale_b=weight_scale, bias=fused_bias,
                               out_dtype=x.dtype, use_fast_accum=True)
        if bias is not None and fused_bias is None:
            out = out + bias
    else:
        products = torch.bfloat16 if device.type == "cuda" and x.dtype != torch.float32 else torch.float32
        out = (F.linear(x8.to(products), weight.to(products)).float() * (input_scale * weight_scale)).to(x.dtype)
        if bias is not None:
            out = out + bias
    return out.reshape(*x.shape[:-1], -1)


@dataclass(frozen=True)
class ScaleLayout:
    """How one weight folder is read (`scale_layout`): every key's parameter name (None: not read), the fp8 weights
    among them, and `convert`, which turns a read tensor into its parameter's value (an activation range into its
    scale; a one-value scale into a number)."""

    names: dict[str, str | None]
    fp8_weights: set[str]

    def rename(self, key: str) -> str | None:
        return self.names[key]

    @staticmethod
    def convert(key: str, tensor: torch.Tensor) -> torch.Tensor:
        if key.endswith(".input_quantizer._amax"):
            return tensor.float().reshape(()) / FP8_MAX
        return tensor.reshape(()) if key.endswith("_scale") else tensor  # (checked: one number)


def scale_layout(headers: dict, rename) -> ScaleLayout:
    """Every key of a weight folder (its safetensors `headers`) mapped by `rename`, its FP8 scales in either layout,
    the unified export's winning where a linear has both. An unknown quantization tensor, a scale that is not one
    number or one beside a weight not stored in fp8 is refused by name, before any weight is read."""
    unified = {key[: -len(suffix)] for key in headers for suffix in UNIFIED_SCALES if key.endswith(suffix)}

    def scale_name(key: str) -> tuple[bool, str | None]:
        """(whether `key` is a scale of either layout, the parameter it loads into or None)."""
        for layout in (UNIFIED_SCALES, SAVED_SCALES):
            for suffix, target in layout.items():
                if key.endswith(suffix):
                    base = key[: -len(suffix)]
                    if layout is SAVED_SCALES and base in unified:
                        return True, None  # the unified export's scales are read for this linear
                    name = rename(base + ".weight")
                    return True, None if name is None or target is None else name.removesuffix(".weight") + target
        return False, None

    names, scales = {}, {}
    for key, entry in headers.items():
        is_scale, names[key] = scale_name(key)
        if is_scale:
            if names[key] is not None:
                scales[key] = entry
        elif QUANTIZATION_TENSOR.search(key):
            raise CheckpointError(f"{key}: a quantization tensor this pack does not read (it runs tensorwise FP8 "
                                  "weights and activations with `weight_scale` / `input_scale`, or ModelOpt's "
                                  "`_scale` / `_amax` buffers; SmoothQuant pre-scales, output and K/V scales and "
                                  "other formats are not supported)")
        else:
            names[key] = rename(key)
    fp8_weights = {names[key] for key, entry in headers.items() if entry["dtype"] == "F8_E4M3"}
    for key, entry in scales.items():
        if math.prod(entry["shape"]) != 1:
            raise CheckpointError(f"{key} has shape {entry['shape']}: per-channel or block FP8 scales are not read "
                                  "(the pack runs tensorwise scales, one number per tensor)")
        if names[key].rsplit(".", 1)[0] + ".weight" not in fp8_weights:
            raise CheckpointError(f"{key}: a scale beside a weight that is not stored in float8_e4m3fn")
    return ScaleLayout(names, fp8_weights)


class ModelOptFp8:
    """The format of an official FP8 folder (`quantization` None: fp8 weights found in the headers, undeclared)."""

    name = "ModelOpt FP8"

    def __init__(self, folder, headers: dict, quantization=None):
        self.folder, self.headers, self.quantization = folder, headers, quantization

    def describe(self) -> str:
        return self.quantization.describe() if self.quantization is not None else "ModelOpt FP8 (undeclared)"

    def build(self, model: nn.Module, rename, pathway_of) -> None:
        """fp8 shells for the linears whose weight the files store in fp8, with a static input scale where they have
        one; a linear the checkpoint's ignore list names is refused by name."""
        layout = scale_layout(self.headers, rename)  # every key mapped first: what cannot be read is refused now
        calibrated = {name for name in layout.names.values() if name is not None and name.endswith(".input_scale")}

        def shell(name: str, linear: nn.Module) -> nn.Module | None:
            if f"{name}.weight" not in layout.fp8_weights:
                return None
            if self.quantization is not None and self.quantization.ignores(name):
                raise CheckpointError(f"{name}.weight is stored in fp8, but the checkpoint's quantization config "
                                      "lists it as ignored (left in full precision); the files and the config come "
                                      "from different exports")
            return ModelOptFp8Linear(linear, f"{name}.input_scale" in calibrated, pathway_of(name))

        replace_linears(model, shell)

    def read(self, model: nn.Module, dtype: torch.dtype, device: torch.device, rename, keep_fp32=()) -> None:
        layout = scale_layout(self.headers, rename)
        load_weights(model, self.folder, dtype, device, rename=layout.rename, keep_fp32=keep_fp32,
                     convert=layout.convert)
        remember_input_ranges(model)

    def resident_bytes(self, name: str, layer: nn.Module) -> int | None:
        if not isinstance(layer, nn.Linear) or self.quantization is None or self.quantization.ignores(name):
            return None
        return layer.weight.numel() + 2 * 4  # fp8 values, two float32 scales

    def step_bytes(self, config, tokens: int, dtype: torch.dtype, device) -> dict[str, int]:
        """An MLP down projection's input quantized to fp8 through two float32 copies (4.2-4.5 bytes per N x I
        measured on the virtual device); one fused kernel on a GPU with fp8 matmuls and Triton leaves its fp8 copy."""
        if self.quantization is None:
            return {}
        fused = device is not None and facts(device).fp8_tensorwise and facts(device).triton
        return {"W8A8 products": int(tokens * config.intermediate_size * (1 if fused else 4.5))}
