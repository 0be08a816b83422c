"""Finding a Cosmos3 checkpoint and reading what it is from its config files.

A checkpoint is a diffusers-layout folder (model_index.json, transformer/, vae/, scheduler/,
text_tokenizer/ ...). It can be named by a local path, a Hugging Face repo id (`nvidia/Cosmos3-Nano`)
or a repo id with a subfolder (`namespace/repo/sub/folder`); repo ids resolve through the local
Hugging Face cache first and download only the files that are needed.

`detect_variant` decides everything that depends on the checkpoint (Edge or gated backbone,
distilled or multi-step, action and sound heads) from config files alone, before any weight is
read, and remembers the answer per folder.
"""

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .action import default_preset
from .causal import CausalConfig, read_config as read_causal
from .errors import CheckpointError
from .schedulers import FLOW_MATCH_EULER
from .transformer import EDGE_BACKBONE, TransformerConfig
from .weights.modelopt import HF_QUANT_CONFIG, Quantization, read_quantization
from .weights.precision import Policy

log = logging.getLogger(__name__)

PIPELINE_CLASSES = ("Cosmos3OmniPipeline", "Cosmos3OmniDiffusersPipeline", "Cosmos3NanoSimTransferPipeline",
                    "Cosmos3NanoSimBimanualPipeline", "Cosmos3NanoSimAutoPipeline")  # the causal ones: `causal`
TOKENIZER_DIRS = ("text_tokenizer", "tokenizer")
CONFIG_FILES = (
    "model_index.json",
    "modular_model_index.json",
    "transformer/config.json",
    "scheduler/scheduler_config.json",
    f"transformer/{HF_QUANT_CONFIG}",
    HF_QUANT_CONFIG,
)


@dataclass(frozen=True)
class Variant:
    """What a checkpoint is, as far as sampling defaults and architecture are concerned."""

    is_edge: bool
    is_distilled: bool
    distilled_sigmas: tuple[float, ...] | None
    stochastic_distilled: bool  # distilled steps re-noise (SDE) instead of a deterministic Euler step
    has_action: bool
    has_sound: bool
    has_sound_tokenizer: bool  # model_index.json names a sound_tokenizer component
    default_use_system_prompt: bool
    pipeline_class: str
    scheduler_class: str  # scheduler/scheduler_config.json _class_name (the 'checkpoint' schedule runs it)
    default_action_preset: str = "framework"  # droid-server when the folder or repo id names Policy-DROID
    quantization: Quantization | None = None  # a ModelOpt checkpoint's (transformer config's quantization_config)
    causal: CausalConfig | None = None  # a causal checkpoint's rollout (distilled: its fixed SDE sigmas)

    @property
    def precision(self) -> Policy | None:
        """The step policy a quantized checkpoint declares (None: its own arithmetic throughout, or none declared)."""
        return None if self.quantization is None else self.quantization.policy

    def describe(self) -> str:
        parts = ["Edge (dense relu2)" if self.is_edge else "gated (SwiGLU)"]
        if self.is_distilled:
            mode = "SDE" if self.stochastic_distilled else "Euler"
            parts.append(f"distilled {len(self.distilled_sigmas)}-step ({mode})")
        else:
            parts.append("multi-step")
        if self.has_action:
            parts.append("action head")
        if self.has_sound:
            parts.append("sound head" if self.has_sound_tokenizer else "sound head (no sound tokenizer)")
        if self.quantization is not None:
            parts.append(self.quantization.describe())
        if self.causal is not None:
            parts.append(self.causal.describe())
        return ", ".join(parts)


def read_json(path: Path, required: bool = True) -> dict | None:
    """Parse a JSON config file; errors name the file."""
    if not path.is_file():
        if required:
            raise CheckpointError(f"missing file {path}; the checkpoint folder is incomplete, download it again")
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc}); the file is damaged, download it again") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


