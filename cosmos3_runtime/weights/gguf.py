"""GGUF transformer weights: finding the file, checking it against the folder's config, and loading it with
the linear weights kept quantized.

A GGUF file stands in for the transformer's safetensors shards: same tensor names, `general.architecture`
"cosmos3". The `gguf` package's reader memory-maps it. The transformer blocks' linear weights stored in a
block type (Q8_0 ... Q2_K) stay as their bytes (`GGUFLinear.weight`, uint8) wherever the model goes (GPU,
CPU, block swap, a host's memory manager, which therefore counts quantized bytes), and each forward
expands the one weight it needs on the layer's device. Everything else (norms, biases, embeddings, the
time, action and sound projections) is expanded once at load into the model's dtype, whatever type the
file stores it in.
"""

import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import CheckpointError, InputError
from .format import ExpandingLinear, replace_linears
from .gguf_dequant import BLOCKS, FLOAT_DTYPES, dequantize

ARCHITECTURE = "cosmos3"
BLOCK_LINEARS = "layers."  # linears under this prefix run quantized; any other quantized tensor is expanded at load


class GGUFLinear(ExpandingLinear):
    """A linear layer whose weight stays in a GGUF block type; it is dequantized per forward."""

    def __init__(self, linear: nn.Linear, qtype: str):
        super().__init__()
        values, size = BLOCKS[qtype]
        out_features, in_features = linear.weight.shape
        row_bytes = in_features // values * size
        self.weight = nn.Parameter(torch.empty(out_features, row_bytes, dtype=torch.uint8, device="meta"),
                                   requires_grad=False)
        self.bias = linear.bias
        self.qtype, self.in_features, self.out_features = qtype, in_features, out_features

    def dequantized(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The weight in `dtype` on `device`. Bytes held elsewhere (a host's memory manager that left this layer
        in CPU memory) are copied over quantized, then expanded there."""
        weight = self.weight.to(device, non_blocking=True)
        return dequantize(weight, self.qtype, (self.out_features, self.in_features), dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.device, x.dtype)
        return F.linear(x, self.expanded_weight(x), bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, qtype={self.qtype}"


def gguf_file(folder: Path, transformer_file: str | Path | None = None) -> Path | None:
    """The GGUF file the transformer loads from (`transformer_file`, or the one .gguf in `folder`), or None when
    it loads from the folder's safetensors."""
    if transformer_file is not None:
        path = Path(transformer_file)
        if path.suffix.lower() != ".gguf":
            raise CheckpointError(f"transformer_file {path} is not a .gguf file; only GGUF files replace the "
                                  "transformer's safetensors")
        if not path.is_file():
            raise CheckpointError(f"transformer_file {path} does not exist")
        return path
    found = sorted(folder.glob("*.gguf"))
    shards = sorted(folder.glob("*.safetensors"))
    if len(found) > 1 or (found and shards):
        names = ", ".join(p.name for p in found + shards[:2]) + (" ..." if len(shards) > 2 else "")
        raise CheckpointError(f"{folder} holds both {found[0].name} and other transformer weights ({names}): it is "
                              "ambiguous which to load; keep one of them there (or move the .gguf out and name it "
                              "with transformer_file)")
    return found[0] if found else None


class GGUFFile:
    """A GGUF file's header: its metadata and tensor entries (name -> (type name, torch shape)). Reading it
    checks the file is whole and a Cosmos3 transformer; no tensor data is read."""

    def __init__(self, path: Path):
        from gguf import GGUFReader

        self.path = Path(path)
        try:
            self.reader = GGUFReader(self.path)
        except (ValueError, IndexError, OSError, KeyError) as exc:
            raise CheckpointError(f"{self.path} is not a readable GGUF file ({exc}); it is truncated or corrupt, "
                                  "copy or convert it again") from exc
        architecture = self.field("general.architecture")
        if architecture != ARCHITECTURE:
            raise CheckpointError(f"{self.path} is a GGUF file for architecture {architecture!r}, not "
                                  f"{ARCHITECTURE!r}: it holds another model's weights")
        size = self.path.stat().st_size
        self.tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
        self._entries = {t.name: t for t in self.reader.tensors}
        for t in self.reader.tensors:
            if t.data_offset + t.n_bytes > size:
                raise CheckpointError(f"{self.path} is truncated: tensor {t.name} ends at byte "
                                      f"{t.data_offset + t.n_bytes:,}, the file has {size:,}; copy it again")
            if t.tensor_type.name not in BLOCKS:
                raise CheckpointError(f"{self.path}: tensor {t.name} is stored as GGUF type {t.tensor_type.name}, "
                                      f"which this runtime does not read (supported: {', '.join(BLOCKS)})")
            self.tensors[t.name] = (t.tensor_type.name, tuple(int(d) for d in reversed(t.shape)))

    def field(self, key: str):
        field = self.reader.fields.get(key)
        return None if field is None else field.contents()

    def types(self) -> dict[str, tuple[int, int]]:
        """Per type name: (tensors, bytes)."""
        totals: dict[str, tuple[int, int]] = {}
        for t in self.reader.tensors:
            count, n = totals.get(t.tensor_type.name, (0, 0))
            totals[t.tensor_type.name] = (count + 1, n + int(t.n_bytes))
        return totals

    def data(self, name: str) -> torch.Tensor:
        """The stored bytes of one tensor (uint8), a view of the memory-mapped file: whatever is kept from it must
        be copied (so that the file can change under a loaded model)."""
        raw = np.ascontiguousarray(self._entries[name].data).view(np.uint8).reshape(-1)
        with warnings.catch_warnings():  # the map is read-only, and nothing writes to this view
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(raw)


def expect_gguf_linears(model: nn.Module, file: GGUFFile, rename) -> None:
    """Make GGUFLinear shells (on the meta device) for the transformer blocks' linears whose weight the file stores
    in a block type."""
    quantized = {rename(name): qtype for name, (qtype, _) in file.tensors.items() if qtype not in FLOAT_DTYPES}

    def shell(name: str, linear: nn.Module) -> nn.Module | None:
        qtype = quantized.get(f"{name}.weight")
        return GGUFLinear(linear, qtype) if name.startswith(BLOCK_LINEARS) and qtype is not None else None

    replace_linears(model, shell)


def load_gguf_weights(model: nn.Module, file: GGUFFile, dtype: torch.dtype, device: torch.device, rename,
                      keep_fp32: tuple[str, ...] = ()) -> None:
    """Fill the meta parameters of `model` (with `expect_gguf_linears` shells) from `file`. Every name, type and
    shape is checked against the model before any tensor is read."""
    expected = dict(model.named_parameters())
    modules = dict(model.named_modules())
    plan = {}
    for key, (qtype, shape) in file.tensors.items():
        name = rename(key)
        if name is None:
            continue
        if name not in expected:
            raise CheckpointError(f"{file.path}: tensor {key} does not exist in a model built from the folder's "
                                  "config.json; the GGUF file was converted from another checkpoint")
        owner = modules.get(name.rpartition(".")[0])
        want = (owner.out_features, owner.in_features) if isinstance(owner, GGUFLinear) else tuple(expected[name].shape)
        if shape != want:
            raise CheckpointError(f"{file.path}: tensor {key} has shape {list(shape)}, the folder's config.json "
                                  f"implies {list(want)}; the GGUF file belongs to another checkpoint")
        plan[name] = (key, qtype, shape)
    missing = [name for name in expected if name not in plan]
    if missing:
        raise CheckpointError(f"{file.path}: tensor {missing[0]} is missing" + (f" (and {len(missing) - 1} more)" if
                              len(missing) > 1 else "") + "; the GGUF file is incomplete or for another config")
    state = {}
    for name, (key, qtype, shape) in plan.items():
        raw = file.data(key)
        target = torch.float32 if name.startswith(keep_fp32) else dtype
        if expected[name].dtype == torch.uint8:  # a GGUFLinear weight: its bytes, as they are
            state[name] = raw.reshape(expected[name].shape).to(device, copy=True)
        elif qtype in FLOAT_DTYPES:  # one cast from the mapped values, no float32 detour
            state[name] = raw.view(FLOAT_DTYPES[qtype]).reshape(shape).to(device, target, copy=True)
        else:
            state[name] = dequantize(raw.to(device), qtype, shape, target)
    model.load_state_dict(state, strict=False, assign=True)
    model.requires_grad_(False)
    model.eval()


class GGUF:
    """The format of a GGUF transformer file (`file`), or, for a memory plan without one, of blocks of `qtype`."""

    name = "GGUF"
    quantization = None

    def __init__(self, file: GGUFFile | None, qtype: str | None = None):
        self.file, self.qtype = file, qtype

    def describe(self) -> str:
        return f"GGUF {self.file.path.name}" if self.file is not None else f"GGUF {self.qtype}"

    def build(self, model: nn.Module, rename, pathway_of) -> None:
        expect_gguf_linears(model, self.file, rename)

    def read(self, model: nn.Module, dtype: torch.dtype, device: torch.device, rename, keep_fp32=()) -> None:
        load_gguf_weights(model, self.file, dtype, device, rename, keep_fp32)

    def resident_bytes(self, name: str, layer: nn.Module) -> int | None:
        qtype = self.qtype or self.file.tensors.get(f"{name}.weight", (None,))[0]
        if not name.startswith(BLOCK_LINEARS) or not isinstance(layer, nn.Linear) or qtype in (None, *FLOAT_DTYPES):
            return None
        values, size = BLOCKS[qtype]
        return layer.weight.numel() // values * size

    def step_bytes(self, config, tokens: int, dtype: torch.dtype, device) -> dict[str, int]:
        return {}


def open_file(folder: Path, transformer_file=None, quantize: str | None = None) -> GGUF | None:
    """The format of the GGUF file the transformer loads from (its header checked), or None for safetensors;
    `quantize` cannot apply to one."""
    path = gguf_file(folder, transformer_file)
    if path is None:
        return None
    file = GGUFFile(path)
    if quantize:
        raise InputError(f"quantize={quantize!r} cannot apply to {path.name}: a GGUF file is already quantized; load "
                         "it without quantize")
    return GGUF(file)
