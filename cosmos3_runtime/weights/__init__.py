"""Weight formats, behind one protocol (`format.WeightFormat`: build the format's layers on the meta device, read,
bytes for the memory plan), and which one a checkpoint's transformer is in (`detect`), from its configs and headers
before any weight is read.

| format | files | in memory | module |
|---|---|---|---|
| dense | bf16 / fp32 safetensors | the model's dtype | `files.Dense` |
| local fp8 | dense, `quantize="fp8"` / `"fp8_scaled"` | fp8, a scale per row | `local_fp8` |
| ModelOpt FP8 | NVIDIA's official FP8 (both ModelOpt layouts) | fp8, tensorwise scales | `modelopt_fp8` |
| NVFP4 | ModelOpt's NVFP4 export | packed E2M1, e4m3 scales per 16 | `nvfp4` |
| GGUF | one .gguf file | its blocks | `gguf` |

What ModelOpt checkpoints declare is read by `modelopt`; how many denoising steps run a quantized checkpoint's own
low-precision arithmetic by `precision`.
"""

from ..errors import CheckpointError, InputError
from .files import Dense, read_headers
from .format import WeightFormat
from .gguf import open_file
from .local_fp8 import LocalFp8
from .modelopt_fp8 import ModelOptFp8
from .nvfp4 import NVFP4

DECLARED = {"FP8": ModelOptFp8, "NVFP4": NVFP4}  # a ModelOpt algorithm -> its format
STORED = {"F8_E4M3": "FP8", "U8": "NVFP4"}  # the dtype of a quantized `.weight` in the headers -> its algorithm


def detect(checkpoint, transformer_file=None, quantize: str | None = None, headers: bool = True) -> WeightFormat:
    """The format the transformer loads in: a GGUF file's (`transformer_file`, or the one .gguf in transformer/),
    else the folder's (`folder_format`). A load option that cannot apply is refused by name. `headers` False: from the
    configs (and a GGUF file's header) alone, as a planner sees it, to plan with, not to load."""
    gguf = open_file(checkpoint.path("transformer"), transformer_file, quantize)
    return gguf if gguf is not None else folder_format(checkpoint, quantize, headers)


def folder_format(checkpoint, quantize: str | None = None, headers: bool = True) -> WeightFormat:
    """The format of the transformer folder's safetensors: what its config declares (ModelOpt FP8 or NVFP4), else
    what its headers store (fp8 or packed weights; `headers` False: not read), else dense, made fp8 at load when
    `quantize` asks."""
    folder = checkpoint.path("transformer")
    entries = read_headers(folder)[0] if headers else {}
    stored = {STORED[entry["dtype"]] for key, entry in entries.items()
              if key.endswith(".weight") and entry["dtype"] in STORED}
    declared = checkpoint.variant.quantization
    algorithm = declared.algorithm if declared is not None else next(iter(sorted(stored)), None)
    if stored - {algorithm} or len(stored) > 1:
        raise CheckpointError(f"{folder}: the weights are stored as {' and '.join(sorted(stored))}, the config "
                              f"declares {algorithm or 'dense weights'}; the files and the config come from different "
                              "exports")
    if algorithm is None:
        return Dense(folder) if quantize is None else LocalFp8(folder, quantize)
    if quantize:
        raise InputError(f"quantize={quantize!r} cannot apply to {checkpoint.root.name}: its transformer is already "
                         f"quantized (ModelOpt {algorithm}); load it without quantize")
    return DECLARED[algorithm](folder, entries, declared)
