"""What a checkpoint quantized by NVIDIA's ModelOpt declares: its algorithm (FP8 or NVFP4), the modules it left in
full precision, and how to run it (the step policy).

The declaration is the transformer `config.json`'s `quantization_config` (quant_method "modelopt", in ModelOpt's flat
form or the unified export's `config_groups` form with its `ignore` list), or, without one, an `hf_quant_config.json`
(transformer folder or checkpoint root; `quantization.quant_algo`, `exclude_modules`). A multi-step checkpoint's
`runtime.diffusion_step_policy` (schema 1, type "first_last_n") says which steps run the checkpoint's own arithmetic
(`precision.Policy`); a malformed policy is refused by name (missing fields fail closed, as in diffusers).
`modelopt_state.pth` (a pickle) is never read: the safetensors and the JSON say everything.
"""

import fnmatch
import re
from dataclasses import dataclass

from ..errors import CheckpointError
from .precision import Policy

HF_QUANT_CONFIG = "hf_quant_config.json"  # ModelOpt's export config, the form vLLM's loaders read
POLICY_FIELDS = ("schema_version", "type", "index_space", "scope", "default_mode", "first_steps", "last_steps",
                 "overlap", "reasoner")
MODES = ("a16", "native")  # the policy's words for 16-bit activations and the checkpoint's own arithmetic
# Per algorithm: what a `config_groups` entry must say (bits, group size: None for tensorwise), the arithmetic's
# names, native then with 16-bit activations (diffusers' `precision_name`), and where the native one runs.
ALGORITHMS = {"FP8": (8, None, "W8A8", "W8A16", ""),
              "NVFP4": (4, 16, "W4A4", "W4A16", "; W4A4 needs FP4 matmuls (compute capability 10.x, 12.x): W4A16 "
                                                "elsewhere")}
# A tensor of ModelOpt's quantization machinery (scales, ranges, quantizer buffers, SVDQuant factors): each format reads
# its own and refuses the others by name.
QUANTIZATION_TENSOR = re.compile(r"(_quantizer\.|(^|[._])(scale|amax)(_\d+)?$|\.svdquant_lora_[ab]$)")


@dataclass(frozen=True)
class Quantization:
    """What a checkpoint declares: its ModelOpt algorithm (`ALGORITHMS`), its step policy or none, and the modules it
    left unquantized (`ignore`: names or fnmatch patterns)."""

    algorithm: str
    policy: Policy | None
    ignore: tuple[str, ...] = ()

    @property
    def arithmetic(self) -> tuple[str, str]:
        """(native, with 16-bit activations), e.g. ("W8A8", "W8A16")."""
        return ALGORITHMS[self.algorithm][2:4]

    def describe(self) -> str:
        native, a16 = self.arithmetic
        how = self.policy.describe(native, a16) if self.policy is not None else f"{native} throughout (no step policy)"
        return f"ModelOpt {self.algorithm} ({how}{ALGORITHMS[self.algorithm][4]})"

    def precision_name(self, step: int, steps: int) -> str:
        """The arithmetic of step `step` of `steps` under the declared policy: the names diffusers'
        `Cosmos3MixedPrecisionConfig.precision_name` gives ("W8A16" or "W8A8")."""
        native, a16 = self.arithmetic
        return a16 if self.policy is not None and self.policy.high_precision(step, steps) else native

    def ignores(self, module: str) -> bool:
        return any(fnmatch.fnmatchcase(module, pattern) for pattern in self.ignore)


def read_quantization(raw: dict | None, source: str) -> Quantization | None:
    """A transformer config's `quantization_config` (ModelOpt's flat form or the unified export's `config_groups`
    form) or an `hf_quant_config.json` (`{producer, quantization: {quant_algo, exclude_modules}}`); None when absent.
    Anything but static tensorwise ModelOpt FP8 or NVFP4 (4-bit floats in groups of 16) is refused by name."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{source}: the quantization config must be an object")
    if isinstance(raw.get("quantization"), dict):  # hf_quant_config.json: ModelOpt's own file, its details nested
        raw = {"quant_method": "modelopt", **raw, **raw["quantization"]}
    method = str(raw.get("quant_method", "")).lower()
    algorithm = str(raw.get("quant_algo") or raw.get("quant_type") or "").upper()
    algorithm = "FP8" if "FP8" in algorithm else algorithm
    if method != "modelopt" or algorithm not in ALGORITHMS:
        raise CheckpointError(f"{source}: the quantization config declares quant_method {raw.get('quant_method')!r} "
                              f"with {algorithm or 'no algorithm'}; the pack reads ModelOpt FP8 checkpoints (Hub "
                              "revision 'fp8'), ModelOpt NVFP4 exports, bf16 checkpoints and GGUF files")
    for name, group in (raw.get("config_groups") or {}).items():
        _check_group(group, algorithm, f"{source}: config_groups.{name}")
    ignore = raw.get("ignore", raw.get("exclude_modules")) or []
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        raise CheckpointError(f"{source}: the quantization config's ignore list must be a list of module names")
    runtime = raw.get("runtime")
    if runtime is not None and not isinstance(runtime, dict):
        raise CheckpointError(f"{source}: quantization_config.runtime must be an object or null")
    policy = (runtime or {}).get("diffusion_step_policy")
    return Quantization(algorithm, None if policy is None else parse_policy(policy, source), tuple(ignore))


def _check_group(group, algorithm: str, where: str) -> None:
    """A `config_groups` entry must describe what the pack runs: float weights of the algorithm's bits and static
    activations alike (or none: weight-only), tensorwise (FP8) or in groups of 16 (NVFP4)."""
    bits, group_size = ALGORITHMS[algorithm][:2]
    if not isinstance(group, dict):
        raise CheckpointError(f"{where} must be an object")
    for part in ("weights", "input_activations"):
        spec = group.get(part)
        if spec is None and part == "input_activations":
            continue
        if not isinstance(spec, dict) or spec.get("num_bits") != bits or spec.get("type") != "float":
            raise CheckpointError(f"{where}.{part} is {spec!r}, not {bits}-bit float; the pack reads {algorithm} "
                                  "checkpoints")
        if spec.get("dynamic"):
            raise CheckpointError(f"{where}.{part} is dynamic (scales computed per token at run time); the pack "
                                  "reads static scales as ModelOpt calibrates them")
        layout = {key: spec[key] for key in ("strategy", "group_size", "block_structure") if spec.get(key)}
        expected = [{"strategy": "tensor"}, {}] if group_size is None else [
            {"group_size": group_size}, {"strategy": "tensor_group", "group_size": group_size}]
        if layout not in expected:
            scales = "tensorwise FP8 scales" if group_size is None else f"NVFP4 scales per {group_size} values"
            raise CheckpointError(f"{where}.{part} has {layout}; the pack reads {scales} only")


def parse_policy(policy, source: str) -> Policy:
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
    return Policy(counts[0], counts[1], policy["overlap"] == "a16", policy["reasoner"] == "a16")
