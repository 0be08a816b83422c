"""NVIDIA's official FP8 checkpoints (Hub revision "fp8"), in both layouts NVIDIA's tools write, and the precision
they ask for.

Each quantized linear stores `weight` in float8_e4m3fn with two tensorwise float32 scales beside it (`scale_layout`):
- ModelOpt's unified HF export (NVIDIA's Cosmos3 FP8 exporter, what vLLM and cosmos-framework load): `weight_scale`
  (the weight's amax / 448) and `input_scale` (the calibrated activation amax / 448);
- ModelOpt's `save_pretrained` buffers: `weight_quantizer._scale` (amax / 448), `weight_quantizer._amax` and
  `input_quantizer._amax` (the activation range, divided by 448 when read: the same float32 division both produce).
Where a folder holds both for one linear, the unified export's scales are read and the buffers skipped. Scales may
sit in any shard of the index. Any other quantization tensor (SmoothQuant pre-scales, output or K/V scales, second-
level scales) is refused by name, as are per-channel or block scales.

What they are is declared by the transformer's `config.json` (`quantization_config`: quant_method "modelopt", an
FP8 algorithm, in ModelOpt's flat form or the exporter's `config_groups` form with its `ignore` list), or, without
one, by an `hf_quant_config.json` (transformer folder or checkpoint root; `quantization.quant_algo`,
`exclude_modules`). A linear the ignore list names must not be stored in fp8. For the multi-step checkpoints the
config also says how to run them (`runtime.diffusion_step_policy`, schema 1, type "first_last_n"):

- W8A8 (the checkpoint's native arithmetic): the activations quantized to fp8 with the static input scale, one fp8
  matmul with both tensorwise scales (`torch._scaled_mm` on GPUs with fp8 matmuls, an exact float32 emulation
  elsewhere);
- W8A16 (higher precision): the fp8 weight times its scale in the activations' dtype, a normal matmul;

on the first and last N denoising steps W8A16 for the media pathway, W8A8 between; the text pathway (prompt encoding
and the Reasoner) as the policy's "reasoner" entry says. The distilled FP8 checkpoints declare no policy and run W8A8
throughout. A malformed policy is refused by name (missing fields fail closed, as in diffusers). `modelopt_state.pth`
(a pickle) is never read: the safetensors and the JSON say everything.

diffusers 0.42.1 (`pipelines/cosmos/mixed_precision.py`) labels the attention projections of the two pathways the
other way round (its "generation" set holds the text tower's `to_q/k/v/out`, its "reasoner" set the media tower's
`add_*`). The pack follows the policy's meaning: the media pathway switches per step, the text pathway (encoded once
per prompt and cached) follows "reasoner".
"""

import fnmatch
import math
import re
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .devices import facts
from .errors import CheckpointError

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
POLICY_FIELDS = ("schema_version", "type", "index_space", "scope", "default_mode", "first_steps", "last_steps",
                 "overlap", "reasoner")
MODES = ("a16", "native")  # the policy's words for W8A16 and W8A8


@dataclass(frozen=True)
class StepPolicy:
    """W8A16 on the first `first` and last `last` denoising steps (media pathway), W8A8 between; where the windows
    overlap (short runs), `overlap_a16` decides; the text pathway runs W8A16 when `text_a16`. One-step runs stay
    W8A8, as in diffusers and vLLM-Omni."""

    first: int = 3
    last: int = 3
    overlap_a16: bool = True
    text_a16: bool = True

    def high_precision(self, step: int, steps: int) -> bool:
        if steps <= 1:
            return False
        in_first, in_last = step < self.first, step >= steps - self.last
        if in_first and in_last:
            return self.overlap_a16
        return in_first or in_last

    def precision_name(self, step: int, steps: int) -> str:
        """"W8A16" or "W8A8": the names diffusers' `Cosmos3MixedPrecisionConfig.precision_name` gives."""
        return "W8A16" if self.high_precision(step, steps) else "W8A8"

    def describe(self) -> str:
        text = "W8A16" if self.text_a16 else "W8A8"
        return f"W8A16 on the first {self.first} and last {self.last} steps, W8A8 between; text tower {text}"


@dataclass(frozen=True)
class Quantization:
    """What a checkpoint declares: ModelOpt FP8, with its step policy or none, and the modules it left unquantized
    (`ignore`: names or fnmatch patterns)."""

    algorithm: str
    policy: StepPolicy | None
    ignore: tuple[str, ...] = ()

    def describe(self) -> str:
        how = self.policy.describe() if self.policy is not None else "W8A8 throughout (no step policy)"
        return f"ModelOpt {self.algorithm} ({how})"

    def ignores(self, module: str) -> bool:
        return any(fnmatch.fnmatchcase(module, pattern) for pattern in self.ignore)


