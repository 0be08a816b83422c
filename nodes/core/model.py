"""Cosmos3 as a core ComfyUI model: a MODEL that core sampling nodes (KSampler, SamplerCustomAdvanced,
ModelSamplingSD3, Wan22ImageToVideoLatent's noise mask) work on, around the pack's loaded transformer.

- `Cosmos3Network` is ComfyUI's `diffusion_model`: it adopts the transformer's own submodules (the
  same tensors, so state-dict names, and LoRA keys, are the checkpoint's) and runs the pack's forward
  behind ComfyUI's DIFFUSION_MODEL wrapper executor.
- `Cosmos3Model` (a BaseModel, flow matching with multiplier 1000: t = sigma * 1000, which the
  transformer scales by its timestep_scale 0.001) builds the prompt's token ids and text K/V once
  per sampling run in `extra_conds`, from the latent's size and frame count, exactly as the pack's
  sampler does; the K/V travel as a tensor cond, so prompts of equal length batch and others run as
  separate forwards.
- Clean frames (noise_mask 0, as Wan22ImageToVideoLatent sets on encoded frames) stay clean every
  step and get no time embedding: Cosmos3's rule, not Wan's t = 0.
- A causal checkpoint's network (`Cosmos3CausalNetwork`) is one ComfyUI's SamplerARVideo drives: `extra_conds` plans
  the pack's own rollout for the prompt and control clip (`causal_run.HostBlocks`: its history, window, sinks and
  control frames), and each forward under `ar_state` is a step of it.

Importing this module imports ComfyUI: only nodes that run inside ComfyUI import it.
"""

import logging
from dataclasses import replace

import comfy.conds
import comfy.latent_formats
import comfy.model_base
import comfy.model_patcher
import comfy.patcher_extension
import comfy.supported_models_base
import torch

from ...cosmos3_runtime import InputError, Request, TextKV, cancel
from ...cosmos3_runtime.budget import estimate
from ...cosmos3_runtime.causal_run import CausalRun, HostBlocks
from ...cosmos3_runtime.geometry import SPATIAL_FACTOR, RunGeometry, pixel_frames
from ...cosmos3_runtime.settings import default_flow_shift
from ...cosmos3_runtime.transformer import media_block
from ...cosmos3_runtime.weights import precision
from .. import services
from .prompt_marker import ACTION_KEY, CONTROLS_KEY, PROMPT_KEY, PromptMarker

log = logging.getLogger("cosmos3")
TEXT_KV = "cosmos3_text_kv"
FPS = "cosmos3_fps"
CAUSAL = "cosmos3_causal"  # a causal checkpoint's rollout (`HostBlocks`); None for a negative prompt
COMPILE = "cosmos3_compile"  # transformer_options: False runs the media block eagerly (default: compiled where it can)
REFUSED_COND_KEYS = {
    "area": "area conditioning (ConditioningSetArea) crops the latent, which breaks Cosmos3's joint attention",
    "mask": "mask conditioning (ConditioningSetMask) crops the latent, which breaks Cosmos3's joint attention; "
            "use a LATENT noise_mask instead",
    "control": "ControlNets do not apply to Cosmos3; for control-to-video (edge, blur, depth, segmentation, "
               "world-scenario map) use the Cosmos3 control nodes with Cosmos3 Transfer Sampler",
    "gligen": "GLIGEN does not apply to Cosmos3",
}


def latent_format(vae_config) -> comfy.latent_formats.Wan22:
    """Wan 2.2's latent format with this checkpoint's own statistics, normalised with the pack's formula."""

    class Cosmos3Latent(comfy.latent_formats.Wan22):
        def __init__(self):
            super().__init__()
            self.latents_mean = torch.tensor(vae_config.latents_mean).view(1, -1, 1, 1, 1)
            self.latents_std = torch.tensor(vae_config.latents_std).view(1, -1, 1, 1, 1)

        def process_in(self, latent):
            mean, std = self.latents_mean.to(latent), self.latents_std.to(latent)
            return (latent - mean) * (1.0 / std)

        def process_out(self, latent):
            mean, std = self.latents_mean.to(latent), self.latents_std.to(latent)
            return latent / (1.0 / std) + mean

    return Cosmos3Latent()


