"""Position ids and the interleaved 3-D mRoPE of the Cosmos3 backbone.

Every token has a (t, h, w) position. Text tokens sit on the diagonal (i, i, i). Media tokens start
at `text_len + modality_margin` on the temporal axis and restart their spatial axes at 0; with fps
modulation their temporal positions are spaced by `base_fps / fps` per latent frame, so a clip's
positions describe seconds rather than frame counts.

Positions are built in float32 in the same operation order as the reference implementation, which
makes them bit-identical to it.
"""

import torch


def text_positions(num_tokens: int, device=None) -> torch.Tensor:
    """[3, L] positions of a text prefix."""
    ids = torch.arange(num_tokens, dtype=torch.float32, device=device)
    return ids.unsqueeze(0).expand(3, -1)


def media_positions(
    grid_t: int,
    grid_h: int,
    grid_w: int,
    offset: int,
    fps: float | None,
    base_fps: float,
    temporal_factor: int,
    base_temporal_factor: int | None = None,
    start_frame: int = 0,
    reset_spatial: bool = True,
    device=None,
    in_video: bool = False,
) -> torch.Tensor:
    """[3, grid_t*grid_h*grid_w] positions of one media item, frame-major then row then column.

    `temporal_factor` is how many source frames one token frame covers (4 for VAE video latents,
    1 for sound and action tokens); `base_temporal_factor` is the factor `base_fps` refers to.
    `fps=None` turns fps modulation off (integer temporal steps), as does a single frame (an image) unless it is
    `in_video`: part of a longer clip, as a causal rollout's one-frame forwards are.
    """
    base_factor = temporal_factor if base_temporal_factor is None else base_temporal_factor
    frames = grid_h * grid_w
    if fps is not None and (grid_t > 1 or in_video):
        tokens_per_second = fps / temporal_factor
        base_tokens_per_second = base_fps / base_factor
        t = torch.arange(grid_t, dtype=torch.float32, device=device)
        t = (t + start_frame) / tokens_per_second * base_tokens_per_second + offset
    else:
        t = (torch.arange(grid_t, device=device) + int(offset) + start_frame).float()
    t = t.view(-1, 1).expand(-1, frames).reshape(-1)
    h = torch.arange(grid_h, device=device).view(1, -1, 1).expand(grid_t, -1, grid_w).reshape(-1)
    w = torch.arange(grid_w, device=device).view(1, 1, -1).expand(grid_t, grid_h, -1).reshape(-1)
    if not reset_spatial:
        h = h + int(offset)
        w = w + int(offset)
    return torch.stack([t, h.float(), w.float()])


def inverse_frequencies(head_dim: int, theta: float, device=None) -> torch.Tensor:
    """[head_dim/2] RoPE inverse frequencies, float32."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
    return 1.0 / (theta**exponents)


def mrope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, axes_dim: tuple[int, int, int], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [N, head_dim] for positions [3, N], rounded to `dtype`.

    Frequency j takes its angle from the H axis when j % 3 == 1 (j < 3*axes[1]), from the W axis
    when j % 3 == 2 (j < 3*axes[2]), and from the T axis otherwise.
    """
    freqs = positions.float()[:, :, None] * inv_freq.float()  # [3, N, D/2]
    angles = freqs[0].clone()
    angles[:, 1 : 3 * axes_dim[1] : 3] = freqs[1, :, 1 : 3 * axes_dim[1] : 3]
    angles[:, 2 : 3 * axes_dim[2] : 3] = freqs[2, :, 2 : 3 * axes_dim[2] : 3]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on x [N, heads, D] with cos/sin [N, D]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
