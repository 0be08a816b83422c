"""GGUF files for tests, written by the `gguf` package's own writer (never by the project's converter)."""

from pathlib import Path

import numpy as np

from cosmos3_runtime.weights.gguf_dequant import BLOCKS

FP16_FIELDS = {  # byte offsets of each block's fp16 scales (random bytes there could be inf / nan)
    "Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}
QUANTIZED = sorted(FP16_FIELDS)


def random_blocks(qtype: str, rows: int, values: int, seed: int = 0, scale: float = 0.05) -> np.ndarray:
    """Random bytes for every field, with finite random fp16 scales of about `scale`: [rows, bytes per row]."""
    block, size = BLOCKS[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows * values // block, size), dtype=np.uint8)
    for offset in FP16_FIELDS.get(qtype, ()):
        blocks[:, offset : offset + 2] = rng.normal(0, scale, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def write_gguf(path: Path, tensors: dict[str, tuple[str, np.ndarray]], architecture: str = "cosmos3") -> Path:
    """{name: (type name, data)}: block types as their bytes [rows, bytes per row], float types as arrays."""
    from gguf import GGMLQuantizationType, GGUFWriter

    writer = GGUFWriter(path, architecture)
    for name, (qtype, data) in tensors.items():
        if qtype in ("F32", "F16"):
            writer.add_tensor(name, data.astype(np.float32 if qtype == "F32" else np.float16))
        else:
            writer.add_tensor(name, data, raw_dtype=GGMLQuantizationType[qtype])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
