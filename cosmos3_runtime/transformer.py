"""The Cosmos3 Omni transformer: a Mixture-of-Transformers with a text (UND) and a media (GEN) tower.

Every decoder layer holds two full weight sets. The UND weights run the text prefix causally; the
GEN weights run the media tokens (video, then sound, then action), whose queries attend without a
mask to [text K/V ; media K/V]. Text never attends to media, so a prompt's per-layer text K/V do
not depend on the latents or the timestep: `encode_text` computes them once per prompt and every
denoising step reuses them (`TextKV`). That removes the whole text tower from the per-step cost.

A forward embeds the media sequence (`MediaTokens`: its segments, `Segment`, one after another: the video, clean
items before it, tracks of rows after it), runs the media layer stack and reads each segment's velocity out. How
the stack runs is its `Hooks`: the block each layer runs (eager or compiled), a call before and after each layer
(block swap), a wrapper around the stack (the step cache), and a `MediaKV`: the media K/V of earlier forwards,
which a causal rollout's tokens attend to between the text and themselves.

Parameter names equal the diffusers checkpoint keys, so weights load without renaming. Weights the
generation path never reads (lm_head, the UND final norm, and the last layer's UND query, output
projection and MLP) are not built at all.

Notation: L text tokens, N media tokens, H hidden size, A query heads, K key/value heads, D head dim,
C latent channels, p latent patch size.
"""

import functools
import logging
import math
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F
from torch import nn

from . import cancel
from .devices import facts
from .errors import CheckpointError, InputError
from .geometry import TEMPORAL_FACTOR
from .parallel import Group, SequenceShards, check_heads
from .rope import apply_rope, inverse_frequencies, media_positions, mrope_cos_sin, text_positions
from .weights.fp8 import FP8, FP8_MAX

log = logging.getLogger(__name__)

# Keys of transformer/config.json that are understood but carry nothing this runtime needs.
_IGNORED_CONFIG_KEYS = {
    "_class_name",
    "_diffusers_version",
    "_name_or_path",
    "dtype",
    "torch_dtype",
    "attention_dropout",
    "backbone_type",
    "temporal_compression_factor",
    "rope_scaling",
    "quantization_config",
    "cosmos3_nano_sim_bimanual",  # a causal checkpoint's rollout (`causal.read_config`)
    "cosmos_dreams",
}
_reported_unknown_keys: set[tuple[str, tuple[str, ...]]] = set()
EDGE_BACKBONE = "cosmos3_edge_nemotron_dense"
TIME_FREQ_CHANNELS = 256


@dataclass(frozen=True)
class TransformerConfig:
    hidden_size: int = 4096
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 12288
    vocab_size: int = 151936
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    hidden_act: str = "silu"
    qk_norm_for_text: bool = True
    use_und_k_norm_for_gen: bool = False
    rope_theta: float = 5e6
    rope_axes_dim: tuple[int, int, int] = (24, 20, 20)
    latent_channel: int = 48
    latent_patch_size: int = 2
    patch_latent_dim: int = 192
    timestep_scale: float = 0.001
    base_fps: int = 24
    enable_fps_modulation: bool = True
    unified_3d_mrope_reset_spatial_ids: bool = True
    unified_3d_mrope_temporal_modality_margin: int = 15000
    sound_gen: bool = False
    sound_dim: int | None = None
    sound_latent_fps: float = 25.0
    action_gen: bool = False
    action_dim: int | None = None
    num_embodiment_domains: int = 32
    # Not an architecture key: kept so variant detection can read it from the same object.
    backbone_type: str | None = field(default=None, compare=False)

    @property
    def is_dense(self) -> bool:
        """Edge backbone: squared-ReLU MLPs and Nemotron RMSNorm everywhere."""
        return self.hidden_act == "relu2"

    @classmethod
    def from_dict(cls, raw: dict, source: str = "transformer/config.json") -> "TransformerConfig":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in raw.items() if k in known}
        unknown = tuple(sorted(set(raw) - known - _IGNORED_CONFIG_KEYS))
        if unknown and (source, unknown) not in _reported_unknown_keys:
            _reported_unknown_keys.add((source, unknown))  # once per file, not at every read
            log.warning("%s: ignoring unknown keys %s", source, ", ".join(unknown))
        axes = raw.get("rope_axes_dim") or (raw.get("rope_scaling") or {}).get("mrope_section") or [24, 20, 20]
        values["rope_axes_dim"] = tuple(int(a) for a in axes)
        config = cls(**values)
        config.validate(source)
        return config

    def validate(self, source: str) -> None:
        def fail(message: str):
            raise CheckpointError(f"{source}: {message}")

        if self.hidden_act not in ("silu", "relu2"):
            fail(f"hidden_act {self.hidden_act!r} is not supported; Cosmos3 uses 'silu' (gated) or 'relu2' (Edge)")
        if self.num_attention_heads % self.num_key_value_heads:
            fail("num_attention_heads must be a multiple of num_key_value_heads")
        if sum(self.rope_axes_dim) != self.head_dim // 2:
            fail(f"rope_axes_dim {list(self.rope_axes_dim)} must sum to head_dim/2 = {self.head_dim // 2}")
        if self.patch_latent_dim != self.latent_patch_size**2 * self.latent_channel:
            fail("patch_latent_dim must equal latent_patch_size**2 * latent_channel")
        if self.sound_gen and not self.sound_dim:
            fail("sound_gen is true but sound_dim is missing")
        if self.action_gen and not self.action_dim:
            fail("action_gen is true but action_dim is missing")

    @property
    def has_und_k_norm_for_gen(self) -> bool:
        # As diffusers builds it: only Edge-style configs without text q/k norms get the extra norm.
        return self.use_und_k_norm_for_gen and not self.qk_norm_for_text


# Small parameters (norm gains, embeddings, the time embedder, modality embeddings, action tables) are moved to the
# activations' device at use: a host's memory manager (ComfyUI in its low-VRAM modes) streams only its own cast
# layers and may leave every other module in CPU memory.


class RMSNorm(nn.Module):
    """RMSNorm that rounds the normalised value to the gain's dtype before multiplying (Qwen style)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(self.weight.dtype)
        return x * self.weight.to(x.device)


class NemotronRMSNorm(nn.Module):
    """RMSNorm that applies the gain in fp32 and rounds afterwards (Edge backbone)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.to(x.device).float() * x32).to(x.dtype)


_linear_class: ContextVar[type[nn.Linear]] = ContextVar("linear_class", default=nn.Linear)


