"""The checkpoint's Wan 2.2 VAE as a core ComfyUI VAE (VAE Decode, VAE Encode, tiled decode, Wan22ImageToVideoLatent).

The checkpoint stores diffusers' `AutoencoderKLWan` names; ComfyUI's Wan 2.2 VAE names the same
tensors after the original Wan code (`residual.N`, `middle.N`, `downsamples.i.downsamples.j` ...).
`comfy_keys` renames one to the other; no tensor changes.

ComfyUI 0.33 builds its Wan 2.2 VAE at the released widths only (base 160, decoder 256). A checkpoint
whose vae/config.json has other widths (the pack's tiny test checkpoints) gets ComfyUI's own class
built at the config's widths, through the same `comfy.sd.VAE` constructor, so everything else about
it (dtype choice, memory estimates, tiling, its model patcher) is core behaviour.

ComfyUI is imported when a VAE is built, not with this module (the renaming is tested without it).
"""

import re
from contextlib import contextmanager

from ...cosmos3_runtime.vae import VAEConfig, WanVAE

RESIDUAL = {"norm1.gamma": "residual.0.gamma", "conv1.": "residual.2.", "norm2.gamma": "residual.3.gamma",
            "conv2.": "residual.6.", "conv_shortcut.": "shortcut."}
TOP_LEVEL = {"quant_conv.": "conv1.", "post_quant_conv.": "conv2."}
ENDS = {"conv_in.": "conv1.", "conv_out.": "head.2.", "norm_out.gamma": "head.0.gamma"}


def _residual(tail: str) -> str:
    for old, new in RESIDUAL.items():
        if tail.startswith(old):
            return new + tail[len(old):]
    raise KeyError(tail)


def comfy_key(key: str, num_res_blocks: int) -> str:
    """The ComfyUI Wan 2.2 name of one diffusers AutoencoderKLWan key."""
    for old, new in TOP_LEVEL.items():
        if key.startswith(old):
            return new + key[len(old):]
    part, rest = key.split(".", 1)  # encoder / decoder
    for old, new in ENDS.items():
        if rest.startswith(old):
            return f"{part}.{new}{rest[len(old):]}"
    if m := re.match(r"mid_block\.resnets\.(\d)\.(.+)", rest):
        return f"{part}.middle.{2 * int(m[1])}.{_residual(m[2])}"
    if m := re.match(r"mid_block\.attentions\.0\.(.+)", rest):
        return f"{part}.middle.1.{m[1]}"
    if m := re.match(r"(down|up)_blocks\.(\d+)\.resnets\.(\d+)\.(.+)", rest):
        stage = f"{m[1]}samples"
        return f"{part}.{stage}.{m[2]}.{stage}.{m[3]}.{_residual(m[4])}"
    if m := re.match(r"(down|up)_blocks\.(\d+)\.(down|up)sampler\.(.+)", rest):
        stage = f"{m[1]}samples"
        index = num_res_blocks + (1 if m[1] == "up" else 0)  # the decoder's up blocks hold one more resblock
        return f"{part}.{stage}.{m[2]}.{stage}.{index}.{m[4]}"
    raise KeyError(key)


def comfy_keys(state_dict: dict, config: VAEConfig) -> dict:
    return {comfy_key(k, config.num_res_blocks): v for k, v in state_dict.items()}


@contextmanager
def _wan22_widths(widths: dict):
    """Have comfy.sd.VAE build its Wan 2.2 class at `widths` (it passes the released ones; at those, nothing changes)."""
    import comfy.ldm.wan.vae2_2

    released = comfy.ldm.wan.vae2_2.WanVAE
    comfy.ldm.wan.vae2_2.WanVAE = lambda **options: released(**{**options, **widths})
    try:
        yield
    finally:
        comfy.ldm.wan.vae2_2.WanVAE = released


def core_vae(vae: WanVAE):
    """A core VAE holding the pack VAE's weights (its own copy, in the dtype ComfyUI picks, managed by ComfyUI)."""
    import comfy.sd

    config = vae.config
    widths = {"dim": config.base_dim, "dec_dim": config.decoder_dim, "dim_mult": list(config.dim_mult),
              "num_res_blocks": config.num_res_blocks, "temperal_downsample": list(config.temperal_downsample)}
    state_dict = comfy_keys(vae.state_dict(), config)
    with _wan22_widths(widths):
        vae = comfy.sd.VAE(sd=state_dict)
    return vae