class Cosmos3Config(comfy.supported_models_base.BASE):
    unet_extra_config = {}
    supported_inference_dtypes = [torch.bfloat16, torch.float16, torch.float32]
    vae_key_prefix = ["vae."]
    text_encoder_key_prefix = ["text_encoder."]
    memory_usage_factor = 1.0  # unused: memory_required is the pack's estimate

    def __init__(self, pipeline):
        super().__init__({"disable_unet_model_creation": True})  # the network is the pack's, already loaded
        self.latent_format = latent_format(pipeline.vae.config)
        variant = pipeline.variant
        shift = 1.0 if variant.is_distilled else default_flow_shift(variant, is_image=False)
        self.sampling_settings = {"shift": shift, "multiplier": 1000.0}
        self.set_inference_dtype(pipeline.transformer.dtype, None)


class Cosmos3Network(torch.nn.Module):
    """The pack's transformer as ComfyUI's diffusion_model: forward(x, timestep, ...) -> velocity like x."""

    def __init__(self, transformer, distilled: bool = False, policy=None):
        super().__init__()
        for name, child in transformer.named_children():
            self.add_module(name, child)
        for name, parameter in transformer.named_parameters(recurse=False):
            self.register_parameter(name, parameter)
        self.runtime = (transformer,)  # a tuple: not registered twice
        self.inner_forward = VelocityForward(transformer, distilled, policy)

    @property
    def dtype(self) -> torch.dtype:
        return self.runtime[0].dtype

    def forward(self, x, timestep, context=None, control=None, transformer_options={}, **kwargs):
        return comfy.patcher_extension.WrapperExecutor.new_class_executor(
            self.inner_forward,
            self,
            comfy.patcher_extension.get_all_wrappers(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL,
                                                     transformer_options),
        ).execute(x, timestep, context, control, transformer_options, **kwargs)


class Cosmos3CausalNetwork(Cosmos3Network):
    """A causal checkpoint's network: what SamplerARVideo asks of a causal model. Its K/V cache is one dict whose
    `end` the sampler counts (the history itself is the rollout's, `HostBlocks`); the text K/V are held once per
    prompt by the rollout's denoiser, so there is no cross-attention cache."""

    def init_kv_caches(self, batch_size, max_seq_len, device, dtype):
        if batch_size != 1:
            raise InputError(f"a Cosmos3 causal rollout makes one video: this LATENT's batch is {batch_size}; give 1")
        return [{"end": 0}]

    def init_crossattn_caches(self, batch_size, device, dtype):
        return []


class VelocityForward:
    """What the wrapper executor runs: one object per network, since torch.compile guards on the callable's identity.
    Not a bound method of the network: that would be a reference cycle, and the weights would then wait for a
    garbage collection after ComfyUI lets go of them."""

    def __init__(self, transformer, distilled: bool, policy=None):
        self.transformer, self.distilled, self.warned_cfg = transformer, distilled, False
        self.policy = policy  # a quantized checkpoint's step policy (`weights.precision`): the step from the sigmas

    def __call__(self, x, timestep, context, control, transformer_options, **kwargs):
        if CAUSAL in kwargs:
            return causal_step(kwargs[CAUSAL], x, timestep, transformer_options)
        if TEXT_KV not in kwargs:
            raise InputError("the Cosmos3 MODEL got no Cosmos3 prompt: connect Cosmos3 Text Encode (core) to the "
                             "sampler's positive and negative inputs")
        text_kv, fps, mask = kwargs[TEXT_KV], kwargs.get(FPS, 24.0), kwargs.get("denoise_mask")
        if self.distilled and 1 in transformer_options.get("cond_or_uncond", ()) and not self.warned_cfg:
            self.warned_cfg = True  # once per model: the sampler runs this every step
            log.warning("Cosmos3: this distilled checkpoint samples with cfg 1 (guidance is distilled in); the "
                        "sampler's cfg is above 1, so it runs an unconditional pass the checkpoint was not made for")
        hooks = self.transformer.hooks
        if not torch.compiler.is_compiling():  # (under TorchCompileModel the whole network is compiled already)
            hooks = replace(hooks, block=media_block(transformer_options.get(COMPILE), x.device))
        if self.policy is None:  # no step policy: nothing to set (a context here would break a compiled graph)
            return self.velocities(x, timestep, text_kv, mask, fps, hooks)
        with self.step_precision(transformer_options):
            return self.velocities(x, timestep, text_kv, mask, fps, hooks)

    def velocities(self, x, timestep, text_kv, mask, fps, hooks) -> torch.Tensor:
        velocities = []
        for b in range(x.shape[0]):  # each item its own prompt, timestep and clean frames
            out = self.transformer(x[b : b + 1], timestep[b], TextKV.from_stacked(text_kv[b]),
                                   noisy_frames(mask[b]) if mask is not None else None, float(fps), hooks=hooks)
            velocities.append(out.vision)
        return torch.cat(velocities)

    def step_precision(self, transformer_options):
        """This call's precision: its step in the sampler's schedule (the checkpoint's own arithmetic when the sampler
        says none)."""
        sigmas, sigma = transformer_options.get("sample_sigmas"), transformer_options.get("sigmas")
        if sigmas is None or sigma is None:
            return precision.for_step(None, 0, 1)
        step, steps = precision.step_of_sigma(float(sigma.flatten()[0]), sigmas.flatten().tolist())
        return precision.for_step(self.policy, step, steps)


