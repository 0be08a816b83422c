"""GGUF (ggml) quantized weights dequantized in torch, on whatever device the bytes are on.

A quantized tensor is a run of fixed-size blocks (`BLOCKS`: values per block, bytes per block). Each
block holds fp16 scales and packed integers; dequantizing is a few shifts, masks and multiplies, so
weights can stay quantized in memory and be expanded one layer at a time where the layer runs.

Every type computes in float32 with the same operation order as the `gguf` package's numpy
reference, so the results are bit-equal to it (tests/test_gguf.py checks each type on random blocks).
The float32 work runs a slice of blocks at a time (`slice_values`) and each slice is written straight into
the output in the compute dtype: the float32 temporaries stay bounded (8 MiB each on a CPU, 64 MiB on a GPU)
whatever the layer's size, where expanding a whole Nano MLP weight (50M values) at once took about five fp32
copies of it (1 GB).

Block layouts (QK_K = 256 values per K-quant super-block; "d" and "dmin" are fp16):
- Q8_0: d, 32 int8.                      Q4_0: d, 16 bytes of nibbles (value - 8).
- Q4_1: d, m, 16 bytes of nibbles.       Q5_0 / Q5_1: like Q4_0 / Q4_1 plus 32 high bits (value - 16 for Q5_0).
- Q2_K: 16 bytes of 4-bit scale/min pairs, 64 bytes of 2-bit values, d, dmin.
- Q3_K: 32 bytes of high bits, 64 bytes of 2-bit values, 12 bytes of 6-bit scales (offset 32), d.
- Q4_K: d, dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks, 128 bytes of nibbles.
- Q5_K: Q4_K's fields plus 32 bytes of high bits before the nibbles.
- Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 int8 scales, d.
"""

import math
from functools import cache

import torch

from .format import slice_values

QK_K = 256
BLOCKS = {  # type name -> (values per block, bytes per block)
    "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2),
    "Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
    "Q2_K": (QK_K, 84), "Q3_K": (QK_K, 110), "Q4_K": (QK_K, 144), "Q5_K": (QK_K, 176), "Q6_K": (QK_K, 210),
}
FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}  # stored as they are


def _fp16(b: torch.Tensor) -> torch.Tensor:
    """Two bytes per row [n, 2] -> their fp16 value as float32 [n, 1]."""
    return b.contiguous().view(torch.float16).float()


def _split(blocks: torch.Tensor, *sizes: int) -> list[torch.Tensor]:
    return list(torch.split(blocks, list(sizes), dim=1))


def _shifted(b: torch.Tensor, shifts: tuple[int, ...], view: tuple[int, ...]) -> torch.Tensor:
    """`b` viewed as `view` (an axis of size 1 for the shifts), shifted right by each of `shifts` along that axis."""
    return b.reshape(view) >> _shift_table(shifts, b.device)


