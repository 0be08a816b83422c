"""Tiny random Cosmos3 checkpoints in the exact released folder layout.

Real checkpoints are tens of GB. These have the same files, config keys, tensor names and dtypes
(bf16 weights, sharded transformer with an index, a byte-level BPE tokenizer with the Qwen special
tokens and a chat template) at toy sizes, so every loader, parity test and demo runs anywhere.
The numbers they produce are meaningless; the code paths are the real ones.

    python -m cosmos3_runtime make-tiny /tmp/cosmos3-tiny --kind edge
"""

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

from .transformer import EDGE_BACKBONE, TransformerConfig
from .vae import VAEConfig, WanVAE

KINDS = ("gated", "edge")

TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            intermediate_size=128, rope_axes_dim=[6, 5, 5])
# Big enough that per-step costs dominate Python overhead; still loads in seconds on a CPU.
SMALL = dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
             intermediate_size=1536, rope_axes_dim=[12, 10, 10])
SIZES = {"tiny": TINY, "small": SMALL}
# The released transformers' backbone shapes (no sound or action head), for sizes, benchmarks and virtual runs. Super:
# hidden size, depth and heads as reported; head dim, MLP width and vocabulary those of Qwen3-VL-32B's text tower,
# whose hidden size, depth and heads it shares (unconfirmed until its config is public).
RELEASED = {
    "edge": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 intermediate_size=9216, vocab_size=131072, hidden_act="relu2", qk_norm_for_text=False,
                 use_und_k_norm_for_gen=True, rms_norm_eps=1e-5, rope_theta=1e8),
    "nano": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                 intermediate_size=12288, vocab_size=151936),
    "super": dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                  intermediate_size=25600, vocab_size=151936),
}

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                  "<|video_pad|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
UNIPC_SCHEDULER = {
    "_class_name": "UniPCMultistepScheduler",
    "_diffusers_version": "0.42.1",
    "num_train_timesteps": 1000,
    "solver_order": 2,
    "solver_type": "bh2",
    "prediction_type": "flow_prediction",
    "predict_x0": True,
    "lower_order_final": True,
    "use_flow_sigmas": True,
    "use_karras_sigmas": True,
    "sigma_min": 0.147,
    "sigma_max": 200.0,
    "final_sigmas_type": "zero",
    "flow_shift": 1.0,
}
DISTILLED_SIGMAS = [1.0, 0.9375, 0.8333333333333334, 0.625]



FRAMEWISE = dict(chunk_size=1, window_frames=30, sink_frames=3)  # the framewise recipe Isaac Lab's service runs
# (its kv window 30 and attention sink 3): one latent frame, 4 frames, a chunk


def sim_transfer_block(chunk_size: int = 4, window_frames: int | None = None, sink_frames: int = 0) -> dict:
    """A causal Sim-Transfer checkpoint's block in transformer/config.json (schema v1, as SGLang and vLLM-Omni read
    it): chunkwise (4 latent frames a chunk, every frame kept), or framewise with a window and sinks."""
    return {
        "schema_version": 1, "checkpoint_id": "tiny-random", "checkpoint_iteration": 0, "checkpoint_hash": "",
        "chunk_size": chunk_size, "window_frames": window_frames, "sink_frames": sink_frames,
        "text_cache_max_len": 4096, "attention_mode": "three_way", "video_temporal_causal": True,
        "latent_patch_size": 2, "vae_spatial_compression_factor": 16, "temporal_compression_factor": 4,
        "temporal_modality_margin": 15000, "unified_3d_mrope_reset_spatial_ids": True, "base_fps": 24,
        "enable_fps_modulation": True,
        "fixed_step_sampler_config": {"sample_type": "sde", "t_list": DISTILLED_SIGMAS, "num_train_timesteps": 1000},
        "conditioning": {"mode": "control_video", "hints": ["edge", "blur", "depth", "seg"],
                         "no_eviction": chunk_size > 1, "share_vision_temporal_positions": True,
                         "transfer_control_attention_mode": "causal_control_with_rgb_history",
                         "system_prompt_id": "cosmos3_transfer_v1", "emphasize_control_in_prompt": True},
    }