class Checkpoint:
    """A resolved local checkpoint folder and its parsed config files."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).resolve()
        self.model_index = check_folder(self.root)
        self.variant = detect_variant(self.root)

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    def transformer_config(self) -> TransformerConfig:
        raw = read_json(self.path("transformer", "config.json"))
        return TransformerConfig.from_dict(raw, source=str(self.path("transformer", "config.json")))

    def scheduler_config(self) -> dict:
        return read_json(self.path("scheduler", "scheduler_config.json"))

    def tokenizer_dir(self) -> Path:
        for name in TOKENIZER_DIRS:
            if (self.root / name / "tokenizer.json").is_file():
                return self.root / name
        raise CheckpointError(
            f"{self.root} has no text_tokenizer/tokenizer.json (nor tokenizer/tokenizer.json); "
            "the tokenizer files were not downloaded"
        )

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.root)!r}, {self.variant.describe()})"


def check_folder(root: Path) -> dict:
    """The folder's model_index.json, or a helpful error when `root` is not a Cosmos3 checkpoint folder."""
    if not root.exists():
        raise CheckpointError(f"checkpoint folder {root} does not exist")
    if not root.is_dir():
        raise CheckpointError(f"{root} is a file; point at the checkpoint folder that holds model_index.json")
    index = root / "model_index.json"
    if not index.is_file():
        hint = "point at the checkpoint folder that holds model_index.json"
        if (root / "config.json").is_file() and (root.parent / "model_index.json").is_file():
            hint = f"this looks like the {root.name}/ subfolder; point at its parent {root.parent}"
        raise CheckpointError(f"{root} has no model_index.json, so it is not a diffusers checkpoint: {hint}")
    model_index = read_json(index)
    class_name = model_index.get("_class_name")
    if class_name not in PIPELINE_CLASSES:
        raise CheckpointError(
            f"{index}: _class_name is {class_name!r}, not a Cosmos3 pipeline ({' or '.join(PIPELINE_CLASSES)})"
        )
    return model_index


_variant_cache: dict[tuple, Variant] = {}


def detect_variant(root: str | os.PathLike) -> Variant:
    """The checkpoint's variant, from its config files only. Cached per folder and config state."""
    root = Path(root).resolve()
    stamp = tuple((name, _mtime(root / name)) for name in CONFIG_FILES)
    key = (str(root), stamp)
    if key not in _variant_cache:
        _variant_cache[key] = _detect(root)
    return _variant_cache[key]


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def _detect(root: Path) -> Variant:
    index = read_json(root / "model_index.json")
    modular = read_json(root / "modular_model_index.json", required=False) or {}
    transformer_raw = read_json(root / "transformer" / "config.json")
    config = TransformerConfig.from_dict(transformer_raw, source=str(root / "transformer" / "config.json"))
    scheduler = read_json(root / "scheduler" / "scheduler_config.json")

    is_edge = config.backbone_type == EDGE_BACKBONE or config.hidden_act == "relu2"
    causal = read_causal(transformer_raw, index["_class_name"], str(root / "transformer" / "config.json"))
    sigmas, stochastic = (causal.t_list, True) if causal else _distilled_schedule(root, scheduler, modular)
    system_prompt = index.get("default_use_system_prompt", modular.get("default_use_system_prompt", True))
    return Variant(
        is_edge=is_edge,
        is_distilled=sigmas is not None,
        distilled_sigmas=sigmas,
        stochastic_distilled=stochastic,
        has_action=bool(config.action_gen),
        has_sound=bool(config.sound_gen),
        has_sound_tokenizer=(index.get("sound_tokenizer") or [None, None])[0] is not None,
        default_use_system_prompt=bool(system_prompt),
        pipeline_class=index["_class_name"],
        scheduler_class=str(scheduler.get("_class_name", "UniPCMultistepScheduler")),
        default_action_preset=default_preset(str(root)),
        quantization=_quantization(root, transformer_raw),
        causal=causal,
    )


def _quantization(root: Path, transformer_raw: dict) -> Quantization | None:
    """What the checkpoint declares about its quantization: the transformer config's `quantization_config`, else an
    `hf_quant_config.json` in the transformer folder or the checkpoint root (ModelOpt's export writes one)."""
    if transformer_raw.get("quantization_config") is not None:
        return read_quantization(transformer_raw["quantization_config"], str(root / "transformer" / "config.json"))
    for path in (root / "transformer" / HF_QUANT_CONFIG, root / HF_QUANT_CONFIG):
        if path.is_file():
            return read_quantization(read_json(path), str(path))
    return None


def _distilled_schedule(root: Path, scheduler: dict, modular: dict) -> tuple[tuple[float, ...] | None, bool]:
    """The fixed sigma list of a distilled checkpoint (None if multi-step) and whether its steps are SDE."""
    fixed = scheduler.get("fixed_step_sampler_config") or {}
    t_list = _sigma_list(fixed.get("t_list"), root / "scheduler" / "scheduler_config.json", "t_list")
    modular_sigmas = _sigma_list(modular.get("distilled_sigmas"), root / "modular_model_index.json", "distilled_sigmas")
    is_flow_match = scheduler.get("_class_name") == FLOW_MATCH_EULER

    if is_flow_match and t_list:
        if modular_sigmas and modular_sigmas != t_list:
            log.warning(
                "%s: scheduler t_list %s differs from modular distilled_sigmas %s; using t_list",
                root,
                list(t_list),
                list(modular_sigmas),
            )
        sigmas = t_list
    elif modular_sigmas and (is_flow_match or modular.get("is_distilled")):
        sigmas = modular_sigmas
    else:  # only a declared sigma list makes a checkpoint distilled (a plain FlowMatch one is multi-step)
        if modular.get("is_distilled"):
            log.warning("%s: modular_model_index.json says is_distilled but lists no distilled_sigmas; sampling it "
                        "as a multi-step checkpoint", root)
        return None, False
    stochastic = fixed.get("sample_type") == "sde" or bool(scheduler.get("stochastic_sampling"))
    return sigmas, stochastic


