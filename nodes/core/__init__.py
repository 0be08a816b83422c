"""Cosmos3 on ComfyUI's core path: the loaded checkpoint as a core MODEL and VAE, its CONDITIONING, and LoRAs.

- `nodes`: Cosmos3 Core Model, Cosmos3 Text Encode (core), Cosmos3 Condition Frames (core).
- `lora`: Cosmos3 LoRA Loader (core).
- `model`: the MODEL (a BaseModel around the loaded transformer) and its patcher; imports ComfyUI.
- `vae`: the checkpoint's VAE as ComfyUI's Wan 2.2 VAE; imports ComfyUI when one is built.
- `prompt_marker`: what a Cosmos3 CONDITIONING holds (no ComfyUI import).
"""
