"""The root files of a tiny checkpoint that make it a transformers Reasoner too (see `cosmos3_runtime.tiny`).

As released: a root config.json (`cosmos3_omni` or `cosmos3_edge`), a root model.safetensors.index.json
naming the transformer shards and `vision_encoder/model.safetensors`, the tokenizer and a multimodal
chat template at the root, the image and video processor settings, and generation_config.json.
"""

import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from .config import EDGE, OMNI, ROOT_INDEX, EdgeVisionConfig, QwenVisionConfig
from .vision_edge import EdgeVisionTower
from .vision_qwen import QwenVisionTower

_CONTENT = (
    "{%- if message['content'] is string -%}{{ message['content'] }}{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' -%}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
)
_TURNS = ("{%- for message in messages -%}{{ '<|im_start|>' + message['role'] + '\\n' }}" + _CONTENT
          + "{{ '<|im_end|>\\n' }}{%- endfor -%}")
CHAT_TEMPLATES = {
    # Qwen3-VL-Instruct style: no default system prompt; thinking is asked for in the question.
    OMNI: _TURNS + "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}",
    # Edge opens a thinking block unless enable_thinking is false.
    EDGE: _TURNS + "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{ '<think></think>' }}"
    "{%- else -%}{{ '<think>\\n' }}{%- endif -%}{%- endif -%}",
}
TINY_VISION = {
    OMNI: QwenVisionConfig(depth=3, hidden_size=32, num_heads=2, intermediate_size=64, num_position_embeddings=64,
                           deepstack_visual_indexes=(0, 1)),
    EDGE: EdgeVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           num_patches=16, projector_hidden_size=96),
}
# Small pixel budgets: a few dozen vision tokens per image or clip.
IMAGE_SIZE = {"shortest_edge": 64 * 64, "longest_edge": 192 * 192}
VIDEO_SIZE = {"shortest_edge": 64 * 64, "longest_edge": 8 * 96 * 96}


def vision_config_dict(family: str, text_hidden: int) -> dict:
    c = TINY_VISION[family]
    if family == OMNI:
        return {"model_type": "qwen3_vl_vision", "depth": c.depth, "hidden_size": c.hidden_size, "num_heads": c.num_heads,
                "intermediate_size": c.intermediate_size, "hidden_act": "gelu_pytorch_tanh", "in_channels": 3,
                "patch_size": c.patch_size, "temporal_patch_size": c.temporal_patch_size,
                "spatial_merge_size": c.spatial_merge_size, "out_hidden_size": text_hidden,
                "num_position_embeddings": c.num_position_embeddings,
                "deepstack_visual_indexes": list(c.deepstack_visual_indexes)}
    return {"model_type": "cosmos3_edge_vision", "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
            "num_channels": 3, "patch_size": c.patch_size, "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": c.layer_norm_eps, "num_patches": c.num_patches,
            "spatial_merge_size": c.spatial_merge_size}


