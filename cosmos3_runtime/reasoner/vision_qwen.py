"""The Qwen3-VL vision tower of Nano and Super: patches -> language-model tokens, plus deepstack features.

Parameter names equal the `vision_encoder/` checkpoint keys. Each image, and each temporal slice of a
video, attends only to itself. The learned 2-D position table is resampled to each grid bilinearly
(align_corners=True) as four fp32 taps per patch; the 2-D rotary embedding runs in fp32.

Notation: N patches, C vision width, M = 4 C (one 2x2 merge block), E language-model width.
"""

import torch
import torch.nn.functional as F
from torch import nn

from ..rope import apply_rope
from ..transformer import embedding, linear
from .config import QwenVisionConfig

ROPE_THETA = 10000.0
LN_EPS = 1e-6


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm whose parameters come to the input's device at use (a host may leave them in CPU memory)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight.to(x.device), self.bias.to(x.device), self.eps)


def layer_norm(dim: int, eps: float = LN_EPS) -> LayerNorm:
    return LayerNorm(dim, eps=eps)


class PatchEmbed(nn.Module):
    def __init__(self, c: QwenVisionConfig):
        super().__init__()
        self.kernel = (c.temporal_patch_size, c.patch_size, c.patch_size)
        self.in_channels = c.in_channels
        self.proj = nn.Conv3d(c.in_channels, c.hidden_size, self.kernel, stride=self.kernel, bias=True)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:  # [N, C*t*p*p] -> [N, C]
        x = pixels.to(self.proj.weight.dtype).view(-1, self.in_channels, *self.kernel)
        weight, bias = self.proj.weight.to(x.device), self.proj.bias.to(x.device)
        return F.conv3d(x, weight, bias, stride=self.kernel).flatten(1)


class Attention(nn.Module):
    def __init__(self, c: QwenVisionConfig):
        super().__init__()
        self.heads = c.num_heads
        self.qkv = linear(c.hidden_size, 3 * c.hidden_size)
        self.proj = linear(c.hidden_size, c.hidden_size)

    def forward(self, x, cos, sin, lengths: list[int]) -> torch.Tensor:
        q, k, v = self.qkv(x).view(x.shape[0], 3, self.heads, -1).unbind(1)  # each [N, heads, d]
        q, k = (apply_rope(t.float(), cos, sin).to(t.dtype) for t in (q, k))
        out = [segment_attention(*parts) for parts in zip(*(t.split(lengths) for t in (q, k, v)))]
        return self.proj(torch.cat(out).flatten(1))


def segment_attention(q, k, v) -> torch.Tensor:
    """Full attention within one segment: [n, heads, d] each -> [n, heads, d]."""
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v)[0].transpose(0, 1)


class MLP(nn.Module):
    def __init__(self, c: QwenVisionConfig):
        super().__init__()
        self.linear_fc1 = linear(c.hidden_size, c.intermediate_size)
        self.linear_fc2 = linear(c.intermediate_size, c.hidden_size)

    def forward(self, x):
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c: QwenVisionConfig):
        super().__init__()
        self.norm1, self.norm2 = layer_norm(c.hidden_size), layer_norm(c.hidden_size)
        self.attn = Attention(c)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, lengths):
        x = x + self.attn(self.norm1(x), cos, sin, lengths)
        return x + self.mlp(self.norm2(x))


