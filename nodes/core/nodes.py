"""Nodes for the core ComfyUI path: a Cosmos3 checkpoint as core MODEL and VAE, its CONDITIONING, and the
latent frame choice for video-to-video. Sampling itself is ComfyUI's (KSampler, SamplerCustomAdvanced).

The pack's own sampler stays the path with serving-stack parity, the image guidance interval, action,
sound and multi-GPU; what the core path cannot do is refused here with a message saying so.
"""

import torch

from ...cosmos3_runtime import InputError, Request
from ...cosmos3_runtime.causal_run import first_image_latents
from ...cosmos3_runtime.geometry import latent_frames
from ...cosmos3_runtime.request import help_of, parse_frame_indexes
from ...cosmos3_runtime.settings import resolve as resolve_settings
from .. import services
from ..prompting import prompt_inputs, prompt_options
from .prompt_marker import ACTION_KEY, CONTROLS, CONTROLS_KEY, CorePrompt, conditioning


class Cosmos3CoreModel:
    DESCRIPTION = ("The loaded Cosmos3 checkpoint as a core MODEL and VAE, for ComfyUI's own sampling nodes (KSampler, "
                   "SamplerCustomAdvanced, ModelSamplingSD3) and VAE nodes (VAE Decode, VAE Encode, "
                   "Wan22ImageToVideoLatent). The MODEL uses the loaded weights; the VAE is ComfyUI's Wan 2.2 VAE "
                   "with the checkpoint's weights (its own copy).")
    CATEGORY = "cosmos3/core"
    RETURN_TYPES = ("MODEL", "VAE")
    RETURN_NAMES = ("model", "vae")
    OUTPUT_TOOLTIPS = ("a core MODEL: flow matching, shift 10 (Edge 3, distilled 1; change it with ModelSamplingSD3)",
                       "a core VAE: ComfyUI's Wan 2.2 VAE")
    FUNCTION = "build"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("COSMOS3_MODEL", {"tooltip": "from Cosmos3 Model Loader"})},
                "optional": {"compile": ("BOOLEAN", {"default": True, "tooltip": help_of("compile") + ". This "
                             "switch: on is auto, off is off (for TorchCompileModel, which compiles the whole "
                             "network)"})}}

    def build(self, model, compile=True):
        spec = model.spec
        if spec.gpus > 1:
            raise InputError("the core MODEL runs on one GPU: multi-GPU (gpus > 1) is the Cosmos3 Sampler's; set "
                             "gpus to 1 on the loader or sample with Cosmos3 Sampler")
        if spec.runtime_placement:
            raise InputError("offload_text and blocks_to_swap are the Cosmos3 Sampler's memory savers; the core "
                             "MODEL is placed by ComfyUI's memory manager (start ComfyUI with --lowvram or "
                             "--reserve-vram to stream layers), so turn them off on the loader")
        pipe = model.pipeline
        if not pipe.local:
            raise InputError("the core MODEL needs the checkpoint loaded in this process (gpus 1)")
        from .model import COMPILE
        from .vae import core_vae

        patcher = model.model_patcher()
        if not compile:  # on a copy: the loader's MODEL stays as it is for other branches of the graph
            patcher = patcher.clone()
            patcher.model_options.setdefault("transformer_options", {})[COMPILE] = False
        return (patcher, core_vae(pipe.vae))


class Cosmos3CoreTextEncode:
    DESCRIPTION = ("A Cosmos3 prompt and negative prompt as core CONDITIONING, for a Cosmos3 MODEL (Cosmos3 Core "
                   "Model). Token ids are made at sampling time from the latent's size and frame count, with the "
                   "same metadata (resolution, duration and fps, JSON captions, system prompt) as Cosmos3 Sampler.")
    CATEGORY = "cosmos3/core"
    RETURN_TYPES = ("CONDITIONING", "CONDITIONING")
    RETURN_NAMES = ("positive", "negative")
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                **prompt_inputs("the latent's size and frame count and this node's fps"),
                "fps": ("FLOAT", {"default": 24.0, "min": 1.0, "max": 240.0, "step": 0.5,
                        "tooltip": "the video's frame rate: the duration metadata and the model's fps input"}),
            }
        }

    def encode(self, prompt, negative_prompt, system_prompt, resolution_template, duration_template, json_captions,
               fps):
        options = prompt_options(system_prompt, resolution_template, duration_template, json_captions)
        positive = conditioning(CorePrompt(prompt, False, float(fps), options))
        negative = conditioning(CorePrompt(negative_prompt, True, float(fps), options))
        return (positive, negative)


