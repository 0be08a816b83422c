"""Edge's vision tower (a packed SigLIP2 encoder) and the projector into the language model.

Parameter names equal the checkpoint's native keys under `model.visual.` and `model.projector.`.
Patch vectors are (py, px, C); the learned 16x16 position grid is resized to each frame's grid with
antialiased bilinear interpolation (fp32 on the CPU, where bf16 has no antialiased kernel); there is
no rotary embedding; each frame attends only to itself.
"""

import torch
import torch.nn.functional as F
from torch import nn

from ..transformer import embedding, linear
from .config import EdgeVisionConfig
from .vision_qwen import layer_norm, segment_attention

PROJECTOR_LN_EPS = 1e-6


class Embeddings(nn.Module):
    def __init__(self, c: EdgeVisionConfig):
        super().__init__()
        self.config = c
        self.patch_embedding = linear(c.num_channels * c.patch_size**2, c.hidden_size)
        self.position_embedding = embedding(c.num_patches, c.hidden_size)

    def forward(self, pixels: torch.Tensor, grids) -> torch.Tensor:
        x = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype))
        return x + self.positions(grids, x.device)

    def positions(self, grids, device: torch.device) -> torch.Tensor:
        side, m = int(self.config.num_patches**0.5), self.config.spatial_merge_size
        table = self.position_embedding.weight.to(device).view(side, side, -1).permute(2, 0, 1).unsqueeze(0)
        dtype = table.dtype
        if table.device.type == "cpu":
            table = table.float()
        out = []
        for t, h, w in grids:
            grid = F.interpolate(table, size=(h, w), mode="bilinear", align_corners=False, antialias=True)
            grid = grid[0].permute(1, 2, 0).to(dtype).reshape(h // m, m, w // m, m, -1)
            out.append(grid.transpose(1, 2).reshape(h * w, -1).repeat(t, 1))  # 2x2 merge-block order
        return torch.cat(out)


class Attention(nn.Module):
    def __init__(self, c: EdgeVisionConfig):
        super().__init__()
        self.heads = c.num_attention_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (linear(c.hidden_size, c.hidden_size) for _ in range(4))

    def forward(self, x, lengths: list[int]) -> torch.Tensor:
        q, k, v = (proj(x).view(x.shape[0], self.heads, -1) for proj in (self.q_proj, self.k_proj, self.v_proj))
        out = [segment_attention(*parts) for parts in zip(*(t.split(lengths) for t in (q, k, v)))]
        return self.out_proj(torch.cat(out).flatten(1))


class MLP(nn.Module):
    def __init__(self, c: EdgeVisionConfig):
        super().__init__()
        self.fc1 = linear(c.hidden_size, c.intermediate_size)
        self.fc2 = linear(c.intermediate_size, c.hidden_size)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class EncoderLayer(nn.Module):
    def __init__(self, c: EdgeVisionConfig):
        super().__init__()
        self.layer_norm1 = layer_norm(c.hidden_size, c.layer_norm_eps)
        self.self_attn = Attention(c)
        self.layer_norm2 = layer_norm(c.hidden_size, c.layer_norm_eps)
        self.mlp = MLP(c)

    def forward(self, x, lengths):
        x = x + self.self_attn(self.layer_norm1(x), lengths)
        return x + self.mlp(self.layer_norm2(x))


class Encoder(nn.Module):
    def __init__(self, c: EdgeVisionConfig):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(c) for _ in range(c.num_hidden_layers))


class Visual(nn.Module):
    def __init__(self, c: EdgeVisionConfig):
        super().__init__()
        self.embeddings = Embeddings(c)
        self.encoder = Encoder(c)
        self.post_layernorm = layer_norm(c.hidden_size, c.layer_norm_eps)


class Projector(nn.Module):
    """Each patch normalised, 2x2 patches concatenated, then a GELU MLP into the language model's width."""

    def __init__(self, c: EdgeVisionConfig):
        super().__init__()
        self.block = c.hidden_size * c.spatial_merge_size**2
        self.norm = layer_norm(c.hidden_size, PROJECTOR_LN_EPS)
        self.linear_fc1 = linear(self.block, c.projector_hidden_size)
        self.linear_fc2 = linear(c.projector_hidden_size, c.text_hidden_size)

    def forward(self, x):  # [N, C] -> [N/4, E]
        x = self.norm(x).view(-1, self.block)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class EdgeVisionTower(nn.Module):
    def __init__(self, c: EdgeVisionConfig):
        super().__init__()
        self.config = c
        self.visual = Visual(c)
        self.projector = Projector(c)

    @property
    def dtype(self) -> torch.dtype:
        return self.visual.post_layernorm.weight.dtype

    def forward(self, pixels: torch.Tensor, grids: list[tuple[int, int, int]]):
        """pixels [N, patch_dim] -> (tokens [N/4, E], no deepstack features)."""
        x = self.visual.embeddings(pixels, grids)
        lengths = [h * w for t, h, w in grids for _ in range(t)]
        for layer in self.visual.encoder.layers:
            x = layer(x, lengths)
        return self.projector(self.visual.post_layernorm(x)), []
