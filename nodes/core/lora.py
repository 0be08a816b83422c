"""Cosmos3 LoRA Loader (core): a LoRA from ComfyUI's loras folder onto a Cosmos3 MODEL through ComfyUI's own
weight patches, whatever key prefix its trainer wrote."""

import torch

from ...cosmos3_runtime import InputError
from ...cosmos3_runtime.weights.fp8 import FP8
from .. import services

NO_LORAS = "(no .safetensors LoRAs in models/loras)"

# Where LoRA trainers put the transformer's own parameter names (diffusers and PEFT write the first two).
LORA_PREFIXES = ("base_model.model.transformer.", "base_model.model.", "transformer.", "diffusion_model.")
LORA_SUFFIXES = (".lora_A.default.weight", ".lora_B.default.weight", ".lora_A.weight", ".lora_B.weight",
                 ".lora_down.weight", ".lora_up.weight", ".lora.down.weight", ".lora.up.weight", ".alpha",
                 ".dora_scale", ".diff")
OTHER_ARCHITECTURES = {"double_blocks.": "Flux", "single_blocks.": "Flux", "lora_unet_down_blocks": "Stable Diffusion",
                       "lora_te": "Stable Diffusion", "cross_attn.": "Wan", "transformer_blocks.": "a DiT such as "
                       "SD3, HunyuanVideo or LTX"}


def lora_key(key: str) -> str:
    """A LoRA key in ComfyUI's diffusion_model.* form (a trainer's prefix replaced; the adapter suffix kept)."""
    for prefix in LORA_PREFIXES:
        if key.startswith(prefix):
            return "diffusion_model." + key[len(prefix):]
    return "diffusion_model." + key


def lora_module(key: str) -> str:
    """The module a diffusion_model.* LoRA key patches (its adapter suffix removed)."""
    return next((key[: -len(s)] for s in LORA_SUFFIXES if key.endswith(s)), key)


class Cosmos3LoraLoader:
    DESCRIPTION = ("A LoRA on a Cosmos3 MODEL, from ComfyUI's loras folder: keys as diffusers / PEFT training writes "
                   "them (transformer.*, base_model.model.*) or as ComfyUI's own LoRA loader reads them "
                   "(diffusion_model.*). Reports how many modules it patched and what it could not place.")
    CATEGORY = "cosmos3/core"
    RETURN_TYPES = ("MODEL", "STRING")
    RETURN_NAMES = ("model", "report")
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": ("MODEL", {"tooltip": "a Cosmos3 MODEL (Cosmos3 Core Model)"}),
                "lora_name": (services.files.lora_names() or [NO_LORAS], {"tooltip": "a .safetensors file in models/loras"}),
                "strength": ("FLOAT", {"default": 1.0, "min": -100.0, "max": 100.0, "step": 0.01}),
            }
        }

    def load(self, model, lora_name, strength):
        import comfy.lora

        if lora_name == NO_LORAS:
            raise InputError("no LoRA selected: put .safetensors LoRAs in ComfyUI/models/loras")
        lora = {lora_key(k): v for k, v in services.files.read_lora(lora_name).items()}
        key_map = comfy.lora.model_lora_keys_unet(model.model, {})
        unplaced = sorted(k for k in lora if lora_module(k) not in key_map)
        if len(unplaced) == len(lora):
            looks = next((name for marker, name in OTHER_ARCHITECTURES.items() if any(marker in k for k in lora)), None)
            raise InputError(f"none of the {len(lora)} keys of {lora_name} names a Cosmos3 module (first: "
                             f"{unplaced[0]!r})" + (f"; it looks like a LoRA for {looks}" if looks else ""))
        patches = comfy.lora.load_lora(lora, key_map, log_missing=False)
        weights = model.model.state_dict()
        for target, adapter in patches.items():
            if weights[target].dtype in (torch.uint8, FP8):  # GGUF blocks, NVFP4 or fp8 values, not the weight
                raise InputError(f"{lora_name}: {target} is stored quantized ({weights[target].dtype}: a GGUF, "
                                 "NVFP4 or fp8 model), where a LoRA cannot be added; load the checkpoint's bf16 "
                                 "weights for LoRAs")
            up, down = getattr(adapter, "weights", (None, None))[:2]
            shape = tuple(weights[target].shape)
            if up is not None and down is not None and (up.shape[0], down.shape[-1]) != shape[:1] + shape[-1:]:
                raise InputError(f"{lora_name}: the LoRA for {target} is {list(up.shape)} x {list(down.shape)}, which "
                                 f"does not fit the weight {list(shape)}; it was trained for another model size")
        patched = model.clone()
        patched.add_patches(patches, strength)
        report = f"{lora_name}: {len(patches)} modules patched at strength {strength:g}"
        if unplaced:
            report += f"; {len(unplaced)} keys not placed: {', '.join(unplaced[:5])}" + (" ..." if len(unplaced) > 5 else "")
            services.log.warning("Cosmos3 LoRA %s", report)
        return {"ui": {"text": [report]}, "result": (patched, report)}