def causal_step(blocks: HostBlocks | None, x, timestep, transformer_options) -> torch.Tensor:
    """One forward of SamplerARVideo's loop on a causal checkpoint, what it cannot drive refused by name."""
    state = transformer_options.get("ar_state")
    if state is None:
        raise InputError("a causal Cosmos3 checkpoint rolls out block by block: sample it with SamplerARVideo "
                         "(SamplerCustomAdvanced's sampler), or with the pack's Cosmos3 Sim-Transfer Sampler "
                         "(Sim-Transfer) or Cosmos3 Sampler (Sim-Bimanual)")
    if blocks is None:
        raise InputError("a causal Cosmos3 checkpoint samples at guidance 1 with no negative pass: use BasicGuider "
                         "(or cfg 1)")
    sigmas = transformer_options.get("sample_sigmas")
    if sigmas is not None:
        blocks.check_sigmas(sigmas)
    return blocks.forward(x, timestep[0], state["kv_caches"][0], state["start_frame"])


def noisy_frames(mask: torch.Tensor) -> list[int]:
    """Latent frames with anything left to denoise in a noise mask [C, T, h, w] (1 = denoise)."""
    return [t for t, m in enumerate(mask.float().amax(dim=(0, 2, 3)).tolist()) if m > 0]


class Cosmos3Model(comfy.model_base.BaseModel):
    def __init__(self, config: Cosmos3Config, pipeline, device=None):
        super().__init__(config, comfy.model_base.ModelType.FLOW, device=device)
        self.policy = pipeline.variant.precision
        network = Cosmos3CausalNetwork if pipeline.variant.causal is not None else Cosmos3Network
        self.diffusion_model = network(pipeline.transformer, pipeline.variant.is_distilled, self.policy)
        self.pipeline = pipeline  # the tokenizer and the variant (not a module: holds no second copy)

    def apply_model(self, *args, **kwargs):
        """One model call of a core sampler, with ComfyUI's Cancel checked between the transformer's layers. Installed
        here, around the network: TorchCompileModel compiles the network, where a context would break its graph."""
        with cancel.checking(services.progress.check_interrupt):
            return super().apply_model(*args, **kwargs)

    def extra_conds(self, **kwargs):
        prompt = kwargs.get(PROMPT_KEY)
        if prompt is None:
            raise InputError("the Cosmos3 MODEL needs its own conditioning: connect Cosmos3 Text Encode (core) "
                             "to the sampler, not a CLIP text encoder")
        if not isinstance(kwargs.get("cross_attn"), PromptMarker):
            raise InputError("this Cosmos3 conditioning was changed by a core node that edits prompt embeddings; "
                             "Cosmos3 prompts are token ids, so such nodes cannot apply")
        for key, why in REFUSED_COND_KEYS.items():
            if kwargs.get(key) is not None:
                raise InputError(f"Cosmos3 conditioning cannot take {why}")
        noise = kwargs["noise"]
        channels = self.diffusion_model.runtime[0].config.latent_channel
        if noise.ndim != 5 or noise.shape[1] != channels:
            raise InputError(f"the Cosmos3 MODEL samples {channels}-channel Wan 2.2 video latents [B, {channels}, T, "
                             f"h, w]; this LATENT is {list(noise.shape)}. Make it with Wan22ImageToVideoLatent (or "
                             "VAE Encode with the Cosmos3 VAE), not a 16-channel empty-latent node")
        if self.pipeline.variant.causal is not None:
            conditions = {"control_videos": kwargs.get(CONTROLS_KEY), "action": kwargs.get(ACTION_KEY)}
            blocks = None if prompt.negative else causal_blocks(self.pipeline, prompt, conditions, noise)
            return {CAUSAL: comfy.conds.CONDConstant(blocks)}
        ids = prompt_ids(self.pipeline, prompt, noise.shape)
        # once per run, on the device the sampler runs on (ComfyUI may leave small modules in CPU memory)
        with precision.for_text(self.policy), cancel.checking(services.progress.check_interrupt):
            text = self.diffusion_model.runtime[0].encode_text(torch.tensor(ids, dtype=torch.long),
                                                               kwargs.get("device"))
        out = {TEXT_KV: comfy.conds.CONDRegular(text.stacked().unsqueeze(0)), FPS: comfy.conds.CONDConstant(prompt.fps)}
        if kwargs.get("denoise_mask") is not None:
            out["denoise_mask"] = comfy.conds.CONDRegular(kwargs["denoise_mask"])
        return out

    def extra_conds_shapes(self, **kwargs):
        """Before tokenizing (memory planning): the K/V cond's shape with the prompt's token bound."""
        prompt = kwargs.get(PROMPT_KEY)
        if prompt is None:
            return {}
        c = self.diffusion_model.runtime[0].config
        return {TEXT_KV: [1, c.num_hidden_layers, 2, prompt.token_bound, c.num_key_value_heads, c.head_dim]}

    def scale_latent_inpaint(self, sigma, noise, latent_image, **kwargs):
        return latent_image  # clean frames stay exactly clean (they are not re-noised to sigma)

    def memory_required(self, input_shape, cond_shapes={}):
        """The pack's estimate of one forward per batch item (joint text + media attention, text K/V)."""
        batch, _, frames, h, w = input_shape
        tokens = max((shape[3] for shape in cond_shapes.get(TEXT_KV, [])), default=0)  # [1, layers, 2, L, K, D]
        g = RunGeometry(h * SPATIAL_FACTOR, w * SPATIAL_FACTOR, pixel_frames(frames), pixel_frames(frames))
        one = estimate(self.diffusion_model.runtime[0].config, None, g, tokens, 0, self.get_dtype_inference())
        return batch * one.total


