"""NVFP4 weights: ModelOpt's NVFP4 export (the layout diffusers 0.42.1 reads for BFL checkpoints in `quantizers/bfl`).

Each quantized linear stores `weight` uint8 [out, in/2] (two E2M1 values a byte, the even element in the low nibble),
`weight_scale` float8_e4m3fn [out, in/16] (one scale per 16 values), `weight_scale_2` float32 (the global scale:
the weight's amax / (6 x 448)) and, where ModelOpt calibrated the activations, `input_scale` float32 (their amax /
(6 x 448)). What the files are is declared as `modelopt.read_quantization` reads it (quant_algo "NVFP4"), or found
in the headers. A missing `weight_scale_2`, block scales of another shape or dtype, a scale beside a weight that is not
packed, any other quantization tensor and a quantized linear the ignore list names are refused by name from the
headers, before any weight is read, in whichever tower (and the Reasoner's head) the export quantized.

The weights stay packed in memory: 4.5 bits a weight with their block scales, two float32 numbers a layer. Two ways
to run a layer, as the step policy says (`precision`):
- W4A16 (everywhere): the layer's weight expanded into the compute dtype for its forward, as diffusers'
  `dequantize_nvfp4` computes it (the E2M1 value times its block scale times the global scale in float32, rounded
  once), a slice of rows at a time (`format.slice_values`), never the whole model at once;
- W4A4 (native) where the GPU and torch run FP4 matmuls (compute capability 10.x / 12.x and torch's
  float4_e2m1fn_x2, a probe at load: `devices.facts(...).fp4`) and the file has the activations' scale: the
  activations quantized to NVFP4 as ModelOpt quantizes them (block scales over the static `input_scale`), one
  block-scaled FP4 matmul (`torch._scaled_mm`, scales in cuBLAS's 128 x 4 tiles), both global scales after it.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..devices import FP4, facts
from ..errors import CheckpointError
from .files import load_weights
from .format import ExpandingLinear, replace_linears, slice_values
from .fp8 import FP8, FP8_MAX
from .modelopt import QUANTIZATION_TENSOR
from .precision import runs_native

BLOCK = 16  # values per block scale
E2M1_MAX = 6.0
ROUNDING = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # midpoints between E2M1 magnitudes
TIES_UP = (0.75, 1.75, 3.5)  # midpoints that round to the even code above them
SCALES = {"weight_scale": ("F8_E4M3", True), "weight_scale_2": ("F32", True), "input_scale": ("F32", False)}
EXPANDED_BYTES = 20  # per value of a slice being expanded: the codes and their integer steps, the values, the product
WORKING_BYTES = 17 + 6  # per value of a W4A4 slice: its rows quantized (float32 copies, codes; 16.7 measured), the
# matmul's bf16 product and its float32 scaling


def e2m1(codes: torch.Tensor) -> torch.Tensor:
    """The E2M1 values (0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 the sign) of 4-bit codes in float32, exactly. Computed, not
    looked up: a table would be a host copy per call eagerly, and a constant compiled code cannot take."""
    magnitude = codes & 7
    exponent = magnitude >> 1
    twice = torch.where(exponent == 0, magnitude, (2 + (magnitude & 1)) << (exponent.clamp(min=1) - 1))
    values = twice.float() * 0.5
    return torch.where(codes >= 8, -values, values)


def dequantize(weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
               dtype: torch.dtype) -> torch.Tensor:
    """The packed `weight` [out, in/2] in `dtype` [out, in]: each value times its block scale times the global scale
    in float32, rounded once to `dtype` (diffusers' `dequantize_nvfp4`), a slice of rows at a time."""
    rows, columns = weight.shape[0], weight.shape[1] * 2
    out = torch.empty(rows, columns, dtype=dtype, device=weight.device)
    step = max(1, slice_values(weight.device) // columns)
    for start in range(0, rows, step):
        packed = weight[start : start + step]
        values = e2m1(torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(len(packed), -1, BLOCK))
        scale = weight_scale[start : start + step].float() * weight_scale_2
        out[start : start + step] = (values * scale[..., None]).reshape(len(packed), columns)
    return out


def quantize(rows: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations [N, in] -> (packed E2M1 [N, in/2] uint8, block scales [N, in/16] float8_e4m3fn) over a static
    global scale, as ModelOpt's `NVFP4QTensor.quantize` makes them: each block's amax / (6 x global) rounded to e4m3
    (a zero block's scale 1, clamped to [2^-9, 448]), the values divided by their whole scale and rounded to the
    nearest E2M1 value (ties to even)."""
    blocks = rows.float().reshape(rows.shape[0], -1, BLOCK)
    scale = blocks.abs().amax(dim=-1) / (E2M1_MAX * global_scale)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale).clamp(2**-9, FP8_MAX).to(FP8)
    scaled = blocks / (scale.float() * global_scale)[..., None]
    magnitude = scaled.abs()
    codes = sum((magnitude > midpoint).to(torch.uint8) for midpoint in ROUNDING)  # ModelOpt's searchsorted
    codes = codes + sum((magnitude == midpoint).to(torch.uint8) for midpoint in TIES_UP)
    codes = (codes | ((scaled < 0).to(torch.uint8) << 3)).reshape(rows.shape[0], -1)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), scale


def swizzled(scales: torch.Tensor) -> torch.Tensor:
    """Block scales [rows, in/16] in the layout cuBLAS's block-scaled matmuls read: tiles of 128 rows x 4 scales (the
    matrix padded to whole tiles), each stored as 32 rows of the 4 x 4 scales of rows r, r + 32, r + 64, r + 96."""
    rows, columns = scales.shape
    tiles_down, tiles_across = -(-rows // 128), -(-columns // 4)
    padded = F.pad(scales.view(torch.uint8), (0, tiles_across * 4 - columns, 0, tiles_down * 128 - rows))
    tiles = padded.reshape(tiles_down, 128, tiles_across, 4).permute(0, 2, 1, 3)
    return tiles.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1).view(FP8)


def fp4_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
               input_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """W4A4, a slice of rows at a time (each slice's float32 temporaries bounded, `WORKING_BYTES`): the rows quantized
    to NVFP4 by the static `input_scale`, one FP4 matmul with both sets of block scales (bf16 out, as CUDA's
    block-scaled matmul gives it), then the two global scales in float32, rounded once into the output."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch.empty(rows.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    weight_blocks, alpha = swizzled(weight_scale), input_scale * weight_scale_2
    step = max(1, slice_values(x.device) // max(rows.shape[1], out.shape[1]))
    for start in range(0, rows.shape[0], step):
        packed, scales = quantize(rows[start : start + step], input_scale)
        product = torch._scaled_mm(packed.view(FP4), weight.view(FP4).t(), swizzled(scales), weight_blocks,
                                   out_dtype=torch.bfloat16)
        out[start : start + step] = product.float().mul_(alpha)
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], -1)


class NVFP4Linear(ExpandingLinear):
    """A linear whose weight stays packed NVFP4 (a shell built on the meta device); `calibrated`: with the activations'
    `input_scale`, which W4A4 quantizes them by, for a linear of `pathway`."""

    kept_float32 = ("weight_scale_2", "input_scale")

    def __init__(self, linear: nn.Linear, calibrated: bool = False, pathway: str | None = None):
        super().__init__()
        out_features, in_features = linear.weight.shape

        def empty(*shape, dtype=torch.float32):
            return nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"), requires_grad=False)

        self.weight = empty(out_features, in_features // 2, dtype=torch.uint8)
        self.weight_scale = empty(out_features, in_features // BLOCK, dtype=FP8)
        self.weight_scale_2 = empty()
        self.input_scale = empty() if calibrated else None
        self.bias = linear.bias
        self.in_features, self.out_features, self.pathway = in_features, out_features, pathway

    def dequantized(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        # a host's memory manager may leave this layer in CPU memory: its packed bytes come over at use
        return dequantize(self.weight.to(device, non_blocking=True), self.weight_scale.to(device, non_blocking=True),
                          self.weight_scale_2.to(device), dtype)

    def runs_natively(self, device: torch.device) -> bool:
        """W4A4 now: the activations' scale calibrated, the step policy native for this pathway, FP4 matmuls on
        `device` and the shapes they take."""
        return (self.input_scale is not None and runs_native(self.pathway) and facts(device).fp4
                and self.in_features % 32 == 0 and self.out_features % 16 == 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.device, x.dtype)
        if self.runs_natively(x.device):
            return fp4_linear(x, self.weight.to(x.device, non_blocking=True),
                              self.weight_scale.to(x.device, non_blocking=True), self.weight_scale_2.to(x.device),
                              self.input_scale.to(x.device), bias)
        return F.linear(x, self.expanded_weight(x), bias)


class NVFP4:
    """The format of an NVFP4 folder (`quantization` None: found in the headers, undeclared)."""

    name = "NVFP4"

    def __init__(self, folder, headers: dict, quantization=None):
        self.folder, self.headers, self.quantization = folder, headers, quantization

    def describe(self) -> str:
        return "ModelOpt NVFP4 (undeclared)" if self.quantization is None else self.quantization.describe()

    def quantized(self, rename) -> dict[str, str]:
        """{the model's linear: the file's key prefix} of every packed weight `rename` reads, each checked; any other
        quantization tensor it reads refused by name."""
        found = {}
        for key, entry in self.headers.items():
            prefix, _, leaf = key.rpartition(".")
            if rename(key) is None:
                continue
            if leaf in SCALES:
                weight = self.headers.get(f"{prefix}.weight")
                if weight is None or weight["dtype"] != "U8":
                    raise CheckpointError(f"{key}: an NVFP4 scale beside a weight that is not packed NVFP4 (uint8); "
                                          "the file mixes formats the pack does not read")
            elif leaf == "weight" and entry["dtype"] == "U8":
                found[rename(key).removesuffix(".weight")] = prefix
            elif QUANTIZATION_TENSOR.search(key):
                raise CheckpointError(f"{key}: a quantization tensor this pack does not read (it runs NVFP4 weights "
                                      "with `weight_scale`, `weight_scale_2` and `input_scale`; AWQ pre-scales, K/V "
                                      "scales and other formats are not supported)")
        for name, prefix in found.items():
            self._check(name, prefix)
        return found

    def _check(self, name: str, prefix: str) -> None:
        rows, packed = self.headers[f"{prefix}.weight"]["shape"]
        for leaf, (dtype, required) in SCALES.items():
            entry = self.headers.get(f"{prefix}.{leaf}")
            if entry is None:
                if required:
                    raise CheckpointError(f"{prefix}.weight is packed NVFP4 but {prefix}.{leaf} is missing; the "
                                          "export is incomplete")
                continue
            if entry["dtype"] != dtype:
                raise CheckpointError(f"{prefix}.{leaf} is stored as {entry['dtype']}, not {dtype} (ModelOpt's NVFP4 "
                                      "layout)")
            blocks = leaf == "weight_scale"
            if (entry["shape"] != [rows, packed * 2 // BLOCK]) if blocks else (math.prod(entry["shape"]) != 1):
                needed = f"[{rows}, {packed * 2 // BLOCK}] (one per {BLOCK} values)" if blocks else "one number"
                raise CheckpointError(f"{prefix}.{leaf} has shape {entry['shape']}; NVFP4 needs {needed} for a weight "
                                      f"of {rows} x {packed * 2}")
        if self.quantization is not None and self.quantization.ignores(name):
            raise CheckpointError(f"{prefix}.weight is stored in NVFP4, but the checkpoint's quantization config lists "
                                  "it as ignored (left in full precision); the files and the config come from "
                                  "different exports")

    def build(self, model: nn.Module, rename, pathway_of) -> None:
        found = self.quantized(rename)

        def shell(name: str, linear: nn.Module) -> nn.Module | None:
            if name not in found:
                return None
            rows, packed = self.headers[f"{found[name]}.weight"]["shape"]
            if [rows, packed * 2] != list(linear.weight.shape) or packed * 2 % BLOCK:
                raise CheckpointError(f"{found[name]}.weight packs a {rows} x {packed * 2} weight, the config implies "
                                      f"{list(linear.weight.shape)} (in {BLOCK}-value blocks); the weights do not "
                                      "belong to this config.json")
            return NVFP4Linear(linear, f"{found[name]}.input_scale" in self.headers, pathway_of(name))

        replace_linears(model, shell)

    def read(self, model: nn.Module, dtype: torch.dtype, device: torch.device, rename, keep_fp32=()) -> None:
        load_weights(model, self.folder, dtype, device, rename=rename, keep_fp32=keep_fp32,
                     convert=lambda key, tensor: tensor.reshape(()) if key.endswith(("_scale_2", "input_scale"))
                     else tensor)

    def resident_bytes(self, name: str, layer: nn.Module) -> int | None:
        if not isinstance(layer, nn.Linear) or self.quantization is None or self.quantization.ignores(name):
            return None
        return layer.weight.numel() // 2 + layer.weight.numel() // BLOCK + 2 * 4  # values, block scales, two float32

    def step_bytes(self, config, tokens: int, dtype: torch.dtype, device) -> dict[str, int]:
        """The largest weight expanded (W4A16: the MLP's, in the compute dtype, with a slice of float32 temporaries);
        where FP4 matmuls run, a slice of rows quantized and multiplied (`fp4_linear`); the larger of the two."""
        device = device or torch.device("cpu")
        b = torch.finfo(dtype).bits // 8
        expanded = config.hidden_size * config.intermediate_size * b + EXPANDED_BYTES * slice_values(device)
        quantized = WORKING_BYTES * slice_values(device) if facts(device).fp4 else 0
        return {"NVFP4 weights at work": max(expanded, quantized)}