def sim_bimanual_block(window_frames: int = 96, offset: float = 0.1, scale: float = 0.5) -> dict:
    """Cosmos3-Nano-Sim-Bimanual's block in transformer/config.json (schema v1, as vLLM-Omni and SGLang read it):
    chunks of 4 latent frames, a 96-frame window without sinks, and its action contract: AgiBot's 29 values (domain
    15) and a 9-value camera pose (domain 2), each with an affine normalizer (every offset `offset`, every scale
    `scale`, or those given per value as lists)."""

    def embodiment(domain_id: int, width: int, layout: str) -> dict:
        values = lambda v: [float(x) for x in v] if isinstance(v, (list, tuple)) else [float(v)] * width  # noqa: E731
        return {"domain_id": domain_id, "raw_action_dim": width, "layout": layout,
                "normalizer": {"schema_version": 1, "method": "quantile_rot",
                               "transform": {"type": "affine", "offset": values(offset)[:width],
                                             "scale": values(scale)[:width], "forward_clamp": False}}}

    return {
        "schema_version": 1, "checkpoint_id": "tiny-random", "checkpoint_iteration": 1, "checkpoint_hash": "0" * 63 + "1",
        "chunk_size": 4, "window_frames": window_frames, "sink_frames": 0, "text_cache_max_len": 512,
        "attention_mode": "three_way", "video_temporal_causal": True, "latent_patch_size": 2,
        "vae_spatial_compression_factor": 16, "temporal_compression_factor": 4,
        "fixed_step_sampler_config": {"sample_type": "sde", "t_list": DISTILLED_SIGMAS, "num_train_timesteps": 1000},
        "conditioning": {"schema_version": 3, "action_tokens_per_frame": 4, "model_action_dim": 64,
                         "num_embodiment_domains": 32, "default_embodiment": "agibotworld",
                         "embodiments": {"agibotworld": embodiment(15, 29, "agibot_bimanual_29"),
                                         "camera_pose": embodiment(2, 9, "camera_pose_9")},
                         "padding": {"stage": "after_normalization", "value": 0.0}},
        "temporal_modality_margin": 15000, "unified_3d_mrope_reset_spatial_ids": True, "base_fps": 24.0,
        "enable_fps_modulation": True,
    }


DISTILLED_SCHEDULER = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": "0.42.1",
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "stochastic_sampling": True,
    "use_dynamic_shifting": False,
    "invert_sigmas": False,
    "shift_terminal": None,
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
    "fixed_step_sampler_config": {"sample_type": "sde", "t_list": DISTILLED_SIGMAS},
    "fixed_step_requires_explicit_sigmas": True,
}