HF_QUANT_CONFIG = "hf_quant_config.json"  # ModelOpt's export config, the form vLLM's loaders read


def read_quantization(raw: dict | None, source: str) -> Quantization | None:
    """A transformer config's `quantization_config` (ModelOpt's flat form or the unified export's `config_groups`
    form) or an `hf_quant_config.json` (`{producer, quantization: {quant_algo, exclude_modules}}`); None when absent.
    Anything but static tensorwise ModelOpt FP8 is refused by name."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{source}: the quantization config must be an object")
    if isinstance(raw.get("quantization"), dict):  # hf_quant_config.json: ModelOpt's own file, its details nested
        raw = {"quant_method": "modelopt", **raw, **raw["quantization"]}
    method = str(raw.get("quant_method", "")).lower()
    algorithm = str(raw.get("quant_algo") or raw.get("quant_type") or "").upper()
    if method != "modelopt" or "FP8" not in algorithm:
        raise CheckpointError(f"{source}: the quantization config declares quant_method {raw.get('quant_method')!r} "
                              f"with {algorithm or 'no algorithm'}; the pack reads ModelOpt FP8 checkpoints (Hub "
                              "revision 'fp8'), bf16 checkpoints and GGUF files")
    for name, group in (raw.get("config_groups") or {}).items():
        _check_group(group, f"{source}: config_groups.{name}")
    ignore = raw.get("ignore", raw.get("exclude_modules")) or []
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        raise CheckpointError(f"{source}: the quantization config's ignore list must be a list of module names")
    runtime = raw.get("runtime")
    if runtime is not None and not isinstance(runtime, dict):
        raise CheckpointError(f"{source}: quantization_config.runtime must be an object or null")
    policy = (runtime or {}).get("diffusion_step_policy")
    return Quantization(algorithm, None if policy is None else parse_policy(policy, source), tuple(ignore))


def _check_group(group, where: str) -> None:
    """A `config_groups` entry must describe what the pack runs: 8-bit float weights and static 8-bit float
    activations (or none: weight-only), tensorwise."""
    if not isinstance(group, dict):
        raise CheckpointError(f"{where} must be an object")
    for part in ("weights", "input_activations"):
        spec = group.get(part)
        if spec is None and part == "input_activations":
            continue
        if not isinstance(spec, dict) or spec.get("num_bits") != 8 or spec.get("type") != "float":
            raise CheckpointError(f"{where}.{part} is {spec!r}, not 8-bit float; the pack reads FP8 (E4M3) checkpoints")
        if spec.get("dynamic"):
            raise CheckpointError(f"{where}.{part} is dynamic (scales computed per token at run time); the pack "
                                  "reads static FP8 scales as ModelOpt calibrates them")
        layout = {key: spec[key] for key in ("strategy", "group_size", "block_structure") if spec.get(key)}
        if layout and layout != {"strategy": "tensor"}:
            raise CheckpointError(f"{where}.{part} has {layout}; the pack reads tensorwise FP8 scales only")


def parse_policy(policy, source: str) -> StepPolicy:
    """A `diffusion_step_policy` of schema 1, type first_last_n; every field is required."""
    where = f"{source}: quantization_config.runtime.diffusion_step_policy"

    def fail(problem: str):
        raise CheckpointError(f"{where} {problem}; this pack reads schema 1 'first_last_n' policies (a newer "
                              "checkpoint may need a newer pack)")

    if not isinstance(policy, dict):
        fail("must be an object")
    missing = [name for name in POLICY_FIELDS if name not in policy]
    if missing:
        fail(f"lacks {', '.join(missing)}")
    expected = {"schema_version": 1, "type": "first_last_n", "index_space": "denoising_loop_iteration",
                "default_mode": "native"}
    for name, value in expected.items():
        if policy[name] != value:
            fail(f"has {name} {policy[name]!r}, not {value!r}")
    if not isinstance(policy["scope"], (list, tuple)) or list(policy["scope"]) != ["transformer"]:
        fail(f"has scope {policy['scope']!r}, not ['transformer']")
    for name in ("overlap", "reasoner"):
        if policy[name] not in MODES:
            fail(f"has {name} {policy[name]!r}, not 'a16' or 'native'")
    counts = []
    for name in ("first_steps", "last_steps"):
        window = policy[name]
        if not isinstance(window, dict) or window.get("mode") not in MODES:
            fail(f"{name} must be an object with mode 'a16' or 'native' and a count")
        count = window.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            fail(f"{name}.count must be a non-negative integer, got {count!r}")
        counts.append(count if window["mode"] == "a16" else 0)
    return StepPolicy(counts[0], counts[1], policy["overlap"] == "a16", policy["reasoner"] == "a16")


def resolve_policy(quantization: Quantization | None, override: str, first: int | None, last: int | None,
                   notes: list[str]) -> StepPolicy | None:
    """The step policy a run uses: the checkpoint's ("checkpoint"), none ("off": W8A8 throughout), or the first/last
    policy even where the checkpoint declares none ("on", 3 and 3 unless given); `first` / `last` override the
    counts. None: W8A8 throughout."""
    if quantization is None:
        if override != "checkpoint" or first is not None or last is not None:
            notes.append("fp8 step policy ignored: this checkpoint is not an official FP8 (ModelOpt) checkpoint")
        return None
    if override == "off":
        return None
    policy = quantization.policy
    if policy is None and override == "checkpoint":
        if first is not None or last is not None:
            notes.append("fp8 first/last step counts ignored: this checkpoint declares no step policy (it runs W8A8 "
                         "throughout); set fp8_policy 'on' to use them")
        return None
    policy = policy or StepPolicy()
    return StepPolicy(policy.first if first is None else first, policy.last if last is None else last,
                      policy.overlap_a16, policy.text_a16)


# --- the scales in the weight files ----------------------------------------------------------------------------------

# Each scale key's suffix beside `<m>`, and the pack's name for it on the Fp8Linear (None: not needed).
UNIFIED_SCALES = {".weight_scale": ".scale", ".input_scale": ".input_scale"}
SAVED_SCALES = {".weight_quantizer._scale": ".scale", ".input_quantizer._amax": ".input_scale",
                ".weight_quantizer._amax": None}  # the weight's range: `_scale` is it divided by 448
UNKNOWN_SCALE = re.compile(r"(_quantizer\.|(^|[._])(scale|amax)(_\d+)?$|\.svdquant_lora_[ab]$)")


@dataclass(frozen=True)
class ScaleLayout:
    """How one weight folder is read (`scale_layout`): every key's parameter name (None: not read), the fp8 weights
    among them, and `convert`, which turns a read tensor into its parameter's value (an activation range into its
    scale)."""

    names: dict[str, str | None]
    fp8_weights: set[str]

    def rename(self, key: str) -> str | None:
        return self.names[key]

    @staticmethod
    def convert(key: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.float() / FP8_MAX if key.endswith(".input_quantizer._amax") else tensor


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
        elif UNKNOWN_SCALE.search(key):
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


# --- the arithmetic --------------------------------------------------------------------------------------------------

class _Precision:
    """Which pathways run W8A8 now: (media, text); None outside a run (the checkpoint's native W8A8 everywhere). A
    plain attribute, not a ContextVar: torch.compile reads it inside a compiled block (guarding on its value), where
    a ContextVar breaks the graph at every linear. A process runs one generation at a time."""

    now: tuple[bool, bool] | None = None


_precision = _Precision()


@contextmanager
def precision(media_w8a8: bool, text_w8a8: bool):
    """Run the linears with input scales W8A8 or W8A16 per pathway inside the block."""
    before, _precision.now = _precision.now, (media_w8a8, text_w8a8)
    try:
        yield
    finally:
        _precision.now = before


def for_step(policy: StepPolicy | None, step: int, steps: int):
    """The precision of denoising step `step` of `steps` (policy None: W8A8 throughout)."""
    if policy is None:
        return precision(True, True)
    return precision(not policy.high_precision(step, steps), not policy.text_a16)


def step_of_sigma(sigma: float, sigmas: list[float]) -> tuple[int, int]:
    """(step, steps) of a model call at `sigma` in a sampler's schedule `sigmas` (steps + 1 values, decreasing): the
    step whose interval holds it, so a sampler's extra evaluations inside a step (Heun, DPM++ 2S) count as that step."""
    steps = max(len(sigmas) - 1, 1)
    tolerance = 1e-5 * max(abs(sigma), 1e-3)
    return max(sum(s >= sigma - tolerance for s in sigmas[:steps]) - 1, 0), steps


def for_text(policy: StepPolicy | None):
    """The precision of the text pathway outside the steps (prompt encoding, the Reasoner)."""
    return precision(True, policy is None or not policy.text_a16)


def runs_w8a8(pathway: str | None) -> bool:
    """Whether a linear of `pathway` ("media", "text"; None for the patch and time projections, which the policy
    does not name and which keep their native W8A8) runs W8A8 now."""
    now = _precision.now
    if now is None or pathway is None:
        return True
    return now[0] if pathway == "media" else now[1]


def quantize_static(rows: torch.Tensor, input_scale: torch.Tensor) -> torch.Tensor:
    """Activations [N, in] -> fp8 by a static tensorwise scale, rounded once."""
    return (rows.float() / input_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


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
