"""Safetensors weights: a component's files, their headers, and reading them into a module built on the meta device.

The module is constructed without memory (`torch.device("meta")`), then each tensor is read from its
shard straight onto the target device and cast to its final dtype, and assigned in place of the
meta parameter. No random initialisation is ever materialised, and each tensor is allocated once in
its final dtype (the file itself is only memory-mapped while it is read). Only safetensors are read: nothing is
unpickled and no checkpoint code runs.
"""

import json
import struct
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from ..errors import CheckpointError

WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"
STORED_AS_IS = (torch.float8_e4m3fn, torch.uint8)  # quantized values and packed bytes: never cast
INDEX_NAME = WEIGHTS_NAME + ".index.json"


def read_weight_map(index: Path) -> dict[str, str]:
    """The tensor -> file map of a safetensors index file."""
    try:
        return json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index} is damaged ({exc}); download it again") from exc


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a component folder: the shards its index names, or the single file."""
    index = folder / INDEX_NAME
    if index.is_file():
        files = [folder / name for name in dict.fromkeys(read_weight_map(index).values())]
        for f in files:
            if not f.is_file():
                raise CheckpointError(f"missing weight shard {f} (listed in {index.name}); download it again")
        return files
    single = folder / WEIGHTS_NAME
    if single.is_file():
        return [single]
    pickled = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt*"))
    if pickled:
        raise CheckpointError(
            f"{folder} only has pickle weights ({', '.join(pickled)}); this runtime loads safetensors only"
        )
    raise CheckpointError(f"{folder} has neither {WEIGHTS_NAME} nor {INDEX_NAME}")


def load_weights(
    module: nn.Module,
    folder: Path,
    dtype: torch.dtype,
    device: torch.device,
    rename: Callable[[str], str | None] = lambda key: key,
    keep_fp32: tuple[str, ...] = (),
    files: list[Path] | None = None,
    convert: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """Fill the meta parameters of `module` from the safetensors files in `folder` (or the given `files`).

    `rename` maps a file key to a parameter name, or to None for a tensor that is deliberately not
    used; `convert(key, tensor)` changes a tensor's value as read (an activation range into its scale). Parameters
    whose name starts with a `keep_fp32` prefix stay float32, and so do those a quantized layer lists in its
    `kept_float32` (its scales: in fp16 an activation scale above 65504 would become inf, a small one round); fp8
    and packed integer values stay as stored. Missing, unexpected and mis-shaped tensors are errors that name the
    tensors and the file.
    """
    expected = {name: p for name, p in module.named_parameters()}
    expected.update(module.named_buffers())
    modules = dict(module.named_modules())
    loaded: set[str] = set()
    unexpected: list[str] = []
    for path in files or weight_files(folder):
        state = {}
        for key, tensor_of in _tensors(path, device):
            name = rename(key)
            if name is None:
                continue
            if name not in expected:
                unexpected.append(key)
                continue
            tensor = tensor_of() if convert is None else convert(key, tensor_of())
            if tuple(tensor.shape) != tuple(expected[name].shape):
                raise CheckpointError(
                    f"{path}: tensor {key} has shape {list(tensor.shape)}, the config implies "
                    f"{list(expected[name].shape)}; the weights do not belong to this config.json"
                )
            owner, _, leaf = name.rpartition(".")
            target = torch.float32 if name.startswith(keep_fp32) else dtype if tensor.is_floating_point() else None
            if expected[name].dtype in STORED_AS_IS:  # quantized values stay as stored (their scales are their own)
                target = expected[name].dtype
            elif leaf in getattr(modules[owner], "kept_float32", ()):
                target = torch.float32
            elif tensor.dtype in STORED_AS_IS:
                raise CheckpointError(f"{path}: {key} is stored as {tensor.dtype}, which cannot be cast without its "
                                      "scale; this module does not read it")
            # On CPU safetensors hands out views of the memory-mapped file; own the memory, or a file
            # replaced while the model is loaded would crash the process (SIGBUS) on the next read.
            state[name] = tensor.to(dtype=target, copy=tensor.device.type == "cpu")
            loaded.add(name)
        module.load_state_dict(state, strict=False, assign=True)
        del state
    if unexpected:
        raise CheckpointError(
            f"{folder}: weights {_names(unexpected)} do not exist in a model built from its config.json; "
            "the config and the weights come from different checkpoints"
        )
    missing = sorted(set(expected) - loaded)
    if missing:
        raise CheckpointError(f"{folder}: weights {_names(missing)} are missing; the download is incomplete")
    module.requires_grad_(False)
    module.eval()


def _tensors(path: Path, device: torch.device):
    """(key, loader) pairs of one safetensors file, with damage reported against the file."""
    try:
        handle = safe_open(str(path), framework="pt", device=str(device))
        keys = list(handle.keys())
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file ({exc}); it is corrupt or truncated") from exc

    def loader(key):
        def read():
            try:
                return handle.get_tensor(key)
            except torch.OutOfMemoryError:
                raise CheckpointError(f"out of memory on {device} while loading {key} from {path}; the weights do "
                                      "not fit on that device: free memory, or load offloaded or in a smaller dtype") from None
            except (SafetensorError, OSError, ValueError) as exc:
                raise CheckpointError(f"{path}: cannot read tensor {key} ({exc}); the file is corrupt") from exc

        return read

    with handle:
        for key in keys:
            yield key, loader(key)


def read_headers(folder: Path) -> tuple[dict[str, dict], list[str]]:
    """The tensor entries ({name: {dtype, shape, data_offsets}}) of a component's weight files, from their
    headers only, and the names of listed files that are missing. Nothing is loaded."""
    index = folder / INDEX_NAME
    if index.is_file():
        names = list(dict.fromkeys(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values()))
    else:
        names = [WEIGHTS_NAME]
    entries: dict[str, dict] = {}
    missing = []
    for name in names:
        path = folder / name
        if not path.is_file():
            missing.append(name)
            continue
        with open(path, "rb") as f:
            try:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(length))
            except (struct.error, ValueError) as exc:
                raise CheckpointError(f"{path} has no readable safetensors header ({exc}); it is corrupt") from exc
        entries.update((key, entry) for key, entry in header.items() if key != "__metadata__")
    return entries, missing


def stored_bytes(folder: Path) -> tuple[dict[str, int], list[str]]:
    """Bytes per stored dtype of a component's weight files (headers only), and the missing files."""
    entries, missing = read_headers(folder)
    totals: dict[str, int] = {}
    for entry in entries.values():
        start, end = entry["data_offsets"]
        totals[entry["dtype"]] = totals.get(entry["dtype"], 0) + end - start
    return totals, missing


def _names(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(sorted(keys)[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


class Dense:
    """Weights as the files store them (bf16, fp32): read, cast once into the model's dtype."""

    name = "dense"
    quantization = None

    def __init__(self, folder: Path):
        self.folder = folder

    def describe(self) -> str:
        return "dense weights"

    def build(self, model: nn.Module, rename, pathway_of) -> None:
        pass  # the model's own linears read them

    def read(self, model: nn.Module, dtype: torch.dtype, device: torch.device, rename, keep_fp32=()) -> None:
        # ModelOpt's record of a weight's calibrated range may sit beside dense weights (a model saved calibrated but
        # not compressed): nothing reads it
        load_weights(model, self.folder, dtype, device, rename=lambda key: None if key.endswith(
            ".weight_quantizer._amax") else rename(key), keep_fp32=keep_fp32)

    def resident_bytes(self, name: str, layer: nn.Module) -> int | None:
        return None

    def step_bytes(self, config, tokens: int, dtype: torch.dtype, device) -> dict[str, int]:
        return {}