def linear(in_features: int, out_features: int, bias: bool = True) -> nn.Linear:
    """The model's linear layers: nn.Linear, or the host's subclass set with `linear_layers` (ComfyUI's
    cast-weight layers, which its memory manager can stream per layer)."""
    return _linear_class.get()(in_features, out_features, bias=bias)


@contextmanager
def linear_layers(cls: type[nn.Linear] | None):
    """Build models whose linear layers (all but the fp32 time embedder) are `cls` (None: nn.Linear)."""
    token = _linear_class.set(cls or nn.Linear)
    try:
        yield
    finally:
        _linear_class.reset(token)


def make_norm(config: TransformerConfig, dim: int) -> nn.Module:
    return (NemotronRMSNorm if config.is_dense else RMSNorm)(dim, config.rms_norm_eps)


class MLP(nn.Module):
    """SwiGLU (`silu`) or dense squared-ReLU (`relu2`) feed-forward, no biases."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gated = not config.is_dense
        if self.gated:
            self.gate_proj = linear(hidden, inner, bias=False)
        self.up_proj = linear(hidden, inner, bias=False)
        self.down_proj = linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(relu_squared(self.up_proj(x)))


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """Edge's activation; must round exactly like relu(x) * relu(x) in bf16 (the reference's form)."""
    return torch.relu(x).square()


def attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: bool = False):
    """q [Nq, A, D], k/v [Nk, K, D] -> (q, k, v) as [1, heads, N, D] in the dtype SDPA should run them in, and whether
    they are still grouped (K < A): K/V expanded to the query heads where grouped inputs would make SDPA hold the
    whole score matrix (`devices.DeviceFacts.grouped_kv`)."""
    device = facts(q.device)
    dtype = device.attention_dtype(q.dtype)
    q, k, v = (t.transpose(0, 1).unsqueeze(0).to(dtype) for t in (q, k, v))  # [1, heads, N, D]
    groups = q.shape[1] // k.shape[1]
    if groups > 1 and not device.grouped_kv(dtype, q.shape[-1], masked):
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return q, k, v, k.shape[1] != q.shape[1]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              mask: torch.Tensor | None = None) -> torch.Tensor:
    """Grouped-query attention. q [Nq, A, D], k/v [Nk, K, D] -> [Nq, A*D] in q's dtype; `mask` [Nk] or [Nq, Nk] bool:
    the keys each query attends to.

    Batched 4-D inputs matter: for 3-D ones PyTorch's CPU dispatch falls back to the math kernel,
    which materialises the whole Nq x Nk score matrix (a 30k-token prompt: tens of GB).
    """
    dtype = q.dtype
    q, k, v, grouped = attention_inputs(q, k, v, masked=mask is not None)
    mask = None if mask is None else mask.view(1, 1, -1 if mask.ndim == 2 else 1, mask.shape[-1])
    extra = {"enable_gqa": True} if grouped else {}
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, **extra)
    return out[0].transpose(0, 1).flatten(1).to(dtype)


MASKED_ROWS = 4096  # query rows a masked attention call takes: far from the 2**32 scores past which CUDA's
# memory-efficient kernel is reported to mishandle an explicit mask (pytorch#162588)


def masked_media_attention(visible: torch.Tensor):
    """A media attention (`Hooks.attention`) where media row i attends to media row j only where
    `visible[i, j]` (bool [N, N]), and to every text row (the text keys come first); in blocks of query rows, its mask
    with the text's columns made once."""
    masks = {}

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        text = k.shape[0] - q.shape[0]
        if text not in masks:
            masks.clear()
            masks[text] = torch.cat([visible.new_ones(q.shape[0], text), visible], dim=1)
        mask = masks[text]
        return torch.cat([attention(q[i : i + MASKED_ROWS], k, v, mask=mask[i : i + MASKED_ROWS])
                          for i in range(0, q.shape[0], MASKED_ROWS)])

    return attend


class MoTAttention(nn.Module):
    """Attention with separate text (UND) and media (GEN) projections and q/k norms."""

    # The media attention: None is SDPA (`attention`); a host may set a function with `attention`'s shapes
    # (q [Nq, A, D], k/v [Nk, K, D] -> [Nq, A*D], no mask), e.g. ComfyUI's selected backend. The causal
    # text prefill always runs SDPA: it runs once per prompt, and no host backend has a causal mode.
    media_attention = None

    def __init__(self, config: TransformerConfig, text_output: bool, media: bool = True):
        super().__init__()
        H, A, K, D = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim
        bias = config.attention_bias
        self.heads, self.kv_heads, self.head_dim = A, K, D
        identity = nn.Identity
        # Text pathway. The last layer only has to produce K/V for the media queries.
        if text_output:
            self.to_q = linear(H, A * D, bias=bias)
            self.to_out = linear(A * D, H, bias=bias)
            self.norm_q = make_norm(config, D) if config.qk_norm_for_text else identity()
        self.to_k = linear(H, K * D, bias=bias)
        self.to_v = linear(H, K * D, bias=bias)
        self.norm_k = make_norm(config, D) if config.qk_norm_for_text else identity()
        self.k_norm_und_for_gen = make_norm(config, D) if config.has_und_k_norm_for_gen else identity()
        if not media:  # a Reasoner-only load
            return
        # Media pathway.
        self.add_q_proj = linear(H, A * D, bias=bias)
        self.add_k_proj = linear(H, K * D, bias=bias)
        self.add_v_proj = linear(H, K * D, bias=bias)
        self.to_add_out = linear(A * D, H, bias=bias)
        self.norm_added_q = make_norm(config, D)
        self.norm_added_k = make_norm(config, D)

    def text(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, text_output: bool):
        """Text self-attention. Returns (output or None, keys as media sees them, values)."""
        k = self.norm_k(self.to_k(x).view(-1, self.kv_heads, self.head_dim))
        v = self.to_v(x).view(-1, self.kv_heads, self.head_dim)
        # Edge: media queries see the text keys through their own norm (norm_k is then identity).
        k_for_media = apply_rope(self.k_norm_und_for_gen(k), cos, sin)
        if not text_output:
            return None, k_for_media, v
        q = apply_rope(self.norm_q(self.to_q(x).view(-1, self.heads, self.head_dim)), cos, sin)
        k = apply_rope(k, cos, sin)
        return self.to_out(attention(q, k, v, causal=True)), k_for_media, v

    def media(self, x, cos, sin, text_k, text_v, shards: SequenceShards | None = None,
              history: "LayerKV | None" = None, attend: Callable | None = None) -> torch.Tensor:
        """Media attention over [text ; media] keys and values, no mask; with `history` (a `MediaKV`'s view of this
        layer) over [text ; held media ; media], this forward's keys and values written after the held ones. `attend`
        is this forward's attention (`Hooks.attention`; None: the layer's `media_attention`).

        With `shards` (sequence parallelism) x holds this rank's tokens; attention runs over all tokens
        for this rank's heads, between two all-to-alls, and padding rows never serve as keys.
        """
        q = self.norm_added_q(self.add_q_proj(x).view(-1, self.heads, self.head_dim))
        k = self.norm_added_k(self.add_k_proj(x).view(-1, self.kv_heads, self.head_dim))
        v = self.add_v_proj(x).view(-1, self.kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if shards is not None:
            q = shards.to_heads(q)
            k, v = shards.to_heads(k)[: shards.tokens], shards.to_heads(v)[: shards.tokens]
            text_k, text_v = shards.my_heads(text_k), shards.my_heads(text_v)
        if history is not None:
            k, v = history.update(k, v, text_k, text_v)
        else:
            k, v = torch.cat([text_k, k]), torch.cat([text_v, v])
        out = (attend or self.media_attention or attention)(q, k, v)
        if shards is not None:
            out = shards.to_tokens(out.view(out.shape[0], -1, self.head_dim)).flatten(1)
        return self.to_add_out(out)


class DecoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig, text_output: bool = True, media: bool = True):
        super().__init__()
        self.text_output = text_output
        self.self_attn = MoTAttention(config, text_output, media)
        self.input_layernorm = make_norm(config, config.hidden_size)
        if text_output:
            self.post_attention_layernorm = make_norm(config, config.hidden_size)
            self.mlp = MLP(config)
        if media:
            self.input_layernorm_moe_gen = make_norm(config, config.hidden_size)
            self.post_attention_layernorm_moe_gen = make_norm(config, config.hidden_size)
            self.mlp_moe_gen = MLP(config)

    def text(self, x, cos, sin):
        """Text tokens [L, H] -> (next hidden or None, K for media, V)."""
        out, k, v = self.self_attn.text(self.input_layernorm(x), cos, sin, self.text_output)
        if not self.text_output:
            return None, k, v
        x = x + out
        return x + self.mlp(self.post_attention_layernorm(x)), k, v

    def media(self, x, cos, sin, text_k, text_v, shards=None, history=None, attend=None):
        """Media tokens [N, H] -> [N, H] (this rank's tokens under sequence parallelism)."""
        x = x + self.self_attn.media(self.input_layernorm_moe_gen(x), cos, sin, text_k, text_v, shards, history, attend)
        return x + self.mlp_moe_gen(self.post_attention_layernorm_moe_gen(x))


