"""fp8 (float8_e4m3fn) arithmetic both fp8 formats use: activations quantized per row (local fp8's scaled matmuls) or
by a calibrated tensorwise scale (official FP8's W8A8), each activation quantized once for every linear that reads it.
"""

import functools
import weakref

import torch

from ..devices import facts

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448


def quantize_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [N, in] -> (fp8 rows, float32 scale [N, 1]): each row's largest magnitude maps to 448."""
    x_scale = (rows.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)
    return (rows.float() / x_scale).to(FP8), x_scale


def quantize_static(rows: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """Activations [N, in] -> fp8 by a static tensorwise scale, rounded once."""
    return (rows.float() / input_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def rounded_per_head(x: torch.Tensor, heads: int) -> torch.Tensor:
    """x [N, H, D] rounded through e4m3 with one scale (amax / 448) per group of H / `heads` heads, back in x's dtype:
    what an FP8 attention kernel reads with per-head descales (torch's experimental FA3 path,
    `_scaled_dot_product_attention_quantized`: one per key/value head, the query heads of a group sharing theirs)."""
    n, h, d = x.shape
    groups = x.float().view(n, heads, h // heads, d)
    scale = (groups.abs().amax(dim=(0, 2, 3), keepdim=True) / FP8_MAX).clamp(min=1e-12)
    return ((groups / scale).to(FP8).float() * scale).view(n, h, d).to(x.dtype)


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
