"""GGUF dequantization in torch against the `gguf` package's own numpy reference: bit-equal for every type."""

import numpy as np
import pytest
import torch

from conftest import require
from cosmos3_runtime.weights.gguf_dequant import dequantize, slice_values
from gguf_files import QUANTIZED, random_blocks

gguf = require("gguf")
from gguf import GGMLQuantizationType, dequantize as reference_dequantize, quantize as reference_quantize  # noqa: E402


@pytest.mark.parametrize("qtype", QUANTIZED)
def test_random_blocks_dequantize_exactly_like_gguf(qtype):
    raw = random_blocks(qtype, rows=6, values=512)
    expected = reference_dequantize(raw, GGMLQuantizationType[qtype])
    got = dequantize(torch.from_numpy(raw), qtype, (6, 512))
    assert got.dtype == torch.float32 and got.shape == (6, 512)
    assert torch.equal(got, torch.from_numpy(expected)), (got - torch.from_numpy(expected)).abs().max()


@pytest.mark.parametrize("qtype", QUANTIZED)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_expanding_in_slices_into_the_compute_dtype_rounds_once(qtype, dtype):
    """A slice of blocks at a time (the last one ragged), written straight in `dtype`: exactly the float32 result
    rounded once, as the forward used before it expanded the whole weight in float32 then cast it."""
    raw = torch.from_numpy(random_blocks(qtype, rows=7, values=512))
    whole = dequantize(raw, qtype, (7, 512))
    got = dequantize(raw, qtype, (7, 512), dtype, chunk_values=3 * 256)
    assert got.dtype == dtype and torch.equal(got, whole.to(dtype))


def test_a_gpu_expands_in_slices_large_enough_not_to_be_launch_bound():
    """On an H200, 2M-value slices (sized for a CPU's cache) made a Nano layer's Q4_K expansion 6x slower than the
    whole weight at once (31.4 against 5.1 ms); 16M-value slices ran in 5.3 ms at half the whole weight's peak."""
    assert slice_values(torch.device("cpu")) == 1 << 21
    assert slice_values(torch.device("cuda", 0)) == slice_values(torch.device("xpu")) == 1 << 24


@pytest.mark.parametrize("qtype", ["Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1", "F16", "BF16", "F32"])
def test_weights_written_by_gguf_come_back(qtype):
    """Real weights quantized by the gguf package's writer path (the types it can write), read back here."""
    weights = np.random.default_rng(1).normal(0, 0.02, (64, 256)).astype(np.float32)
    kind = GGMLQuantizationType[qtype]
    stored = reference_quantize(weights, kind)
    got = dequantize(torch.from_numpy(np.ascontiguousarray(stored).view(np.uint8)), qtype, (64, 256))
    assert torch.equal(got, torch.from_numpy(reference_dequantize(stored, kind).astype(np.float32)))
    assert (got - torch.from_numpy(weights)).abs().max() < 0.02  # and it is the weights, roughly


def test_unsupported_types_and_sizes_are_named():
    with pytest.raises(ValueError, match="GGUF type IQ2_XXS is not supported"):
        dequantize(torch.zeros(66, dtype=torch.uint8), "IQ2_XXS", (256,))
    with pytest.raises(ValueError, match="34 bytes of Q8_0 cannot hold a tensor of shape \\[64\\]"):
        dequantize(torch.zeros(34, dtype=torch.uint8), "Q8_0", (64,))
