"""A stand-in for ComfyUI 0.33's `sample_ar_video` (comfy/k_diffusion/sampling.py), written line by line from it, the
model call being the core MODEL's on a `causal_run.HostBlocks` (t = 1000 sigma, the velocity turned into
x0 = x - sigma v): its K/V `end` contract, the initial latent's sigma-0 pass (ARVideoI2V), the re-noising seeds and
the sigma-0 commit pass. `test_comfyui_core.py` runs the real sampler."""

import torch


def sample_ar_video(blocks, x, sigmas, seed, num_frame_per_block, cache=None, initial_latent=None):
    def model(x, sigma):
        return x - sigma * blocks.forward(x, sigma * 1000.0, cache, start)

    _, _, lat_t, lat_h, lat_w = x.shape
    frame_seq_len = -(-lat_h // 2) * -(-lat_w // 2)
    num_blocks = -(-lat_t // num_frame_per_block)
    cache = {"end": 0} if cache is None else cache
    output, start = torch.zeros_like(x), 0
    if initial_latent is not None:
        output[:, :, : initial_latent.shape[2]] = initial_latent
        model(initial_latent, sigmas.new_zeros([]))
        start = initial_latent.shape[2]
        num_blocks = -(-(lat_t - start) // num_frame_per_block)
    for block_idx in range(num_blocks):
        bf = min(num_frame_per_block, lat_t - start)
        noisy = x[:, :, start : start + bf]
        for i in range(len(sigmas) - 1):
            denoised = model(noisy, sigmas[i])
            if sigmas[i + 1] == 0:
                noisy = denoised
            else:
                torch.manual_seed(seed + block_idx * 1000 + i)
                noisy = (1.0 - sigmas[i + 1]) * denoised + sigmas[i + 1] * torch.randn_like(denoised)
                cache["end"] -= bf * frame_seq_len
        output[:, :, start : start + bf] = noisy
        cache["end"] -= bf * frame_seq_len
        model(noisy, sigmas.new_zeros([]))
        start += bf
    return output