def transformer_config(kind: str = "gated", size: str = "tiny", action=False, sound=False, vocab_size=512) -> dict:
    """config.json contents of a tiny transformer of the given kind."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    config = {"_class_name": "Cosmos3OmniTransformer", "_diffusers_version": "0.42.1", **SIZES[size]}
    config.update(vocab_size=vocab_size, latent_channel=48, latent_patch_size=2, patch_latent_dim=192)
    if kind == "edge":
        config.update(hidden_act="relu2", backbone_type=EDGE_BACKBONE, qk_norm_for_text=False,
                      use_und_k_norm_for_gen=True, rms_norm_eps=1e-5, rope_theta=1e8)
    else:
        config.update(hidden_act="silu", qk_norm_for_text=True, rms_norm_eps=1e-6, rope_theta=5e6)
    if sound:
        config.update(sound_gen=True, sound_dim=16, sound_latent_fps=25.0)
    if action:
        config.update(action_gen=True, action_dim=64, num_embodiment_domains=32)
    return config


def released_transformer_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a released transformer checkpoint with its shape (flat diffusers layout)."""
    H, A, K, D = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
    I, V, P = config.intermediate_size, config.vocab_size, config.patch_latent_dim
    shapes = {"embed_tokens.weight": (V, H), "norm.weight": (H,), "norm_moe_gen.weight": (H,),
              "lm_head.weight": (V, H), "proj_in.weight": (H, P), "proj_in.bias": (H,),
              "proj_out.weight": (P, H), "proj_out.bias": (P,),
              "time_embedder.linear_1.weight": (H, 256), "time_embedder.linear_1.bias": (H,),
              "time_embedder.linear_2.weight": (H, H), "time_embedder.linear_2.bias": (H,)}
    for i in range(config.num_hidden_layers):
        layer = {"input_layernorm": (H,), "input_layernorm_moe_gen": (H,), "post_attention_layernorm": (H,),
                 "post_attention_layernorm_moe_gen": (H,),
                 "self_attn.to_q": (A * D, H), "self_attn.to_k": (K * D, H), "self_attn.to_v": (K * D, H),
                 "self_attn.to_out": (H, A * D), "self_attn.add_q_proj": (A * D, H),
                 "self_attn.add_k_proj": (K * D, H), "self_attn.add_v_proj": (K * D, H),
                 "self_attn.to_add_out": (H, A * D), "self_attn.norm_added_q": (D,), "self_attn.norm_added_k": (D,),
                 "mlp.up_proj": (I, H), "mlp.down_proj": (H, I), "mlp_moe_gen.up_proj": (I, H),
                 "mlp_moe_gen.down_proj": (H, I)}
        if not config.is_dense:
            layer.update({"mlp.gate_proj": (I, H), "mlp_moe_gen.gate_proj": (I, H)})
        if config.qk_norm_for_text:
            layer.update({"self_attn.norm_q": (D,), "self_attn.norm_k": (D,)})
        if config.has_und_k_norm_for_gen:
            layer["self_attn.k_norm_und_for_gen"] = (D,)
        for name, shape in layer.items():
            shapes[f"layers.{i}.{name}.weight"] = shape
            if config.attention_bias and name.startswith("self_attn.") and len(shape) == 2:
                shapes[f"layers.{i}.{name}.bias"] = (shape[0],)
    if config.sound_gen:
        S = config.sound_dim
        shapes.update({"audio_proj_in.weight": (H, S), "audio_proj_in.bias": (H,), "audio_proj_out.weight": (S, H),
                       "audio_proj_out.bias": (S,), "audio_modality_embed": (H,)})
    if config.action_gen:
        Ad, Nd = config.action_dim, config.num_embodiment_domains
        shapes.update({"action_proj_in.fc.weight": (Nd, Ad * H), "action_proj_in.bias.weight": (Nd, H),
                       "action_proj_out.fc.weight": (Nd, H * Ad), "action_proj_out.bias.weight": (Nd, Ad),
                       "action_modality_embed": (H,)})
    return shapes


def random_weight(name: str, shape: tuple[int, ...], config: TransformerConfig, generator) -> torch.Tensor:
    """Random values at a scale that keeps activations near unit size through the toy network."""
    value = torch.randn(shape, generator=generator)
    if len(shape) == 1:  # norm gains around 1; biases and modality embeddings small
        return 0.1 * value if name.endswith("bias") or "modality_embed" in name else 1.0 + 0.1 * value
    if name == "embed_tokens.weight":
        return value
    if name.endswith(".bias.weight"):  # per-domain action biases
        return 0.1 * value
    fan_in = {"action_proj_in.fc.weight": config.action_dim, "action_proj_out.fc.weight": config.hidden_size}
    return value / math.sqrt(fan_in.get(name, shape[1]))