class TimestepEmbedder(nn.Module):
    """Cos-first sinusoid of the scaled timestep, then Linear-SiLU-Linear. Kept in fp32."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear_1 = nn.Linear(TIME_FREQ_CHANNELS, hidden)
        self.linear_2 = nn.Linear(hidden, hidden)

    def forward(self, scaled_t: torch.Tensor) -> torch.Tensor:
        half = TIME_FREQ_CHANNELS // 2
        device = scaled_t.device
        exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=device)
        freqs = torch.exp(exponent / half)
        angles = scaled_t[:, None].float() * freqs[None, :]
        emb = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
        return _run_linear(self.linear_2, F.silu(_run_linear(self.linear_1, emb)))


def _run_linear(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A linear layer of the fp32 time embedder on x's device: its weights come over at use (a host may leave them in
    CPU memory); an fp8 layer (an official FP8 file that quantized the embedder) brings its own over."""
    if type(layer) is nn.Linear:
        return F.linear(x.to(layer.weight.dtype), layer.weight.to(x.device), layer.bias.to(x.device))
    return layer(x)


def embedding(num: int, dim: int) -> nn.Embedding:
    """An embedding table without random init (weights are always loaded; init on meta is slow)."""
    return nn.Embedding(num, dim, _weight=torch.empty(num, dim))


class DomainAwareLinear(nn.Module):
    """A linear map with one weight matrix and bias per embodiment domain, stored as embedding tables."""

    def __init__(self, in_features: int, out_features: int, num_domains: int):
        super().__init__()
        self.in_features, self.out_features, self.num_domains = in_features, out_features, num_domains
        self.fc = embedding(num_domains, in_features * out_features)
        self.bias = embedding(num_domains, out_features)

    def forward(self, x: torch.Tensor, domain: int) -> torch.Tensor:
        if not 0 <= domain < self.num_domains:
            raise ValueError(f"action domain id {domain} is outside [0, {self.num_domains})")
        weight = self.fc.weight[domain].to(x.device).view(self.in_features, self.out_features)
        return x @ weight + self.bias.weight[domain].to(x.device)


@dataclass
class TextKV:
    """Per-layer text keys (as the media queries see them, RoPE applied) and values of one prompt."""

    length: int
    keys: list[torch.Tensor]  # each [L, K, D]
    values: list[torch.Tensor]  # each [L, K, D]

    def stacked(self) -> torch.Tensor:
        """One tensor [layers, 2, L, K, D] (keys, values), for hosts that pass conditioning as tensors."""
        return torch.stack([torch.stack(pair) for pair in zip(self.keys, self.values)])

    @classmethod
    def from_stacked(cls, kv: torch.Tensor) -> "TextKV":
        """The inverse of `stacked` (views, no copy)."""
        return cls(kv.shape[2], list(kv[:, 0].unbind()), list(kv[:, 1].unbind()))


VIDEO = "video"  # the head of a video's latent frames: the patch projections (`proj_in`, `proj_out`)


@dataclass
class Segment:
    """One part of a forward's media sequence, embedded and read out as every other: a video's latent frames
    [1, C, T, h, w], a token per patch, through the patch projections (head `VIDEO`: the forward's own video, a
    control, a recompute's committed frames), or rows [n, dim], a token each, through the checkpoint's head named
    `head` (a key of TRACK_HEADS: a sound track, an action chunk). Its position origin: a video's frames sit from
    latent frame `start_frame` at the forward's fps (every video restarts at the media offset, so a control and its
    video align token by token); rows sit at `fps` (None: the forward's), `base_temporal_factor` of them to a latent
    frame, from row `start_frame`. Multiview would add the camera to this origin: a video segment per view."""

    head: str
    latents: torch.Tensor  # a video's [1, C, T, h, w]; rows [n, dim]
    noisy: list[int] | None = None  # the frames (a video) or rows being denoised (None: all); the rest are clean:
    # no time embedding, zero velocity
    fps: float | None = None
    base_temporal_factor: int | None = None
    start_frame: int = 0
    domain: int | None = None  # the embodiment domain, for a head with one table per domain
    zeroed: bool = False  # its values zeroed in every layer while its keys still take attention, its rows all at
    # start_frame's time (Sim-Bimanual's null tokens; a media K/V cache zeroes them as it writes them)