class Cosmos3ConditionFrames:
    DESCRIPTION = ("Video-to-video on the core path: keep the chosen latent frames of a LATENT (VAE Encode of a clip, "
                   "or Wan22ImageToVideoLatent) clean while the sampler makes the rest, through the LATENT's noise mask.")
    CATEGORY = "cosmos3/core"
    RETURN_TYPES = ("LATENT",)
    RETURN_NAMES = ("latent",)
    FUNCTION = "mask"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "samples": ("LATENT",),
                "condition_frames": ("STRING", {"default": "0,1", "tooltip": help_of("condition_frame_indexes")}),
            }
        }

    @classmethod
    def VALIDATE_INPUTS(cls, condition_frames):
        return services.words.validation(lambda: parse_frame_indexes(condition_frames), condition_frames)

    def mask(self, samples, condition_frames):
        latents = samples["samples"]
        frames = parse_frame_indexes(condition_frames)
        if latents.ndim != 5 or frames[-1] >= latents.shape[2]:
            raise InputError(f"condition frames {list(frames)} need a video LATENT with at least {frames[-1] + 1} "
                             f"latent frames; this one is {list(latents.shape)}")
        b, _, t, h, w = latents.shape
        mask = torch.ones(b, 1, t, h, w)
        mask[:, :, list(frames)] = 0.0
        if samples.get("noise_mask") is not None:  # frames another node already keeps clean stay clean
            mask = torch.minimum(mask, samples["noise_mask"].reshape(b, -1, t, h, w)[:, :1].float().cpu())
        return ({**samples, "noise_mask": mask},)


class Cosmos3CoreSimControl:
    DESCRIPTION = ("A causal Sim-Transfer checkpoint's control clip for ComfyUI's SamplerARVideo: one control from a "
                   "Cosmos3 control node (edge, blur, depth or segmentation), attached to the positive conditioning "
                   "of Cosmos3 Text Encode (core). Sample with SamplerCustomAdvanced, BasicGuider, SamplerARVideo "
                   "(num_frame_per_block 1) and Cosmos3 Scheduler's sigmas.")
    CATEGORY = "cosmos3/core"
    RETURN_TYPES = ("CONDITIONING",)
    RETURN_NAMES = ("positive",)
    FUNCTION = "attach"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"positive": ("CONDITIONING",),
                             "controls": (CONTROLS, {"tooltip": "one control from a Cosmos3 control node"})}}

    def attach(self, positive, controls):
        return ([[marker, {**options, CONTROLS_KEY: controls}] for marker, options in positive],)


class Cosmos3CoreSimActions:
    DESCRIPTION = ("A causal Sim-Bimanual checkpoint's first image and actions for ComfyUI's SamplerARVideo, from Cosmos3 "
                   "Action (forward_dynamics): the MODEL with the image as latent frame 0 (what ARVideoI2V sets, "
                   "resized and encoded as the pack's rollout does), the positive conditioning with the actions, and "
                   "the empty latent they fill: 1 + N frames for N actions, at the trained 480p canvas nearest the "
                   "image's shape. Sample with SamplerCustomAdvanced, BasicGuider, SamplerARVideo "
                   "(num_frame_per_block 4) and Cosmos3 Scheduler's sigmas.")
    CATEGORY = "cosmos3/core"
    RETURN_TYPES = ("MODEL", "CONDITIONING", "LATENT")
    RETURN_NAMES = ("model", "positive", "latent")
    OUTPUT_TOOLTIPS = ("the MODEL, its first image set for SamplerARVideo", "the positive conditioning with the "
                       "actions", "the empty latent: 1 + N frames (N actions) at the image's canvas")
    FUNCTION = "attach"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL", {"tooltip": "from Cosmos3 Core Model, on a Sim-Bimanual checkpoint"}),
                             "positive": ("CONDITIONING",),
                             "action": ("COSMOS3_ACTION", {"tooltip": "Cosmos3 Action: forward_dynamics, the first "
                                        "image and the actions"})}}

    def attach(self, model, positive, action):
        pipe = getattr(model.model, "pipeline", None)
        causal = None if pipe is None else pipe.variant.causal
        if causal is None or not causal.takes_actions:
            raise InputError("Cosmos3 Sim Actions (core) conditions a causal Sim-Bimanual checkpoint: connect the MODEL "
                             "of Cosmos3 Core Model loaded with one")
        s = resolve_settings(pipe.variant, Request.build(action=action))  # size and frames, before encoding
        # raw latents: the sampler normalizes its initial latent itself (process_latent_in)
        first = pipe.parts.codec.raw_latents(first_image_latents(pipe.parts, action.image, s))
        patched = model.clone()
        options = patched.model_options.setdefault("transformer_options", {})
        options["ar_config"] = {**options.get("ar_config", {}), "initial_latent": first}
        latent = torch.zeros(1, first.shape[1], latent_frames(s.num_frames), *first.shape[3:])
        return (patched, [[marker, {**extra, ACTION_KEY: action}] for marker, extra in positive], {"samples": latent})