@cache
def _shift_table(shifts: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The shift amounts as a tensor on `device`, made once per device: a host-to-device copy on every call
    would stall a GPU once per quantized layer per forward."""
    return torch.tensor(shifts, dtype=torch.uint8, device=device).view(1, 1, -1, 1)


def _bits(b: torch.Tensor, n: int) -> torch.Tensor:
    """Little-endian bit i of the bytes in each row [n_blocks, bytes] -> [n_blocks, 8 * bytes] (for Q5_0 / Q5_1)."""
    return (_shifted(b, tuple(range(8)), (n, -1, 1, 1)) & 1).reshape(n, -1)


def _nibbles(qs: torch.Tensor, n: int, group: int) -> torch.Tensor:
    """Groups of `group` bytes -> their low nibbles, then their high nibbles: [n, groups * 2 * group]."""
    return (_shifted(qs, (0, 4), (n, -1, 1, group)) & 0x0F).reshape(n, -1)


def _legacy(qtype: str, blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    if qtype == "Q8_0":
        d, qs = _split(blocks, 2, 32)
        return qs.contiguous().view(torch.int8).float() * _fp16(d)
    with_min = qtype in ("Q4_1", "Q5_1")
    d, m, rest = _split(blocks, 2, 2 if with_min else 0, blocks.shape[1] - (4 if with_min else 2))
    q = _nibbles(rest[:, -16:], n, 16)
    if qtype.startswith("Q5"):
        q = q | (_bits(rest[:, :4], n) << 4)
    d = _fp16(d)
    if with_min:
        return d * q.float() + _fp16(m)
    return d * (q.to(torch.int8) - (16 if qtype == "Q5_0" else 8)).float()


def _scale_min_k4(scales: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins (the top two bits of the last four are
    kept in the high bits of the first eight bytes)."""
    s = scales.reshape(n, 3, 4)
    lo_d, lo_m, hi = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([lo_d & 0x3F, (hi & 0x0F) | ((lo_d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([lo_m & 0x3F, (hi >> 4) | ((lo_m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k_quant(qtype: str, blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    if qtype == "Q2_K":
        scales, qs, d, dmin = _split(blocks, 16, 64, 2, 2)
        scale = (_fp16(d) * (scales & 0x0F).float()).view(n, 16, 1)
        low = (_fp16(dmin) * (scales >> 4).float()).view(n, 16, 1)
        q = (_shifted(qs, (0, 2, 4, 6), (n, -1, 1, 32)) & 3).reshape(n, 16, 16).float()
        return (scale * q - low).reshape(n, QK_K)
    if qtype == "Q3_K":
        hmask, qs, scales, d = _split(blocks, 32, 64, 12, 2)
        low = _shifted(scales[:, :8], (0, 4), (n, 1, 1, 8)).reshape(n, 16)
        high = _shifted(scales[:, 8:], (0, 2, 4, 6), (n, 1, 1, 4)).reshape(n, 16)
        sc = (((low & 0x0F) | ((high & 0x03) << 4)).to(torch.int8) - 32).float()
        scale = (_fp16(d) * sc).view(n, 16, 1)
        q = (_shifted(qs, (0, 2, 4, 6), (n, -1, 1, 32)) & 3).reshape(n, 16, 16)
        dropped = ((_shifted(hmask, tuple(range(8)), (n, 1, 1, 32)) & 1) ^ 1).reshape(n, 16, 16)  # bit set: no offset
        return (scale * (q.to(torch.int8) - (dropped << 2).to(torch.int8)).float()).reshape(n, QK_K)
    if qtype == "Q6_K":
        ql, qh, scales, d = _split(blocks, 128, 64, 16, 2)
        scale = (_fp16(d) * scales.contiguous().view(torch.int8).float()).view(n, 16, 1)
        low = (_shifted(ql, (0, 4), (n, -1, 1, 64)) & 0x0F).reshape(n, -1, 32)
        high = (_shifted(qh, (0, 2, 4, 6), (n, -1, 1, 32)) & 0x03).reshape(n, -1, 32)
        q = ((low | (high << 4)).to(torch.int8) - 32).reshape(n, 16, 16).float()
        return (scale * q).reshape(n, QK_K)
    # Q4_K and Q5_K
    if qtype == "Q5_K":
        d, dmin, scales, qh, qs = _split(blocks, 2, 2, 12, 32, 128)
    else:
        d, dmin, scales, qs = _split(blocks, 2, 2, 12, 128)
    sc, mn = _scale_min_k4(scales, n)
    scale = (_fp16(d) * sc.float()).view(n, 8, 1)
    low = (_fp16(dmin) * mn.float()).view(n, 8, 1)
    q = (_shifted(qs, (0, 4), (n, -1, 1, 32)) & 0x0F).reshape(n, 8, 32)
    if qtype == "Q5_K":
        q = q | ((_shifted(qh, tuple(range(8)), (n, 1, 1, 32)) & 1).reshape(n, 8, 32) << 4)
    return (scale * q.float() - low).reshape(n, QK_K)


def dequantize(data: torch.Tensor, qtype: str, shape, dtype: torch.dtype = torch.float32,
               chunk_values: int | None = None) -> torch.Tensor:
    """The tensor of `shape` stored as `qtype` in `data` (uint8 bytes, any shape, on any device), in `dtype`:
    exactly the float32 values rounded once to `dtype`."""
    if qtype not in BLOCKS:
        raise ValueError(f"GGUF type {qtype} is not supported; supported: {', '.join(BLOCKS)}")
    values, size = BLOCKS[qtype]
    data = data.reshape(-1)
    if data.numel() * values != math.prod(shape) * size:
        raise ValueError(f"{data.numel()} bytes of {qtype} cannot hold a tensor of shape {list(shape)}")
    if qtype in FLOAT_DTYPES:
        return data.contiguous().view(FLOAT_DTYPES[qtype]).to(dtype).reshape(shape)
    blocks = data.reshape(-1, size)
    expand = _k_quant if qtype.endswith("_K") else _legacy
    out = torch.empty(blocks.shape[0], values, dtype=dtype, device=data.device)
    step = max(1, (chunk_values or slice_values(data.device)) // values)
    for start in range(0, blocks.shape[0], step):
        out[start : start + step] = expand(qtype, blocks[start : start + step])
    return out.reshape(shape)