def prompt_ids(pipeline, prompt, latent_shape) -> list[int]:
    """The token ids of a core-path prompt for a latent [B, C, T, h, w], as the pack's sampler builds them."""
    _, _, frames, h, w = latent_shape
    request = Request.build(**prompt.options, num_frames=pixel_frames(frames), height=h * SPATIAL_FACTOR,
                            width=w * SPATIAL_FACTOR, fps=prompt.fps, check_memory=False)
    if prompt.negative:
        _, _, ids = pipeline.planner.prepare("", Request.build(request, negative_prompt=prompt.text))
    else:
        _, ids, _ = pipeline.planner.prepare(prompt.text, request)
    return ids


def causal_blocks(pipeline, prompt, conditions: dict, noise) -> HostBlocks:
    """The pack's rollout of a causal checkpoint for a core-path prompt and its conditions (a control clip, or the
    actions and first image) over a latent [1, C, T, h, w], its steps the host sampler's."""
    needed = "action" if pipeline.variant.causal.takes_actions else "control_videos"
    if conditions[needed] is None:
        raise InputError("this causal Sim-Bimanual checkpoint rolls out a first image and actions: connect Cosmos3 "
                         "Action through Cosmos3 Sim Actions (core) to the positive conditioning and the sampler"
                         if needed == "action" else
                         "this causal Sim-Transfer checkpoint follows a control clip: connect a Cosmos3 control node "
                         "through Cosmos3 Sim Control (core) to the positive conditioning")
    _, _, frames, h, w = noise.shape
    request = Request.build(**prompt.options, **{needed: conditions[needed]}, num_frames=pixel_frames(frames),
                            height=h * SPATIAL_FACTOR, width=w * SPATIAL_FACTOR, fps=prompt.fps, check_memory=False)
    s, cond_ids, uncond_ids = pipeline.planner.prepare(prompt.text, request)
    return HostBlocks(CausalRun(pipeline.parts, s, request, cond_ids, uncond_ids, None))


def model_patcher(pipeline, load_device, offload_device, reload=None, disable_dynamic=False):
    """A core MODEL patcher around a loaded pipeline's transformer. `reload(disable_dynamic=True)` gives ComfyUI an
    independent copy when it asks for one (TorchCompileModel and hooks under dynamic VRAM)."""
    model = Cosmos3Model(Cosmos3Config(pipeline), pipeline, device=load_device)
    kind = comfy.model_patcher.ModelPatcher if disable_dynamic else comfy.model_patcher.CoreModelPatcher
    patcher = kind(model, load_device=load_device, offload_device=offload_device)
    if reload is not None:
        patcher.cached_patcher_init = (reload, ())
    return patcher