# The heads a checkpoint may carry for tracks: input projection, output projection, modality embedding, by the
# checkpoint's own names.
TRACK_HEADS = {"sound": ("audio_proj_in", "audio_proj_out", "audio_modality_embed"),
               "action": ("action_proj_in", "action_proj_out", "action_modality_embed")}


@dataclass
class Velocity:
    vision: torch.Tensor  # [1, C, T, h, w], zero on conditioned frames
    tracks: list[torch.Tensor] = field(default_factory=list)  # one [n, dim] per input track, in order


@dataclass(frozen=True)
class LayerKV:
    """One layer's view of a `MediaKV` in one forward: the layer's key and value rows [rows, K, D], the first `held`
    of them earlier forwards', and the buffers [text_rows + rows, K, D] attention reads them from, the prompt's `text`
    rows right before the history."""

    keys: torch.Tensor
    values: torch.Tensor
    held: int
    buffers: tuple[torch.Tensor, torch.Tensor]  # the cache's own slabs (`in_place`) or the workspace the layers share
    text_rows: int
    text: int
    in_place: bool
    scales: torch.Tensor | None = None  # an fp8 cache's: [rows, 2, K, 1] float32, the keys' then the values'
    zeroed: slice | None = None  # this forward's rows whose values are zero (`Segment.zeroed`)

    def update(self, k: torch.Tensor, v: torch.Tensor, text_k: torch.Tensor,
               text_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this forward's k, v [n, K, D] after the held rows -> [text ; held ; written] keys and values, views
        of one buffer each, so attention reads the history where it is: the cache's own slab where it lives on k's
        device as it is (its text written once per prompt by `MediaKV.views`); else the workspace, which gets this
        layer's text, its held rows brought to the device (a cache in CPU memory) or dequantized (fp8), and k, v."""
        if self.zeroed is not None:
            v = v.clone()
            v[self.zeroed] = 0
        end = self.held + k.shape[0]
        first, last = self.text_rows - self.text, self.text_rows + end
        if self.in_place:  # written through the slab alone: a compiled block given two aliasing views of it (the
            # history's and the slab's) wrote every layer's rows into the first layer's under AOTAutograd
            for buffer, new in zip(self.buffers, (k, v)):
                buffer[self.text_rows + self.held : last] = new
            return self.buffers[0][first:last], self.buffers[1][first:last]
        for i, (buffer, store, text, new) in enumerate(zip(self.buffers, (self.keys, self.values), (text_k, text_v),
                                                            (k, v))):
            buffer[first : self.text_rows] = text
            held = buffer[self.text_rows : self.text_rows + self.held]
            if self.scales is None:
                store[self.held : end] = new
                held.copy_(store[: self.held])  # blocking: a later eviction rewrites these rows in place
            else:
                scale = new.detach().abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
                store[self.held : end] = (new.float() / scale).to(FP8).view(torch.uint8).to(store.device)
                self.scales[self.held : end, i] = scale.to(self.scales.device)
                held.copy_(store[: self.held].to(new.device).view(FP8))  # in place: e4m3 values are exact in bf16
                held.mul_(self.scales[: self.held, i].to(new.device, new.dtype))
            buffer[self.text_rows + self.held : last] = new
        return self.buffers[0][first:last], self.buffers[1][first:last]


class MediaKV:
    """The media keys and values of earlier forwards, per layer: the history a causal rollout's tokens attend to after
    the text. Preallocated, as gpt-fast's KV cache is: `rows` tokens per layer, the held ones first.

    A forward given the cache (`Hooks.cache`, its video placed from `Hooks.start_frame`) attends over [text ; held ;
    its own tokens] without a mask, and writes its own keys and values right after the held rows; `append` keeps
    them, each row under its latent frame (`MediaTokens.frames`). Keys are stored with their rotary positions
    applied, so every row keeps the absolute position it was written at, and since no mask orders the keys, `evict`
    fills the rows it frees with the latest rows instead of shifting the history. Not under sequence parallelism.

    Attention reads [text ; held ; own] as one view, never a concatenated copy (per layer per forward that copy was
    the whole history: ~311 GB a Sim-Transfer chunk at 150 held latent frames). On the forwards' device and not fp8,
    each layer's slab holds the prompt's text K/V right before its history (`slabs`; `keys` and `values` are the
    history's rows of them). Kept on the CPU (`device` "cpu" beside a GPU's forwards: pinned memory) or in fp8, each
    layer's rows come to the forward's device, or are dequantized, as the layer runs, into a workspace the layers
    share, after the layer's text.
    """

    def __init__(self, config: TransformerConfig, rows: int, dtype: torch.dtype, device: torch.device,
                 pinned: bool = False, fp8: bool = False):
        L, K, D = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
        stored = torch.uint8 if fp8 else dtype  # fp8 bytes (torch 2.7's CPU cannot index float8 itself)
        self.keys = torch.zeros((L, rows, K, D), dtype=stored, device=device, pin_memory=pinned)
        self.values = torch.zeros((L, rows, K, D), dtype=stored, device=device, pin_memory=pinned)
        # per row and head: amax / 448 of its keys, of its values
        self.scales = torch.zeros((L, rows, 2, K, 1), device=device, pin_memory=pinned) if fp8 else None
        self.frames = torch.zeros(0, dtype=torch.long)  # the latent frame of each held row, on the host
        self.written = torch.zeros(0, dtype=torch.long)  # the latent frame of each row the last forward wrote
        self.dtype = dtype
        self.slabs = (self.keys, self.values)  # [L, text_rows + rows, K, D]: room for text_rows before the history
        self.text_rows = 0
        self.text: TextKV | None = None  # the prompt whose K/V the slabs hold
        self.workspace: tuple[torch.Tensor, torch.Tensor] | None = None  # [text_rows + rows, K, D] each

    @property
    def held(self) -> int:
        return self.frames.numel()

    def views(self, seq: "MediaTokens", text: TextKV) -> list[LayerKV]:
        """Every layer's view for a forward over `seq` after `text`."""
        tokens = seq.hidden.shape[0]
        if self.held + tokens > self.keys.shape[1]:
            raise InputError(f"the media K/V cache has {self.keys.shape[1]} rows: the {self.held} held and a forward's "
                             f"{tokens} do not fit; evict frames first, or make it larger")
        self.written = seq.frames()
        in_place = self.scales is None and self.keys.device == seq.hidden.device
        if text.length > self.text_rows:
            self._make_text_rows(text.length, in_place)
        if in_place and text is not self.text:  # a new prompt: its K/V written once, before the history
            for slab, rows in zip(self.slabs, (text.keys, text.values)):
                for layer, r in zip(slab, rows):
                    layer[self.text_rows - text.length : self.text_rows] = r
            self.text = text
        if not in_place and (self.workspace is None or self.workspace[0].device != seq.hidden.device):
            shape = (self.text_rows + self.keys.shape[1], *self.keys.shape[2:])
            self.workspace = tuple(torch.empty(shape, dtype=self.dtype, device=seq.hidden.device) for _ in range(2))
        buffers = zip(*self.slabs) if in_place else [self.workspace] * len(self.keys)
        scales = [None] * len(self.keys) if self.scales is None else self.scales
        return [LayerKV(k, v, self.held, b, self.text_rows, text.length, in_place, s, seq.zeroed)
                for k, v, b, s in zip(self.keys, self.values, buffers, scales)]

    def _make_text_rows(self, rows: int, in_place: bool) -> None:
        """Room for a prompt of `rows` tokens before the history: the slabs remade, the held rows kept (where none
        are held, the old slab goes first); a workspace is remade at its next use."""
        self.text_rows, self.text, self.workspace = rows, None, None
        if not in_place:
            return
        history, device = self.keys.shape[1], self.keys.device
        slabs, self.slabs = [], ()
        for name in ("keys", "values"):
            held = getattr(self, name)[:, : self.held] if self.held else None  # none held: the old slab goes first
            L, _, K, D = getattr(self, name).shape
            setattr(self, name, None)
            slab = torch.zeros((L, rows + history, K, D), dtype=self.dtype, device=device)
            if held is not None:
                slab[:, rows : rows + self.held] = held
            slabs.append(slab)
            setattr(self, name, slab[:, rows:])
        self.slabs = tuple(slabs)

    def append(self) -> None:
        """Keep what the last forward wrote."""
        if not self.written.numel():
            raise ValueError("the last forward wrote 0 rows: nothing to keep")
        self.frames, self.written = torch.cat([self.frames, self.written]), self.written[:0]

    def evict(self, sink: int, window: int) -> None:
        """Keep the rows of the first `sink` frames and of the latest `window` frames. The latest rows kept move into
        the rows freed, so the held rows stay the first ones and each move copies one row per layer."""
        held = self.frames.unique()  # sorted
        later = held[sink:]
        keep = torch.isin(self.frames, torch.cat([held[:sink], later[max(later.numel() - window, 0) :]]))
        count = int(keep.sum())
        freed = (~keep[:count]).nonzero().flatten()
        moved = keep[count:].nonzero().flatten() + count
        to, fro = freed.to(self.keys.device), moved.to(self.keys.device)
        self.keys[:, to], self.values[:, to] = self.keys[:, fro], self.values[:, fro]
        if self.scales is not None:
            self.scales[:, to] = self.scales[:, fro]
        self.frames[freed] = self.frames[moved]
        self.frames = self.frames[:count]


@dataclass(frozen=True)
class Hooks:
    """What a forward's media layer stack runs through besides the layers' weights. A model keeps the hooks of its
    load (`Cosmos3Transformer.hooks`: block swap, a host's weight streaming); a run passes its own to each forward,
    made from those with `dataclasses.replace` (the compiled block, a step cache, a rollout's media K/V, where its
    frames start and the attention it runs), as gpt-fast passes `input_pos` and its caches to each forward."""

    block: Callable = DecoderLayer.media  # runs one media layer; `compiled_media_block()` is its compiled form
    layer: object | None = None  # .before(i) / .after(i) around media layer i: block swap, host streaming
    stack: Callable | None = None  # stack(hidden, run) around the layer stack: a step cache may return without run
    cache: MediaKV | None = None  # earlier frames' media K/V, attended after the text
    start_frame: int = 0  # the latent frame in the clip this forward's video starts at
    attention: Callable | None = None  # this forward's media attention (a recompute's mask); None: the layers' own
    # (`Cosmos3Transformer.use_media_attention`: SDPA or a host's backend)
    rope: tuple[torch.Tensor, torch.Tensor] | None = None  # this forward's rotary tables (cos, sin), made before it
    # (a fixed-shape step's static buffers: `chunk_step`); None: made from its segments' positions


@dataclass(frozen=True)
class Placed:
    """A segment in the sequence: its rows there and its grid, the patches of a video (T, hp, wp) or rows (n, 1, 1):
    a frame of the grid is a latent frame of a video, a row of a track."""

    segment: Segment
    rows: slice
    grid: tuple[int, int, int]

    def frames(self) -> torch.Tensor:
        """The latent frame of each of its tokens, on the host: a video's token its frame's; a row the frame whose time
        it reaches (`base_temporal_factor` rows to a frame: an action frame's last token sits at the frame's own
        time); zeroed rows their origin's."""
        s, (T, hp, wp) = self.segment, self.grid
        if s.head == VIDEO:
            return (s.start_frame + torch.arange(T)).repeat_interleave(hp * wp)
        if s.zeroed:
            return torch.full((T,), s.start_frame)
        per = s.base_temporal_factor or 1
        return torch.div(s.start_frame + torch.arange(T) + per - 1, per, rounding_mode="floor")


@dataclass
class MediaTokens:
    """One forward's media sequence, its segments one after another, from the embedding to the read-out."""

    hidden: torch.Tensor  # [N, H] (this rank's rows under sequence parallelism)
    cos: torch.Tensor  # the rows' rotary tables
    sin: torch.Tensor
    placed: list[Placed]  # in sequence order
    shards: SequenceShards | None = None
    zeroed: slice | None = None  # the rows of the zeroed segment (`Segment.zeroed`)

    def frames(self) -> torch.Tensor:
        """The latent frame of each token, on the host: what a media K/V cache keeps its rows by."""
        return torch.cat([p.frames() for p in self.placed])


class Cosmos3Transformer(nn.Module):
    def __init__(self, config: TransformerConfig, media: bool = True):
        """`media=False` builds the text tower alone (embeddings and every layer's text pathway): what the
        Reasoner shares, without the generator's weights."""
        super().__init__()
        self.config = config
        self.has_media = media
        H = config.hidden_size
        self.embed_tokens = embedding(config.vocab_size, H)
        last = config.num_hidden_layers - 1
        self.layers = nn.ModuleList(DecoderLayer(config, i < last, media) for i in range(config.num_hidden_layers))
        self.hooks = Hooks()  # this load's: what a forward runs through when its run passes none
        if not media:
            return
        self.norm_moe_gen = make_norm(config, H)
        self.proj_in = linear(config.patch_latent_dim, H)
        self.proj_out = linear(H, config.patch_latent_dim)
        self.time_embedder = TimestepEmbedder(H)
        if config.sound_gen:
            self.audio_proj_in = linear(config.sound_dim, H)
            self.audio_proj_out = linear(H, config.sound_dim)
            self.audio_modality_embed = nn.Parameter(torch.zeros(H))
        if config.action_gen:
            n = config.num_embodiment_domains
            self.action_proj_in = DomainAwareLinear(config.action_dim, H, n)
            self.action_proj_out = DomainAwareLinear(H, config.action_dim, n)
            self.action_modality_embed = nn.Parameter(torch.zeros(H))

    def use_media_attention(self, attend) -> None:
        """Run every layer's media attention with `attend` (see MoTAttention.media_attention; None: SDPA)."""
        for layer in self.layers:
            layer.self_attn.media_attention = attend

    @property
    def dtype(self) -> torch.dtype:
        """The media activations' dtype (a norm gain's: linear weights may be stored in fp8)."""
        return (self.norm_moe_gen if self.has_media else self.layers[0].input_layernorm).weight.dtype

    @property
    def text_dtype(self) -> torch.dtype:
        """The text tower's activations' dtype: bf16 in an fp16 load (`split_dtypes`)."""
        return self.layers[0].input_layernorm.weight.dtype

    @property
    def device(self) -> torch.device:
        """Where the media tower's weights are (the text tower may be offloaded elsewhere between prompts). Runs go
        where their inputs are (`forward`) or where they are sent (`encode_text`), not here: a host may leave
        small modules in CPU memory."""
        return (self.norm_moe_gen if self.has_media else self.embed_tokens).weight.device

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        inv_freq = inverse_frequencies(c.head_dim, c.rope_theta, device=positions.device)
        return mrope_cos_sin(positions, inv_freq, c.rope_axes_dim, dtype)

    @torch.no_grad()
    def encode_text(self, input_ids: torch.Tensor, device: torch.device | None = None) -> TextKV:
        """Run the text tower once for a prompt, on `device` (default: where the media tower is); input_ids [L]."""
        device = self.device if device is None else torch.device(device)
        input_ids = input_ids.reshape(-1)
        cos, sin = self.rope(text_positions(input_ids.numel(), device=device), self.text_dtype)
        x = self.embed_tokens(input_ids.to(self.embed_tokens.weight.device)).to(device)  # looked up where it is
        keys, values = [], []
        for layer in self.layers:
            cancel.check()
            x, k, v = layer.text(x, cos, sin)
            keys.append(k.to(self.dtype))  # (the media pathway's dtype: they join its keys and values)
            values.append(v.to(self.dtype))
        return TextKV(input_ids.numel(), keys, values)

    def time_embedding(self, timestep: torch.Tensor, device: torch.device) -> torch.Tensor:
        """[1, H] embedding of a scheduler timestep (int64 for UniPC, float32 for FlowMatch) on `device`."""
        scaled = timestep.reshape(1).to(device) * self.config.timestep_scale
        return self.time_embedder(scaled).to(self.dtype)

    def patchify(self, latents: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """[C, T, h, w] -> tokens [T*hp*wp, p*p*C] (frame, row, column order) and the grid (T, hp, wp)."""
        p = self.config.latent_patch_size
        C, T, h, w = latents.shape
        hp, wp = -(-h // p), -(-w // p)
        if (hp * p, wp * p) != (h, w):  # odd latent sizes: zero-pad bottom/right
            latents = F.pad(latents, (0, wp * p - w, 0, hp * p - h))
        x = latents.reshape(C, T, hp, p, wp, p).permute(1, 2, 4, 3, 5, 0)
        return x.reshape(T * hp * wp, p * p * C), (T, hp, wp)

    def unpatchify(self, tokens: torch.Tensor, frames: int, grid: tuple[int, int, int], h: int, w: int):
        """Tokens [frames*hp*wp, p*p*C] -> [C, frames, h, w] (padding cropped)."""
        p, C = self.config.latent_patch_size, self.config.latent_channel
        _, hp, wp = grid
        x = tokens.reshape(frames, hp, wp, p, p, C).permute(5, 0, 1, 3, 2, 4)
        return x.reshape(C, frames, hp * p, wp * p)[:, :, :h, :w]

    @torch.no_grad()
    def forward(self, latents: torch.Tensor, timestep: torch.Tensor, text: TextKV, noisy_frames: list[int] | None = None,
                fps: float = 24.0, tracks: Sequence[Segment] = (), sp: Group | None = None,
                context: Sequence[Segment] = (), hooks: Hooks | None = None) -> Velocity:
        """Predict the flow velocity of the media tokens.

        latents [1, C, T, h, w] on the device the forward runs on, from latent frame `hooks.start_frame`; timestep a
        scalar tensor; text the prompt's cached K/V; noisy_frames the latent frames being denoised (default all; the
        rest are clean conditioning and get no timestep embedding and zero velocity); fps the video frame rate; tracks
        the segments of rows denoised beside the video (their velocities come back in `Velocity.tracks`, in order); sp
        a sequence-parallel group (every rank passes the same inputs and gets the same result); context clean
        segments placed before the video (transfer controls, a recompute's committed frames): no output; hooks the
        run's (default: the model's `hooks`).
        """
        hooks = self.hooks if hooks is None else hooks
        segments = [*context, Segment(VIDEO, latents, noisy_frames, start_frame=hooks.start_frame), *tracks]
        seq = self.embed(segments, timestep, text.length, fps, latents.device, hooks.rope)
        if sp is not None:
            self.shard(seq, sp, hooks)
        video, *rows = self.read_out(self.blocks(seq, text, hooks), seq, seq.placed[len(context) :])
        return Velocity(video, rows)

    def embed(self, segments: Sequence[Segment], timestep, text_length: int, fps: float, device: torch.device,
              rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> MediaTokens:
        """The media sequence embedded on `device`, segment by segment, with its rotary tables (`rope`: given;
        None: `rotary`'s). Its own intermediates (patches, per-segment embeddings) are gone when it returns: the layer
        stack holds one copy of the tokens."""
        temb = self.time_embedding(timestep, device)
        tokens, placed, zeroed, row = [], [], None, 0
        for s in segments:
            if s.head == VIDEO:
                patches, grid = self.patchify(s.latents.to(device=device, dtype=self.dtype)[0])
                x = self.proj_in(patches).view(grid[0], grid[1] * grid[2], -1)
            else:
                proj_in, _, modality = self.track_head(s.head)
                x = (_project(proj_in, s.latents.to(device, self.dtype), s.domain) + modality.to(device)).unsqueeze(1)
                grid = (x.shape[0], 1, 1)
            noisy = _frames(s.noisy, grid[0])
            if _count(noisy):
                x[noisy] += temb
            n = x.shape[0] * x.shape[1]
            if s.zeroed:
                if zeroed is not None:
                    raise InputError("one forward takes one segment of zeroed tokens")
                zeroed = slice(row, row + n)
            tokens.append(x.flatten(0, 1))
            placed.append(Placed(s, slice(row, row + n), grid))
            row += n
        cos, sin = self.rotary(segments, text_length, fps, device) if rope is None else rope
        return MediaTokens(torch.cat(tokens), cos, sin, placed, zeroed=zeroed)

    def rotary(self, segments: Sequence[Segment], text_length: int, fps: float,
               device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary tables (cos, sin) of a media sequence's tokens, segment by segment where each sits."""
        offset = text_length + self.config.unified_3d_mrope_temporal_modality_margin
        positions = []
        for s in segments:
            if s.head == VIDEO:
                p = self.config.latent_patch_size
                grid = (s.latents.shape[2], *(-(-n // p) for n in s.latents.shape[3:]))
                # frames placed after the first (a rollout's) are video frames however few this forward holds
                where = self.segment_positions(grid, offset, fps, TEMPORAL_FACTOR, None, s.start_frame,
                                               s.start_frame > 0, device)
            else:
                rows = s.latents.shape[0]
                where = self.segment_positions((1, 1, 1) if s.zeroed else (rows, 1, 1), offset,
                                               fps if s.fps is None else s.fps, 1, s.base_temporal_factor,
                                               s.start_frame, False, device).expand(-1, rows)
            positions.append(where)
        return self.rope(torch.cat(positions, dim=1), self.dtype)

    def segment_positions(self, grid, offset: int, fps: float, temporal_factor: int, base_temporal_factor: int | None,
                        start_frame: int, in_video: bool, device: torch.device) -> torch.Tensor:
        """The positions of one segment's tokens (`rope.media_positions` with this checkpoint's settings)."""
        c = self.config
        return media_positions(*grid, offset, fps if c.enable_fps_modulation else None, float(c.base_fps),
                               temporal_factor, base_temporal_factor, start_frame, c.unified_3d_mrope_reset_spatial_ids,
                               device, in_video)

    def shard(self, seq: MediaTokens, sp: Group, hooks: Hooks) -> None:
        """Keep this rank's rows of the sequence (`SequenceShards`)."""
        if any(p.segment.head != VIDEO for p in seq.placed):
            raise InputError("sound and action tracks do not run under sequence parallelism; run them with sp=1")
        if hooks.cache is not None:
            raise InputError("the media K/V cache does not run under sequence parallelism; run it with sp=1")
        check_heads(sp, self.config.num_attention_heads, self.config.num_key_value_heads)
        seq.shards = SequenceShards(sp, seq.hidden.shape[0])
        seq.hidden, seq.cos, seq.sin = (seq.shards.shard(t) for t in (seq.hidden, seq.cos, seq.sin))

    def blocks(self, seq: MediaTokens, text: TextKV, hooks: Hooks) -> torch.Tensor:
        """The media layer stack over the sequence and its final norm, through `hooks` -> the normed hidden states.
        The norm belongs to the stack, as in NVIDIA's framework (its language model returns the normed sequence) and
        diffusers (`_run_decoder_stack`): a step cache's residual is the normed output minus the input, and a skipped
        step runs no norm."""

        if seq.zeroed is not None and hooks.cache is None:
            raise InputError("null tokens (zeroed values) run with a media K/V cache, which zeroes them as it writes "
                             "them: a causal rollout's forwards")

        def run(hidden: torch.Tensor) -> torch.Tensor:
            history = [None] * len(self.layers) if hooks.cache is None else hooks.cache.views(seq, text)
            for i, (layer, k, v, held) in enumerate(zip(self.layers, text.keys, text.values, history)):
                cancel.check()
                if hooks.layer is not None:
                    hooks.layer.before(i)
                hidden = hooks.block(layer, hidden, seq.cos, seq.sin, k, v, seq.shards, held, hooks.attention)
                if hooks.layer is not None:
                    hooks.layer.after(i)
            return self.norm_moe_gen(hidden)

        return run(seq.hidden) if hooks.stack is None else hooks.stack(seq.hidden, run)

    def read_out(self, hidden: torch.Tensor, seq: MediaTokens, placed: Sequence[Placed]) -> list[torch.Tensor]:
        """The velocity of each segment `placed` names, from the normed hidden states: of its noisy frames or rows,
        zero elsewhere (a video's [1, C, T, h, w], rows' [n, dim])."""
        if seq.shards is not None:  # gather 192-wide patch outputs, not hidden states (videos only: tracks are refused)
            hidden = seq.shards.gather(self.proj_out(hidden))
        velocities = []
        for p in placed:
            s, T = p.segment, p.grid[0]
            noisy = _frames(s.noisy, T)
            if s.head == VIDEO:
                size = s.latents.shape[3:]
                velocity = hidden.new_zeros(self.config.latent_channel, T, *size, dtype=self.dtype)
                if _count(noisy):
                    out = hidden[p.rows].view(T, -1, hidden.shape[-1])[noisy].flatten(0, 1)
                    out = out if seq.shards is not None else self.proj_out(out)
                    velocity[:, noisy] = self.unpatchify(out, _count(noisy), p.grid, *size)
                velocities.append(velocity.unsqueeze(0))
            else:
                velocity = hidden.new_zeros(s.latents.shape, dtype=self.dtype)
                velocity[noisy] = _project(self.track_head(s.head)[1], hidden[p.rows][noisy], s.domain)
                velocities.append(velocity)
        return velocities

    def track_head(self, name: str) -> tuple[nn.Module, nn.Module, torch.Tensor]:
        """The input projection, output projection and modality embedding of the track head `name`."""
        if name not in TRACK_HEADS or not hasattr(self, TRACK_HEADS[name][0]):
            raise InputError(f"this checkpoint has no {name} head (its transformer config does not enable it)")
        return tuple(getattr(self, attribute) for attribute in TRACK_HEADS[name])


def _project(module: nn.Module, x: torch.Tensor, domain: int | None) -> torch.Tensor:
    return module(x) if domain is None else module(x, domain)


MEDIA_PATHWAY = ("_moe_gen", "self_attn.add_", "self_attn.to_add_out", "self_attn.norm_added_")


@functools.cache
def compiled_media_block(backend: str = "inductor"):
    """`DecoderLayer.media` compiled by torch.compile, made once per process. Every layer shares it: the layers'
    parameters are the graph's inputs, not constants, so one compile serves the whole stack (recompiled once when
    the token counts change, then with dynamic shapes)."""
    return torch.compile(DecoderLayer.media, backend=backend)


_eager_reasons_said: set[str] = set()
NO_TRITON = ("torch.compile cannot make kernels for this GPU: Triton is not installed (pip install triton; on Windows, "
             "triton-windows) or the card is older than compute capability 7.0")


def media_block(compile: bool | None, device: torch.device, eager_because: str | None = None) -> Callable:
    """The block a run's media layers run: compiled (`compiled_media_block`) or eager. `compile` None is auto:
    compiled on a CUDA GPU where torch.compile can make kernels (Triton installed and a card it serves), unless
    `eager_because` names what rules it out for this run (a causal rollout, sequence parallelism); eager otherwise,
    said once per reason on a GPU (a warning where Triton is missing: the user can change that). Auto never fails
    a run for compiling: a block that cannot be compiled after all runs eagerly (`EagerIfCompileFails`)."""
    if compile is not None:
        return compiled_media_block() if compile else DecoderLayer.media
    device_facts = facts(device)
    if eager_because is None and device_facts.type == "cuda":
        if device_facts.triton:
            return EagerIfCompileFails(compiled_media_block())
        eager_because = NO_TRITON
    if device_facts.type == "cuda" and eager_because not in _eager_reasons_said:
        _eager_reasons_said.add(eager_because)
        log.log(logging.WARNING if eager_because == NO_TRITON else logging.INFO,
                "compile auto: the media block runs eagerly: %s", eager_because)
    return DecoderLayer.media


class EagerIfCompileFails:
    """Auto's compiled block: where torch.compile fails to compile it after all (no C compiler for Triton, a setup
    only a try finds), that call and every later one run the eager block, said once per process."""

    failed = False

    def __init__(self, compiled: Callable):
        self.compiled = compiled

    def __call__(self, layer: DecoderLayer, *args):
        from torch._dynamo.exc import BackendCompilerFailed

        if not EagerIfCompileFails.failed:
            try:
                return self.compiled(layer, *args)
            except BackendCompilerFailed as exc:
                EagerIfCompileFails.failed = True
                cause = getattr(exc, "inner_exception", exc)
                log.warning("compile auto: torch.compile could not compile the media block here, so it runs eagerly "
                            "from now on (compile off skips the attempt): %s: %s", type(cause).__name__, cause)
        return DecoderLayer.media(layer, *args)


def pathway_of(name: str) -> str | None:
    """The precision pathway of a linear: "media" or "text" inside the layers, None for the projections around them."""
    if not name.startswith("layers."):
        return None
    return "media" if tower_of(name) == "media tower" else "text"


def tower_of(name: str) -> str:
    """Which part a parameter belongs to: "text tower", "media tower" or "embeddings and heads"."""
    if name.startswith("embed_tokens."):
        return "text tower"
    if not name.startswith("layers."):
        return "embeddings and heads"
    return "media tower" if any(marker in name for marker in MEDIA_PATHWAY) else "text tower"


def load_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a transformer's weights are read in: bf16 for an fp16 load, whose text tower stays there and whose
    media pathway `split_dtypes` then casts to fp16 (where it can)."""
    return torch.bfloat16 if dtype == torch.float16 else dtype


def split_dtypes(model: nn.Module, dtype: torch.dtype) -> None:
    """fp16, honestly. The text tower (and the Reasoner on it) overflows fp16, as Qwen3's and Nemotron's activations
    do: it stays in bf16, the released precision. Edge's squared-ReLU MLPs overflow fp16 once |u| > 256: its media
    pathway stays in bf16 too. Only the gated checkpoints' media pathway (and the heads around it) runs in fp16;
    a run that still overflows is named by its finite check (`FiniteCheck`)."""
    if dtype != torch.float16:
        return
    text_and_edge = "the text tower stays in bf16 (it overflows fp16, as Qwen3's does)"
    if model.config.is_dense:
        log.warning("fp16: Edge runs in bf16: %s, and its squared-ReLU MLPs overflow fp16 once |u| > 256", text_and_edge)
        return
    log.warning("fp16: the media pathway runs in fp16; %s", text_and_edge)
    for name, p in model.named_parameters():
        if tower_of(name) != "text tower" and p.dtype == torch.bfloat16:  # not fp8, GGUF bytes or fp32 parts
            p.data = p.data.to(torch.float16)


def _frames(selected: list[int] | None, count: int) -> slice | list[int]:
    return _rows(range(count) if selected is None else selected)


def _rows(selected) -> slice | list[int]:
    """Rows to index: a slice where they are consecutive (a view; a list would build an index tensor on the host and
    copy it to the device at every forward), else the sorted list."""
    rows = sorted(set(selected))
    if rows and rows == list(range(rows[0], rows[-1] + 1)):
        return slice(rows[0], rows[-1] + 1)
    return rows


def _count(rows: slice | list[int]) -> int:
    return rows.stop - rows.start if isinstance(rows, slice) else len(rows)


def checkpoint_key_mapper(config: TransformerConfig, media: bool = True):
    """Map a checkpoint key to a parameter name, or None for tensors generation never reads (with `media=False`,
    for tensors the text tower alone does not hold)."""
    last = f"layers.{config.num_hidden_layers - 1}."
    last_text_tail = tuple(
        last + part
        for part in ("self_attn.to_q.", "self_attn.to_out.", "self_attn.norm_q.", "post_attention_layernorm.", "mlp.")
    )
    aliases = {"vae2llm.": "proj_in.", "llm2vae.": "proj_out."}  # names used by some FP8 exports

    def map_key(key: str) -> str | None:
        if key in ("lm_head.weight", "norm.weight") or key.startswith(last_text_tail):
            return None
        if not media and tower_of(key) != "text tower":
            return None
        for old, new in aliases.items():
            if key.startswith(old):
                return new + key[len(old) :]
        return key

    return map_key