def root_config(family: str, transformer: dict, token_ids: dict) -> dict:
    """The root config.json transformers reads, with the tiny transformer's text dimensions."""
    t = transformer
    text = {"hidden_size": t["hidden_size"], "num_hidden_layers": t["num_hidden_layers"],
            "num_attention_heads": t["num_attention_heads"], "num_key_value_heads": t["num_key_value_heads"],
            "head_dim": t["head_dim"], "intermediate_size": t["intermediate_size"], "vocab_size": t["vocab_size"],
            "rms_norm_eps": t["rms_norm_eps"], "tie_word_embeddings": False, "attention_bias": False,
            "max_position_embeddings": 32768, "eos_token_id": token_ids["eos"]}
    axes = t.get("rope_axes_dim", [24, 20, 20])
    if family == OMNI:
        text.update(model_type="qwen3_vl_text", hidden_act="silu",
                    rope_parameters={"rope_type": "default", "rope_theta": t["rope_theta"], "mrope_section": axes,
                                     "mrope_interleaved": True})
        head = {"model_type": "cosmos3_omni", "architectures": ["Cosmos3OmniForConditionalGeneration"]}
    else:
        text.update(model_type="cosmos3_edge_text", hidden_act="relu2", bos_token_id=None, pad_token_id=None,
                    rope_parameters={"rope_type": "default", "rope_theta": t["rope_theta"], "mrope_section": axes})
        head = {"model_type": "cosmos3_edge", "architectures": ["Cosmos3EdgeForConditionalGeneration"],
                "projector_hidden_size": TINY_VISION[EDGE].projector_hidden_size}
    return {**head, "text_config": text, "vision_config": vision_config_dict(family, t["hidden_size"]),
            "image_token_id": token_ids["image"], "video_token_id": token_ids["video"],
            "vision_start_token_id": token_ids["vision_start"], "vision_end_token_id": token_ids["vision_end"],
            "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def processor_files(family: str) -> dict[str, dict]:
    if family == OMNI:
        image = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 16, "temporal_patch_size": 2,
                 "merge_size": 2}
        video = {"video_processor_type": "Qwen3VLVideoProcessor", "patch_size": 16, "temporal_patch_size": 2,
                 "merge_size": 2, "cap_pixels_per_frame": False}
        processor = {"processor_class": "Qwen3VLProcessor"}
    else:
        image = {"image_processor_type": "Cosmos3EdgeImageProcessor", "patch_size": 16, "temporal_patch_size": 1,
                 "merge_size": 2}
        video = {"video_processor_type": "Cosmos3EdgeVideoProcessor", "patch_size": 16, "temporal_patch_size": 1,
                 "merge_size": 2}
        processor = {"processor_class": "Cosmos3EdgeProcessor", "video_processor": {"return_metadata": True}}
    common = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_rescale": True,
              "rescale_factor": 1 / 255, "do_normalize": True, "do_resize": True, "resample": 3, "do_convert_rgb": True}
    image.update(common, size=IMAGE_SIZE)
    video.update(common, size=VIDEO_SIZE, fps=2, min_frames=4, max_frames=768, do_sample_frames=True)
    return {"preprocessor_config.json": image, "video_preprocessor_config.json": video,
            "processor_config.json": processor}


def random_vision_weights(module: torch.nn.Module, generator: torch.Generator) -> dict[str, torch.Tensor]:
    tensors = {}
    for name, p in module.named_parameters():
        value = torch.randn(p.shape, generator=generator)
        if p.ndim == 1:
            value = 0.1 * value if name.endswith("bias") else 1.0 + 0.1 * value
        elif "pos" not in name and "position" not in name:
            value = value / math.sqrt(p[0].numel())
        tensors[name] = value
    return tensors


def write_reasoner_files(root: Path, family: str, transformer: dict, seed: int, dtype: torch.dtype) -> None:
    from tokenizers import Tokenizer

    shutil.copy(root / "text_tokenizer" / "tokenizer.json", root / "tokenizer.json")
    tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    ids = {name: tokenizer.token_to_id(token) for name, token in (
        ("image", "<|image_pad|>"), ("video", "<|video_pad|>"), ("vision_start", "<|vision_start|>"),
        ("vision_end", "<|vision_end|>"), ("eos", "<|im_end|>"), ("pad", "<|endoftext|>"))}
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
                        "pad_token": "<|endoftext|>", "model_max_length": 32768,
                        "clean_up_tokenization_spaces": False}
    files = {"config.json": root_config(family, transformer, ids), "tokenizer_config.json": tokenizer_config,
             "generation_config.json": {"eos_token_id": [ids["eos"], ids["pad"]], "pad_token_id": ids["pad"],
                                        "do_sample": False},
             **processor_files(family)}
    for name, content in files.items():
        (root / name).write_text(json.dumps(content, indent=2))
    (root / "chat_template.jinja").write_text(CHAT_TEMPLATES[family])

    config = TINY_VISION[family]
    if family == OMNI:
        config = QwenVisionConfig(**{**config.__dict__, "out_hidden_size": transformer["hidden_size"]})
        tower, prefix = QwenVisionTower(config), ""
    else:
        config = EdgeVisionConfig(**{**config.__dict__, "text_hidden_size": transformer["hidden_size"]})
        tower, prefix = EdgeVisionTower(config), "model."
    generator = torch.Generator().manual_seed(seed + 3)
    vision = {prefix + name: v.to(dtype).contiguous() for name, v in random_vision_weights(tower, generator).items()}
    (root / "vision_encoder").mkdir(exist_ok=True)
    save_file(vision, str(root / "vision_encoder" / "model.safetensors"), metadata={"format": "pt"})

    transformer_index = json.loads((root / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    weight_map = {key: f"transformer/{file}" for key, file in transformer_index["weight_map"].items()}
    weight_map.update(dict.fromkeys(vision, "vision_encoder/model.safetensors"))
    total = transformer_index["metadata"]["total_size"] + sum(t.numel() * t.element_size() for t in vision.values())
    (root / ROOT_INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