def _sigma_list(value, source: Path, key: str) -> tuple[float, ...] | None:
    if value is None or value == []:
        return None
    if not isinstance(value, list) or not all(isinstance(v, (int, float)) for v in value):
        raise CheckpointError(f"{source}: {key} must be a list of numbers, got {value!r}")
    sigmas = tuple(float(v) for v in value)
    if any(not 0.0 < s <= 1.0 for s in sigmas):
        raise CheckpointError(f"{source}: {key} values must lie in (0, 1], got {list(sigmas)}")
    return sigmas


# --- resolving names to folders ------------------------------------------------------------------

# Files the runtime reads, per component; everything else in a repo is never downloaded.
COMPONENT_PATTERNS = {
    "config": ["model_index.json", "modular_model_index.json", "*/config.json", "scheduler/*.json", "assets/*"],
    "transformer": ["transformer/*"],
    "vae": ["vae/*", "sound_tokenizer/*"],  # the sound tokenizer loads with the VAE
    "tokenizer": [f"{d}/*" for d in TOKENIZER_DIRS],
    "reasoner": ["*.json", "*.jinja", "vision_encoder/*"],  # the root files and vision tower of the Reasoner
}


def resolve(name: str | os.PathLike, components=("transformer", "vae", "tokenizer"), local_files_only=None) -> Path:
    """Turn a local path, `namespace/repo` or `namespace/repo/subfolder` into a local folder.

    Existing paths win. A missing path is tried as a Hugging Face repo id only when it has that form
    (not absolute, not starting with '.' or '~'); the error then says both what was looked for.
    """
    path = Path(name).expanduser()
    if path.exists():
        return path
    text = str(name)
    if not looks_like_repo_id(text):
        raise CheckpointError(f"no such checkpoint folder: {path.absolute()}")
    try:
        return resolve_repo(text, components, local_files_only)
    except CheckpointError as exc:
        repo_id, subfolder = split_repo_id(text)
        tried = f"repo {repo_id}" + (f", subfolder {subfolder}" if subfolder else "")
        raise CheckpointError(f"no such checkpoint folder: {path.absolute()}; also tried as a Hugging Face repo id "
                              f"({tried}): {exc}") from None


REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(/[\w.-]+)*")


def looks_like_repo_id(name: str) -> bool:
    return bool(REPO_ID.fullmatch(name)) and not any(p in (".", "..") for p in name.split("/"))


def resolve_repo(name: str, components=("transformer", "vae", "tokenizer"), local_files_only=None) -> Path:
    """A Hugging Face repo id (never a path) -> its snapshot folder in the local cache.

    Files missing from the cache are downloaded (only those of `components`) unless
    `local_files_only` or HF_HUB_OFFLINE is set.
    """
    if not looks_like_repo_id(name):
        raise CheckpointError(f"{name!r} is not a Hugging Face repo id: the form is namespace/name (e.g. "
                              "nvidia/Cosmos3-Nano), optionally /subfolder; paths are not accepted here")
    repo_id, subfolder = split_repo_id(name)
    prefix = f"{subfolder}/" if subfolder else ""
    patterns = [prefix + p for c in ("config", *components) for p in COMPONENT_PATTERNS[c]]
    needed = ["model_index.json", *(c for c in components if c not in ("tokenizer", "reasoner"))]
    offline = local_files_only if local_files_only is not None else _env_offline()

    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        cached = Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True)) / subfolder
    except LocalEntryNotFoundError:
        cached = None
    if cached is not None and (offline or all((cached / n).exists() for n in needed)):
        return cached  # anything still missing is reported by name when it is read
    if offline:
        raise CheckpointError(
            f"{repo_id} is not in the local Hugging Face cache and downloads are off; download it first "
            f"(huggingface-cli download {repo_id})"
        )
    from huggingface_hub import HfApi

    try:  # before announcing a download: does the repo exist, and can the Hub be reached?
        HfApi().model_info(repo_id)
        log.warning("downloading the files of %s from the Hugging Face Hub that are not in the local cache", repo_id)
        return Path(snapshot_download(repo_id, allow_patterns=patterns)) / subfolder
    except Exception as exc:  # network, auth, unknown repo: each ends the same way for the user
        raise CheckpointError(f"could not read {repo_id} from the Hugging Face Hub ({type(exc).__name__}: {exc})") from exc


def split_repo_id(name: str) -> tuple[str, str]:
    """`namespace/repo/sub/folder` -> ("namespace/repo", "sub/folder")."""
    parts = name.split("/")
    return "/".join(parts[:2]), "/".join(parts[2:])


def _env_offline() -> bool:
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
