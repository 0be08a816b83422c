"""Calls into diffusers 0.42.1, the numerical reference, set up exactly as its pipeline does.

Inputs are packed with the pipeline's own segment builders (called on a stand-in `self`), so the
reference side of every parity test is diffusers' code end to end.
"""

from types import SimpleNamespace

import pytest
from conftest import require
import torch

diffusers = require("diffusers", minversion="0.42.1")
from diffusers import Cosmos3OmniTransformer  # noqa: E402
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline  # noqa: E402


def load_transformer(root, dtype=torch.float32):
    model, info = Cosmos3OmniTransformer.from_pretrained(
        str(root / "transformer"), torch_dtype=dtype, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()


def velocity(model, input_ids, latents, timestep, noisy_frames, fps, sound=None, action=None):
    """One diffusers forward as the pipeline packs it. `timestep` is a python int or float.

    sound: [sound_dim, T_s] latents (all noisy). action: ([T_a, Ad] latents, domain id, clean frames).
    Returns the masked velocities (vision, sound, action) like the pipeline's denoising loop sees them.
    """
    stand_in = SimpleNamespace(transformer=model, vae_scale_factor_temporal=4)
    T = latents.shape[2]
    conditioned = [f for f in range(T) if f not in noisy_frames]
    text = Cosmos3OmniPipeline._prepare_text_segment(stand_in, list(input_ids), "cpu")
    offset = text["vision_start_temporal_offset"]
    vision = Cosmos3OmniPipeline._prepare_vision_segment(
        stand_in, latents, bool(conditioned), offset, fps, text["und_len"], "cpu", condition_frame_indexes=conditioned
    )
    curr = text["und_len"] + vision["num_vision_tokens"]
    segments = [text["text_mrope_ids"], vision["vision_mrope_ids"]]
    kwargs = {}
    if sound is not None:
        seg = Cosmos3OmniPipeline._prepare_sound_segment(
            stand_in, sound, offset, float(model.config.sound_latent_fps), curr, "cpu"
        )
        curr += seg["sound_len"]
        segments.append(seg["sound_mrope_ids"])
        kwargs.update(
            sound_tokens=[sound.to(model.dtype)],
            sound_timesteps=torch.full((seg["sound_len"],), timestep),
            **{k: seg[k] for k in ("sound_token_shapes", "sound_sequence_indexes", "sound_mse_loss_indexes",
                                   "sound_noisy_frame_indexes")},
        )
    if action is not None:
        action_latents, domain, action_clean = action
        seg = Cosmos3OmniPipeline._prepare_action_segment(
            stand_in, action_latents, list(action_clean), offset, fps, curr, "cpu"
        )
        curr += seg["action_len"]
        segments.append(seg["action_mrope_ids"])
        kwargs.update(
            action_tokens=[action_latents.to(model.dtype)],
            action_timesteps=torch.full((seg["num_noisy_action_tokens"],), timestep),
            action_domain_ids=[torch.tensor(domain)],
            **{k: seg[k] for k in ("action_token_shapes", "action_sequence_indexes", "action_mse_loss_indexes",
                                   "action_noisy_frame_indexes")},
        )
    with torch.no_grad():
        preds = model(
            input_ids=text["input_ids"],
            text_indexes=text["text_indexes"],
            position_ids=torch.cat(segments, dim=1),
            und_len=text["und_len"],
            sequence_length=curr,
            vision_tokens=[latents.to(model.dtype)],
            vision_token_shapes=vision["vision_token_shapes"],
            vision_sequence_indexes=vision["vision_sequence_indexes"],
            vision_mse_loss_indexes=vision["vision_mse_loss_indexes"],
            vision_timesteps=torch.full((vision["num_noisy_vision_tokens"],), timestep),
            vision_noisy_frame_indexes=vision["vision_noisy_frame_indexes"],
            return_dict=False,
            **kwargs,
        )
    vision_v, sound_v, action_v = preds
    return vision_v[0], sound_v[0] if sound_v else None, action_v[0] if action_v else None


def omni_pipeline(root, schedule="checkpoint"):
    """diffusers' task pipeline on a tiny checkpoint: the shipped scheduler, or flow UniPC with shift 10."""
    from diffusers import UniPCMultistepScheduler

    pipe = Cosmos3OmniPipeline.from_pretrained(str(root), torch_dtype=torch.float32, enable_safety_checker=False)
    if schedule == "unipc":
        pipe.scheduler = UniPCMultistepScheduler.from_config(
            pipe.scheduler.config, flow_shift=10.0, use_karras_sigmas=False
        )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def distilled_pipeline(root):
    """diffusers' distilled modular pipeline, loaded from the checkpoint's modular_model_index.json."""
    from diffusers import ModularPipeline

    pipe = ModularPipeline.from_pretrained(str(root))
    pipe.load_components(torch_dtype=torch.float32)
    return pipe


def transfer_pipeline(root, dtype=torch.float32):
    """diffusers' modular Cosmos3OmniBlocks (the only place its transfer lives) on a tiny checkpoint, with flow UniPC
    at shift 10 (no Karras sigmas), as NVIDIA's transfer recipe sets it up."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler
    from diffusers.modular_pipelines.cosmos import Cosmos3OmniBlocks
    from transformers import AutoTokenizer

    pipe = Cosmos3OmniBlocks().init_pipeline()
    shipped = UniPCMultistepScheduler.from_pretrained(str(root / "scheduler"))
    pipe.update_components(
        transformer=load_transformer(root, dtype),
        vae=AutoencoderKLWan.from_pretrained(str(root / "vae"), torch_dtype=dtype),
        scheduler=UniPCMultistepScheduler.from_config(shipped.config, flow_shift=10.0, use_karras_sigmas=False),
        text_tokenizer=AutoTokenizer.from_pretrained(str(root / "text_tokenizer")),
    )
    pipe.disable_safety_checker()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def transfer_tokens(pipe, prompt: str) -> list[int]:
    """The token ids diffusers' transfer text step makes of a prompt."""
    from diffusers.modular_pipelines.cosmos.encoders import Cosmos3TransferTextStep
    from diffusers.modular_pipelines.modular_pipeline import PipelineState

    state = PipelineState()
    for name, value in {"prompt": prompt, "negative_prompt": None, "use_system_prompt": True}.items():
        state.set(name, value)
    _, state = Cosmos3TransferTextStep()(pipe, state)
    return list(state.get("cond_input_ids"))
