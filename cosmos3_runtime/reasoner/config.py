"""What the Reasoner reads from a checkpoint's root files, beside the generator's folders.

A released Cosmos3 folder is both a diffusers pipeline and a transformers model: the root holds
`config.json` (the vision tower, the media token ids), a `model.safetensors.index.json` pointing into
`transformer/` and `vision_encoder/`, the tokenizer with its chat template, and the image and video
processor settings. A folder without those root files still answers text-only questions with the
generator's tokenizer.
"""

from dataclasses import dataclass, field
from pathlib import Path

from ..checkpoint import read_json
from ..errors import CheckpointError
from ..weights.files import read_weight_map

OMNI, EDGE = "omni", "edge"  # Nano/Super (Qwen3-VL vision, deepstack) and Edge (SigLIP2 vision, projector)
ROOT_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class QwenVisionConfig:
    """The Qwen3-VL vision tower of Nano and Super."""

    depth: int = 27
    hidden_size: int = 1152
    num_heads: int = 16
    intermediate_size: int = 4304
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    out_hidden_size: int = 4096
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)


@dataclass(frozen=True)
class EdgeVisionConfig:
    """Edge's SigLIP2 vision tower and its projector into the language model."""

    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_hidden_layers: int = 27
    num_attention_heads: int = 16
    num_channels: int = 3
    patch_size: int = 16
    layer_norm_eps: float = 1e-6
    num_patches: int = 256
    spatial_merge_size: int = 2
    projector_hidden_size: int = 11520
    text_hidden_size: int = 2048
    temporal_patch_size: int = 1


@dataclass(frozen=True)
class ReasonerConfig:
    family: str  # OMNI or EDGE
    vision: QwenVisionConfig | EdgeVisionConfig | None  # None: text-only (no vision encoder in the checkpoint)
    why_no_vision: str = ""  # what is missing, for the refusal of an image
    image_token_id: int | None = None
    video_token_id: int | None = None
    vision_start_token_id: int | None = None
    vision_end_token_id: int | None = None
    end_token_ids: tuple[int, ...] = field(default=())  # generation_config.json's eos ids (the tokenizer adds its own)
    vision_weights: tuple[Path, ...] = ()  # the safetensors files holding the vision tower

    @property
    def merge(self) -> int:
        return self.vision.spatial_merge_size


def _pick(cls, raw: dict, **extra):
    names = set(cls.__dataclass_fields__)
    values = {k: v for k, v in raw.items() if k in names}
    if "deepstack_visual_indexes" in values:
        values["deepstack_visual_indexes"] = tuple(values["deepstack_visual_indexes"])
    return cls(**values, **extra)


def read_config(root: Path, family: str, text_hidden_size: int, text_layers: int) -> ReasonerConfig:
    """The Reasoner's configuration from the root config.json, checked against the generator's text tower."""
    path = root / "config.json"
    end_ids = _generation_end_ids(root)
    if not path.is_file():
        return ReasonerConfig(family, None, "it has no root config.json (the vision tower's configuration)",
                              end_token_ids=end_ids)
    raw = read_json(path)
    text = raw.get("text_config") or {}
    found = (text.get("hidden_size", text_hidden_size), text.get("num_hidden_layers", text_layers))
    if found != (text_hidden_size, text_layers):
        raise CheckpointError(f"{path}: text_config (hidden {found[0]}, {found[1]} layers) does not match "
                              f"transformer/config.json (hidden {text_hidden_size}, {text_layers} layers); the "
                              "folder mixes files of two checkpoints")
    vision_raw = raw.get("vision_config")
    ids = {name: raw.get(name) for name in ("image_token_id", "video_token_id", "vision_start_token_id",
                                           "vision_end_token_id")}
    if not vision_raw or None in ids.values():
        return ReasonerConfig(family, None, f"{path} has no vision_config or media token ids", end_token_ids=end_ids, **ids)
    if family == OMNI:
        vision = _pick(QwenVisionConfig, vision_raw)
    else:
        vision = _pick(EdgeVisionConfig, vision_raw, projector_hidden_size=raw.get("projector_hidden_size", 11520),
                       text_hidden_size=text_hidden_size)
    files = vision_files(root)
    if not files:
        return ReasonerConfig(family, None, f"{root} has no vision encoder weights ({ROOT_INDEX} naming them, or "
                              "vision_encoder/)", end_token_ids=end_ids, **ids)
    return ReasonerConfig(family, vision, end_token_ids=end_ids, vision_weights=tuple(files), **ids)


def vision_files(root: Path) -> list[Path]:
    """The safetensors files holding vision tensors: those the root index names outside transformer/, else the
    vision_encoder/ folder's files."""
    index = root / ROOT_INDEX
    if index.is_file():
        files = [root / name for name in dict.fromkeys(read_weight_map(index).values())
                 if not name.startswith("transformer/")]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"missing vision weights {', '.join(missing)} (listed in {index.name}); download "
                                  "them again")
        if files:
            return files
    folder = root / "vision_encoder"
    return sorted(folder.glob("*.safetensors")) if folder.is_dir() else []


def _generation_end_ids(root: Path) -> tuple[int, ...]:
    path = root / "generation_config.json"
    if not path.is_file():
        return ()
    eos = read_json(path).get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))


@dataclass(frozen=True)
class ProcessorConfig:
    """How images or videos become patches: the checkpoint's preprocessor_config.json or
    video_preprocessor_config.json over the family's defaults."""

    min_pixels: int
    max_pixels: int
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768


# The transformers processor classes' own defaults, per family, where the checkpoint's file is silent.
_DEFAULTS = {
    (OMNI, "image"): dict(min_pixels=65536, max_pixels=16777216, temporal_patch_size=2),
    (OMNI, "video"): dict(min_pixels=128 * 32 * 32, max_pixels=32 * 32 * 768, temporal_patch_size=2),
    (EDGE, "image"): dict(min_pixels=256 * 256, max_pixels=4096 * 4096, temporal_patch_size=1),
    (EDGE, "video"): dict(min_pixels=64 * 64, max_pixels=24 * 1024 * 1024, temporal_patch_size=1),
}
_FILES = {"image": "preprocessor_config.json", "video": "video_preprocessor_config.json"}


def read_processor(root: Path, family: str, kind: str) -> ProcessorConfig:
    values = dict(_DEFAULTS[family, kind])
    path = root / _FILES[kind]
    raw = read_json(path) if path.is_file() else {}
    size = raw.get("size") or {}
    for ours, theirs in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        values[ours] = int(size.get(theirs, raw.get(ours, values[ours])))
    for key in ("rescale_factor", "patch_size", "temporal_patch_size", "merge_size", "fps", "min_frames", "max_frames"):
        if raw.get(key) is not None:
            values[key] = raw[key]
    for ours, theirs in (("mean", "image_mean"), ("std", "image_std")):
        if raw.get(theirs) is not None:
            values[ours] = tuple(float(v) for v in raw[theirs])
    config = ProcessorConfig(**values)
    if family == EDGE and config.temporal_patch_size != 1:
        raise CheckpointError(f"{path}: Cosmos3 Edge takes temporal_patch_size 1, not {config.temporal_patch_size}")
    return config
