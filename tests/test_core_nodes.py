"""The core-path nodes without ComfyUI: the CONDITIONING they build, the marker in it, the sigmas, the
noise mask, and the VAE key renaming. (test_comfyui_core.py samples with them inside a real ComfyUI.)"""

import copy
import importlib

import pytest
import torch

from cosmos3_runtime.tiny import vae_config
from cosmos3_runtime.vae import VAEConfig, WanVAE


def test_text_encode_makes_a_positive_and_a_negative_prompt(pack):
    positive, negative = pack.Cosmos3CoreTextEncode().encode("a cat", "blurry", "off", False, True, True, 16.0)
    (marker, meta), = positive
    prompt = meta["cosmos3_prompt"]
    assert (prompt.text, prompt.negative, prompt.fps) == ("a cat", False, 16.0)
    assert prompt.options == {"use_system_prompt": False, "add_resolution_template": False,
                              "add_duration_template": True, "json_captions": True}
    assert negative[0][1]["cosmos3_prompt"].negative and negative[0][1]["cosmos3_prompt"].text == "blurry"
    assert marker.shape == (1, 1, 1)


def test_the_marker_can_be_measured_and_copied_but_not_computed_with(pack):
    """ComfyUI's caches size their entries (numel * element_size) and deep-copy conditionings; everything
    that would compute with it (ConditioningZeroOut, Concat, Average, another model's cast) stops with a message."""
    (marker, _), = pack.Cosmos3CoreTextEncode().encode("a cat", "", "auto", True, True, True, 24.0)[0]
    assert marker.numel() * marker.element_size() == 4 and marker.device.type == "cpu" and marker.ndim == 3
    assert copy.deepcopy(marker) is marker
    for compute in (torch.zeros_like, lambda m: torch.cat((m, m), 1), lambda m: m * 0.5 + m,
                    lambda m: m.to(torch.float16), lambda m: m == m):
        with pytest.raises(RuntimeError, match="holds a prompt, not text embeddings.*only a Cosmos3 MODEL"):
            compute(marker)


def test_scheduler_sigmas_are_the_grid_the_pack_sampler_walks(pack, models_dir):
    from cosmos3_runtime.schedulers import distilled_schedule, unipc_schedule
    from cosmos3_runtime.tiny import DISTILLED_SIGMAS

    schedule, sigmas = pack.Cosmos3Scheduler().build("auto", 6, 0.0)
    assert schedule == {"schedule": "auto", "steps": 6, "flow_shift": None}
    assert torch.equal(sigmas, unipc_schedule(6, 10.0).sigmas)  # no model: a multi-step checkpoint's video default
    _, image = pack.Cosmos3Scheduler().build("auto", 6, 0.0, latent={"samples": torch.zeros(1, 48, 1, 3, 4)})
    assert torch.equal(image, unipc_schedule(6, 3.0).sigmas)  # a 1-frame latent: the image default
    model, _, _ = pack.Cosmos3ModelLoader().load("Cosmos3-Super-Text2Image-4Step", "fp32", "default")["result"]
    _, distilled = pack.Cosmos3Scheduler().build("auto", 0, 0.0, model=model)
    assert torch.equal(distilled, distilled_schedule(tuple(DISTILLED_SIGMAS), True).sigmas)
    _, needs_model = pack.Cosmos3Scheduler().build("checkpoint", 4, 0.0)  # the schedule output still works
    with pytest.raises(RuntimeError, match="connect the model"):
        needs_model * 1.0


def test_condition_frames_sets_the_noise_mask(pack):
    latent = {"samples": torch.zeros(1, 48, 4, 3, 4), "noise_mask": torch.ones(1, 1, 4, 3, 4)}
    latent["noise_mask"][:, :, 3] = 0  # a frame another node keeps clean stays clean
    (masked,) = pack.Cosmos3ConditionFrames().mask(latent, "0,1")
    assert masked["noise_mask"][0, 0, :, 0, 0].tolist() == [0.0, 0.0, 1.0, 0.0]
    assert masked["samples"] is latent["samples"]
    assert pack.Cosmos3ConditionFrames.VALIDATE_INPUTS("one") is not True
    with pytest.raises(pack.vae.InputError, match="at least 5 latent frames"):
        pack.Cosmos3ConditionFrames().mask(latent, "4")


def test_core_model_refuses_what_only_the_pack_sampler_does(pack, models_dir):
    model, _, _ = pack.Cosmos3ModelLoader().load("Cosmos3-Edge", "fp32", "default", blocks_to_swap=1)["result"]
    with pytest.raises(pack.vae.InputError, match="blocks_to_swap are the Cosmos3 Sampler's"):
        pack.Cosmos3CoreModel().build(model)


def test_vae_keys_are_renamed_one_to_one(pack):
    config = VAEConfig.from_dict(vae_config(0))
    state = WanVAE(config).state_dict()
    renamed = importlib.import_module(pack.__name__ + ".core.vae").comfy_keys(state, config)
    assert len(renamed) == len(state)
    expected = {  # ComfyUI's Wan 2.2 names (comfy/ldm/wan/vae2_2.py) of a few diffusers keys
        "quant_conv.weight": "conv1.weight",
        "decoder.norm_out.gamma": "decoder.head.0.gamma",
        "encoder.conv_out.bias": "encoder.head.2.bias",
        "encoder.mid_block.resnets.1.conv2.weight": "encoder.middle.2.residual.6.weight",
        "decoder.mid_block.attentions.0.to_qkv.weight": "decoder.middle.1.to_qkv.weight",
        "encoder.down_blocks.1.resnets.0.conv_shortcut.bias": "encoder.downsamples.1.downsamples.0.shortcut.bias",
        "encoder.down_blocks.0.downsampler.resample.1.weight": "encoder.downsamples.0.downsamples.2.resample.1.weight",
        "decoder.up_blocks.0.upsampler.time_conv.weight": "decoder.upsamples.0.upsamples.3.time_conv.weight",
        "decoder.up_blocks.2.resnets.2.norm1.gamma": "decoder.upsamples.2.upsamples.2.residual.0.gamma",
    }
    for ours, theirs in expected.items():
        assert renamed[theirs] is state[ours]