class Merger(nn.Module):
    """2x2 patches -> one language-model token. The main merger normalises each patch, a deepstack merger the
    concatenated block."""

    def __init__(self, c: QwenVisionConfig, norm_after_shuffle: bool):
        super().__init__()
        self.block = c.hidden_size * c.spatial_merge_size**2
        self.norm_after_shuffle = norm_after_shuffle
        self.norm = layer_norm(self.block if norm_after_shuffle else c.hidden_size)
        self.linear_fc1 = linear(self.block, self.block)
        self.linear_fc2 = linear(self.block, c.out_hidden_size)

    def forward(self, x):  # [N, C] -> [N/4, E]
        x = self.norm(x.view(-1, self.block)) if self.norm_after_shuffle else self.norm(x).view(-1, self.block)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class QwenVisionTower(nn.Module):
    def __init__(self, c: QwenVisionConfig):
        super().__init__()
        self.config = c
        self.patch_embed = PatchEmbed(c)
        self.pos_embed = embedding(c.num_position_embeddings, c.hidden_size)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.depth))
        self.merger = Merger(c, norm_after_shuffle=False)
        self.deepstack_merger_list = nn.ModuleList(Merger(c, True) for _ in c.deepstack_visual_indexes)

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embed.proj.weight.dtype

    def forward(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]):
        """pixels [N, patch_dim] -> (tokens [N/4, E], deepstack features: one [N/4, E] per tapped block)."""
        device = pixels.device
        x = self.patch_embed(pixels)
        x = x + self.position_embedding(grids, device).to(x.dtype)
        cos, sin = self.rotary(grids, device)
        lengths = [h * w for t, h, w in grids for _ in range(t)]
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, lengths)
            if i in self.config.deepstack_visual_indexes:
                deepstack.append(self.deepstack_merger_list[self.config.deepstack_visual_indexes.index(i)](x))
        return self.merger(x), deepstack

    def block_order(self, h: int, w: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column of each patch of an h x w grid, in 2x2 merge-block order."""
        m = self.config.spatial_merge_size
        rows = torch.arange(h, device=device).view(h // m, m, 1, 1).expand(-1, -1, w // m, m)
        cols = torch.arange(w, device=device).view(1, 1, w // m, m).expand(h // m, m, -1, -1)
        return rows.transpose(1, 2).reshape(-1), cols.transpose(1, 2).reshape(-1)

    def position_embedding(self, grids, device) -> torch.Tensor:
        """The learned table resampled to each grid: bilinear, corners aligned, four fp32 taps, summed in fp32."""
        side = int(self.config.num_position_embeddings**0.5)
        table = self.pos_embed.weight.to(device)
        out = []
        for t, h, w in grids:
            rows, cols = self.block_order(h, w, device)
            (r0, r1), (wr0, wr1) = _taps(rows, h, side)
            (c0, c1), (wc0, wc1) = _taps(cols, w, side)
            taps = ((r0, c0, wr0 * wc0), (r0, c1, wr0 * wc1), (r1, c0, wr1 * wc0), (r1, c1, wr1 * wc1))
            embedding = sum(table[r * side + c] * weight[:, None] for r, c, weight in taps)
            out.append(embedding.repeat(t, 1))
        return torch.cat(out)

    def rotary(self, grids, device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [N, d] (fp32) of the 2-D rotary embedding: [row freqs | col freqs], twice."""
        d = self.config.hidden_size // self.config.num_heads
        inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, d // 2, 2, dtype=torch.float32, device=device) / (d // 2))
        angles = []
        for t, h, w in grids:
            rows, cols = self.block_order(h, w, device)
            angle = torch.cat([rows[:, None].float() * inv_freq, cols[:, None].float() * inv_freq], dim=-1)
            angles.append(angle.repeat(t, 1))
        emb = torch.cat(angles)
        emb = torch.cat([emb, emb], dim=-1)
        return emb.cos(), emb.sin()


def _taps(index: torch.Tensor, size: int, side: int):
    """The two source rows (or columns) of each target index and their linear weights, corners aligned."""
    src = index.float() * (side - 1) / max(size - 1, 1)
    floor = src.floor()
    lower = floor.long().clamp(0, side - 1)
    upper = (floor.long() + 1).clamp(0, side - 1)
    weight_lower = (1 - (src - floor).abs()).clamp(min=0)
    weight_upper = (1 - (src - floor - 1).abs()).clamp(min=0)
    return (lower, upper), (weight_lower, weight_upper)