def write_transformer(folder: Path, config: dict, seed: int, shards: int, dtype: torch.dtype) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    parsed = TransformerConfig.from_dict(config)
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        name: random_weight(name, shape, parsed, generator).to(dtype).contiguous()
        for name, shape in released_transformer_shapes(parsed).items()
    }
    names = list(tensors)
    per_shard = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        shard_name = f"diffusion_pytorch_model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i * per_shard : (i + 1) * per_shard]}
        save_file(part, str(folder / shard_name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, shard_name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def vae_config(seed: int = 0, base_dim: int = 8, decoder_base_dim: int = 12) -> dict:
    """config.json of a Wan 2.2-structured VAE with toy channel counts and random latent statistics."""
    generator = torch.Generator().manual_seed(seed + 1)
    mean = (0.3 * torch.randn(48, generator=generator)).tolist()
    std = (0.4 + 0.8 * torch.rand(48, generator=generator)).tolist()
    return {
        "_class_name": "AutoencoderKLWan",
        "_diffusers_version": "0.42.1",
        "base_dim": base_dim,
        "decoder_base_dim": decoder_base_dim,
        "z_dim": 48,
        "dim_mult": [1, 2, 4, 4],
        "num_res_blocks": 2,
        "attn_scales": [],
        "temperal_downsample": [False, True, True],
        "dropout": 0.0,
        "latents_mean": mean,
        "latents_std": std,
        "is_residual": True,
        "in_channels": 12,
        "out_channels": 12,
        "patch_size": 2,
        "scale_factor_spatial": 16,
        "scale_factor_temporal": 4,
    }


def write_vae(folder: Path, config: dict, seed: int, dtype: torch.dtype) -> None:
    """Random VAE weights: PyTorch's default init for convolutions, gains around 1."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    torch.manual_seed(seed)  # default module init draws from the global generator
    vae = WanVAE(VAEConfig.from_dict(config))
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, value in vae.state_dict().items():
        if name.endswith("gamma"):
            value = 1.0 + 0.1 * torch.randn(value.shape, generator=generator)
        tensors[name] = value.to(dtype).contiguous()
    save_file(tensors, str(folder / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})


def sound_tokenizer_config(sound_dim: int) -> dict:
    """The released audio tokenizer's structure at toy widths: 320 samples per latent frame at 8 kHz (a rate
    AAC can store), so 25 latent frames per second as released (1920 samples at 48 kHz)."""
    return {"_class_name": "Cosmos3AVAEAudioTokenizer", "_diffusers_version": "0.42.1", "model_type": "autoencoder_v2",
            "sampling_rate": 8000, "vocoder_input_dim": sound_dim, "dec_dim": 4, "dec_c_mults": [1, 2, 2],
            "dec_strides": [4, 8, 10], "dec_out_channels": 2, "stereo": True, "normalize_volume": True, "input_channels": 1,
            "enc_type": "spec_convnext", "enc_dim": 4, "enc_num_blocks": 1, "enc_n_fft": 4, "enc_hop_length": 1,
            "enc_latent_dim": 2 * sound_dim, "enc_c_mults": [1, 2, 2], "enc_strides": [4, 8, 10], "dec_type": "oobleck",
            "bottleneck_type": "vae", "activation": "snakebeta", "snake_logscale": True}


def write_sound_tokenizer(folder: Path, config: dict, seed: int, dtype: torch.dtype, encoder: bool) -> None:
    from .sound import SoundConfig, SoundTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    generator = torch.Generator().manual_seed(seed + 2)
    tensors = {}
    for name, p in SoundTokenizer(SoundConfig.from_dict(config, "tiny"), with_encoder=encoder).named_parameters():
        value = torch.randn(p.shape, generator=generator)
        if name.endswith(("alpha", "beta")) or name.endswith("bias"):
            value = 0.1 * value
        elif name.endswith("weight_g"):  # per-channel weight norms: a gain below 1 keeps the waveform unclipped
            value = 0.4 + 0.05 * value.abs()
        elif name.endswith("norm.weight"):
            value = 1.0 + 0.1 * value
        tensors[name] = value.to(dtype).contiguous()
    save_file(tensors, str(folder / "diffusion_pytorch_model.safetensors"), metadata={"format": "pt"})


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer with Qwen's special tokens, trained on a few sentences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [
        "You are a helpful assistant who will generate videos from a give prompt.",
        "You are a helpful assistant who will generate images from a give prompt.",
        "A robot arm picks up a red cube on a wooden table. The video is 3.4 seconds long and is of 24 FPS.",
        "This video is of 480x832 resolution. This image is not of 640x640 resolution.",
        '{"temporal_caption": "a cat walks", "resolution": {"H": 480, "W": 832}, "duration": "3s", "fps": 24.0}',
    ]
    tokenizer.train_from_iterator(corpus * 4, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def make_tiny_checkpoint(
    root: str | Path,
    kind: str = "gated",
    size: str = "tiny",
    distilled: bool = False,
    action: bool = False,
    sound: bool = False,
    sound_encoder: bool = True,
    seed: int = 0,
    shards: int = 2,
    dtype: torch.dtype | str = torch.bfloat16,
    legacy_class_name: bool = False,
    overrides: dict | None = None,
    reasoner: bool = True,
    causal: dict | None = None,
) -> Path:
    """Write a random checkpoint in the released diffusers layout and return its folder.

    `overrides` replaces transformer config values (for example {"num_key_value_heads": 4}).
    `sound` adds a sound head and a sound tokenizer (decoder-only when `sound_encoder` is False, as early
    releases shipped it). `reasoner` adds the Reasoner's root files and vision encoder (False: a
    generator-only folder, as diffusers-only exports are). `causal`: a causal checkpoint's block
    (`sim_transfer_block()`: Cosmos3-Nano-Sim-Transfer's layout, a gated checkpoint with its fixed SDE sampler;
    `sim_bimanual_block()`: Cosmos3-Nano-Sim-Bimanual's, which also needs `action=True`).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    vocab_size = 512
    model_index = {
        "_class_name": ("Cosmos3NanoSimBimanualPipeline" if "embodiments" in causal["conditioning"] else
                        "Cosmos3NanoSimTransferPipeline") if causal else
                       "Cosmos3OmniDiffusersPipeline" if legacy_class_name else "Cosmos3OmniPipeline",
        "_diffusers_version": "0.42.1",
        "default_use_system_prompt": True,
        "enable_safety_checker": False,
        "use_native_flow_schedule": False,
        "transformer": ["diffusers", "Cosmos3OmniTransformer"],
        "vae": ["diffusers", "AutoencoderKLWan"],
        "scheduler": ["diffusers", DISTILLED_SCHEDULER["_class_name"] if distilled else UNIPC_SCHEDULER["_class_name"]],
        "text_tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "sound_tokenizer": ["diffusers", "Cosmos3AVAEAudioTokenizer"] if sound else [None, None],
        "safety_checker": [None, None],
    }
    (root / "model_index.json").write_text(json.dumps(model_index, indent=2))
    config = {**transformer_config(kind, size, action=action, sound=sound, vocab_size=vocab_size), **(overrides or {})}
    if causal:
        config["cosmos3_nano_sim_bimanual"] = causal
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype  # "float32" too (hashable options)
    write_transformer(root / "transformer", config, seed, shards, dtype)
    write_vae(root / "vae", vae_config(seed), seed, dtype)
    if sound:
        write_sound_tokenizer(root / "sound_tokenizer", sound_tokenizer_config(config["sound_dim"]), seed, dtype,
                              sound_encoder)
    (root / "scheduler").mkdir(exist_ok=True)
    scheduler = DISTILLED_SCHEDULER if distilled else UNIPC_SCHEDULER
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(scheduler, indent=2))
    if distilled:
        modular = {
            "_class_name": "Cosmos3DistilledModularPipeline",
            "_blocks_class_name": "Cosmos3DistilledBlocks",
            "_diffusers_version": "0.42.1",
            "is_distilled": True,
            "distilled_sigmas": DISTILLED_SIGMAS,
            "default_use_system_prompt": True,
            "enable_safety_checker": False,
        }
        for name in ("transformer", "vae", "scheduler", "text_tokenizer"):
            library, class_name = model_index[name]
            spec = {"pretrained_model_name_or_path": "nvidia/Cosmos3-Tiny-4Step", "subfolder": name,
                    "type_hint": [library, class_name], "variant": None, "revision": None}
            modular[name] = [library, class_name, spec]
        (root / "modular_model_index.json").write_text(json.dumps(modular, indent=2))
    write_tokenizer(root / "text_tokenizer", vocab_size)
    if reasoner:
        from .reasoner.config import EDGE, OMNI
        from .reasoner.tiny import write_reasoner_files

        write_reasoner_files(root, EDGE if kind == "edge" else OMNI, config, seed, dtype)
    return root
