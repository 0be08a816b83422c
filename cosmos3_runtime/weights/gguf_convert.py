"""Converting a checkpoint's transformer into one GGUF file (`python -m cosmos3_runtime quantize`).

The transformer blocks' linear weights are quantized with the `gguf` package's own quantizers to one of
the block types it can write; everything else (norms, biases, embeddings, the time, action and sound
projections, any row whose length is not a whole number of blocks) is kept in BF16. Tensors generation
never reads (the language-model head, the last layer's text tail) are left out. Memory stays bounded by
one tensor at a time: tensors are read one by one from the safetensors shards and quantized in row
chunks, so a checkpoint larger than the machine's RAM converts. The file is written next to its target
and renamed into place only when complete.
"""

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from ..checkpoint import Checkpoint, resolve
from ..errors import InputError
from ..transformer import checkpoint_key_mapper
from .files import weight_files
from .gguf import ARCHITECTURE, BLOCK_LINEARS, gguf_file
from .gguf_dequant import BLOCKS

WRITABLE = ("q8_0", "q5_0", "q5_1", "q4_0", "q4_1")  # the block types the gguf package quantizes to
KEPT = "BF16"
CHUNK_VALUES = 1 << 24  # values quantized at once (64 MB of float32 temporaries)


def stored_type(name: str, shape: tuple[int, ...], qtype: str) -> str:
    """The GGUF type a checkpoint tensor is written as."""
    quantizable = name.startswith(BLOCK_LINEARS) and name.endswith(".weight") and len(shape) == 2
    return qtype if quantizable and shape[1] % BLOCKS[qtype][0] == 0 else KEPT


def _byte_shape(shape: tuple[int, ...], qtype: str) -> tuple[int, ...]:
    values, size = BLOCKS[qtype]
    return (*shape[:-1], shape[-1] // values * size)


def convert(source: str | os.PathLike, output: str | os.PathLike, qtype: str = "q8_0",
            progress: Callable[[int, int], None] | None = None) -> dict[str, tuple[int, int]]:
    """Write `source`'s transformer as a GGUF file at `output`; returns {type: (tensors, bytes)} written.
    `progress(done, total)` is called after each tensor, in values converted."""
    from gguf import GGMLQuantizationType, GGUFWriter, quants

    if qtype.lower() not in WRITABLE:
        raise InputError(f"type {qtype!r} cannot be written; choose one of {', '.join(WRITABLE)}")
    qtype = qtype.upper()
    output = Path(output)
    if output.suffix.lower() != ".gguf":
        raise InputError(f"output {output} must end in .gguf")
    checkpoint = Checkpoint(resolve(source, components=("transformer",)))
    folder = checkpoint.path("transformer")
    if gguf_file(folder) is not None:
        raise InputError(f"{folder} already holds a GGUF file; convert from the bf16 safetensors checkpoint")
    rename = checkpoint_key_mapper(checkpoint.transformer_config())

    plan = []  # (file, key, shape, stored type), in file order: the writer takes data in the order of its entries
    for path in weight_files(folder):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                if rename(key) is None:
                    continue
                entry = handle.get_slice(key)
                if entry.get_dtype() == "F8_E4M3":
                    raise InputError(f"{path.name}: {key} is fp8; convert from the bf16 checkpoint instead")
                shape = tuple(entry.get_shape())
                plan.append((path, key, shape, stored_type(key, shape, qtype)))
    total = sum(int(np.prod(shape)) for _, _, shape, _ in plan)
    written: dict[str, tuple[int, int]] = {}

    partial = output.with_name(output.name + ".partial")
    writer = GGUFWriter(partial, ARCHITECTURE)
    config_bytes = checkpoint.path("transformer", "config.json").read_bytes()
    writer.add_string("cosmos3.variant", checkpoint.variant.describe())
    writer.add_string("cosmos3.source_config_sha256", hashlib.sha256(config_bytes).hexdigest())
    writer.add_string("cosmos3.quantization", qtype)
    writer.add_string("cosmos3.kept_type", KEPT)
    for _, key, shape, kind in plan:
        byte_shape = _byte_shape(shape, kind)
        writer.add_tensor_info(key, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)),
                               raw_dtype=GGMLQuantizationType[kind])
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        done = 0
        for path, key, shape, kind in plan:
            # a handle per tensor: CPU tensors are views of the shard's map, and a map kept open would hold every
            # page read so far in RSS (the whole shard); closing it keeps the peak at one tensor
            with safe_open(str(path), framework="pt") as handle:
                tensor = handle.get_tensor(key)
            if kind == KEPT:
                data = tensor.to(torch.bfloat16).contiguous().view(torch.uint8).numpy()
            else:
                data = np.empty(_byte_shape(shape, kind), dtype=np.uint8)
                rows = max(1, CHUNK_VALUES // shape[1])
                for start in range(0, shape[0], rows):
                    chunk = tensor[start : start + rows].float().numpy()
                    data[start : start + rows] = quants.quantize(chunk, GGMLQuantizationType[kind])
            writer.write_tensor_data(data)
            count, n = written.get(kind, (0, 0))
            written[kind] = (count + 1, n + data.nbytes)
            del tensor, data
            done += int(np.prod(shape))
            if progress is not None:
                progress(done, total)
        writer.close()
        partial.replace(output)
    except BaseException:
        writer.close()
        partial.unlink(missing_ok=True)
        raise
    return written


def describe_types(types: dict[str, tuple[int, int]]) -> str:
    def size(n: int) -> str:
        return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"

    return ", ".join(f"{kind} {count} tensors {size(n)}" for kind, (count, n) in sorted(types.items()))
