"""The Wan 2.2 video VAE (diffusers' `AutoencoderKLWan` with `is_residual=True`), as Cosmos3 uses it.

Pixels [B, 3, F, H, W] in [-1, 1] <-> latents [B, z, 1 + (F-1)/4, H/16, W/16] (z = 48 in the release).
Time is causal: frame t only depends on frames <= t. Video is processed in chunks (encode: pixel
frames [0], [1:5], [5:9], ...; decode: one latent frame at a time) and every causal convolution keeps
the last two frames it has seen in a `Stream`, a cache object that lives for one encode or decode
call. Memory therefore stays bounded however long the clip is, the result is exactly the one of the
chunked reference, and an interrupted call leaves nothing behind in the modules.

Spatial tiling (`tile=TileSpec(...)`) decodes or encodes overlapping tiles one at a time and blends
them with linear ramps over the overlap, so peak activation memory follows the tile size, not the
frame size.

Module and parameter names equal the diffusers checkpoint keys (`vae/diffusion_pytorch_model.safetensors`).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import cancel
from .errors import CheckpointError, InputError


@dataclass(frozen=True)
class VAEConfig:
    base_dim: int = 160
    decoder_base_dim: int | None = 256
    z_dim: int = 48
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temperal_downsample: tuple[bool, ...] = (False, True, True)
    is_residual: bool = True
    in_channels: int = 12
    out_channels: int = 12
    patch_size: int = 2
    scale_factor_spatial: int = 16
    scale_factor_temporal: int = 4
    latents_mean: tuple[float, ...] = ()
    latents_std: tuple[float, ...] = ()

    @classmethod
    def from_dict(cls, raw: dict, source: str = "vae/config.json") -> "VAEConfig":
        def fail(message: str):
            raise CheckpointError(f"{source}: {message}; Cosmos3 needs the Wan 2.2 VAE (AutoencoderKLWan, is_residual)")

        if not raw.get("is_residual", False):
            fail("is_residual is not true, so this is not the Wan 2.2 layout (a Wan 2.1 VAE?)")
        if raw.get("attn_scales"):
            fail("attn_scales must be empty")
        patch = raw.get("patch_size") or 1
        names = {f for f in cls.__dataclass_fields__}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in names}
        values["patch_size"] = patch
        config = cls(**values)
        dims = len(config.dim_mult)
        if len(config.temperal_downsample) != dims - 1:
            fail(f"temperal_downsample needs {dims - 1} entries for dim_mult {list(config.dim_mult)}")
        if len(config.latents_mean) != config.z_dim or len(config.latents_std) != config.z_dim:
            fail(f"latents_mean and latents_std need z_dim = {config.z_dim} entries each")
        if config.in_channels != 3 * patch * patch or config.out_channels != 3 * patch * patch:
            fail(f"in/out_channels must be 3 * patch_size**2 = {3 * patch * patch}")
        spatial = patch * 2 ** (dims - 1)
        temporal = 2 ** sum(config.temperal_downsample)
        if (config.scale_factor_spatial, config.scale_factor_temporal) != (spatial, temporal):
            fail(f"scale factors {config.scale_factor_spatial}/{config.scale_factor_temporal} do not match the "
                 f"network ({spatial}/{temporal})")
        return config

    @property
    def decoder_dim(self) -> int:
        return self.decoder_base_dim or self.base_dim


class Stream:
    """Per-call temporal state: each causal layer's last input frames, keyed by the layer, and the one buffer the
    causal convolutions assemble their padded input in (they run one at a time, so one buffer serves them all)."""

    def __init__(self):
        self.state: dict[nn.Module, torch.Tensor | bool] = {}
        self._scratch: torch.Tensor | None = None

    def scratch(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """An uninitialised tensor of `shape` in the dtype and on the device of `like`, valid until the next call.
        The buffer only grows, so a decode allocates it about once (its first latent frame has fewer frames)."""
        numel, old = math.prod(shape), self._scratch
        if old is None or old.numel() < numel or old.dtype != like.dtype or old.device != like.device:
            self._scratch = old = None  # freed before its successor is allocated
            self._scratch = torch.empty(numel, dtype=like.dtype, device=like.device)
        return self._scratch[:numel].view(shape)

    def release_scratch(self) -> None:
        """Free the scratch buffer (a stream kept between calls then holds only the remembered frames)."""
        self._scratch = None


class CausalConv3d(nn.Conv3d):
    """3-D convolution that pads time on the past side only and streams across chunks.

    `padding` is the constructor's (t, h, w) padding; time gets 2*t frames in front: zeros, then the frames
    remembered from the previous chunk. Streamed, the padded input is assembled once in the stream's scratch buffer
    (its remembered frames, the new ones, a zero border) and the remembered frames are overwritten in place, where a
    concatenation, a padded copy and a clone of the kept frames would each move the activation again. The convolution
    sees exactly the tensor the explicit padding builds, so the result is the same bit for bit.
    """

    def __init__(self, cin, cout, kernel, stride=1, padding=0):
        super().__init__(cin, cout, kernel, stride=stride)
        pt, ph, pw = (padding,) * 3 if isinstance(padding, int) else padding
        self.time_pad, self.space_pad = 2 * pt, (ph, pw)

    def forward(self, x: torch.Tensor, stream: Stream | None = None) -> torch.Tensor:
        pt, (ph, pw) = self.time_pad, self.space_pad
        if not pt or stream is None:  # (F.pad copies even when it adds nothing)
            return super().forward(F.pad(x, (pw, pw, ph, ph, pt, 0)) if pt or ph or pw else x)
        b, c, t, h, w = x.shape
        window = stream.scratch((b, c, pt + t, h + 2 * ph, w + 2 * pw), x)
        if ph:
            window[:, :, :, :ph].zero_()
            window[:, :, :, ph + h :].zero_()
        if pw:
            window[:, :, :, ph : ph + h, :pw].zero_()
            window[:, :, :, ph : ph + h, pw + w :].zero_()
        frames = window[:, :, :, ph : ph + h, pw : pw + w]
        past = stream.state.get(self)
        if past is None:  # the first chunk: zeros in front, as the padding has them
            frames[:, :, :pt].zero_()
        else:
            frames[:, :, :pt].copy_(past)
        frames[:, :, pt:].copy_(x)
        out = super().forward(window)
        if past is None:
            stream.state[self] = past = torch.empty_like(frames[:, :, :pt], memory_format=torch.contiguous_format)
        past.copy_(frames[:, :, t:])
        return out


class RMSNorm(nn.Module):
    """L2-normalise over channels, times sqrt(C) and a per-channel gain."""

    def __init__(self, dim: int, spatial_dims: int = 3):
        super().__init__()
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(dim, *(1,) * spatial_dims))

    def forward(self, x: torch.Tensor, silu: bool = False) -> torch.Tensor:
        """The norm of x (with `silu`, SiLU of it, in x's dtype).

        In fp32 with the gain, rounded once: a bf16 decode's PSNR against fp32 rose from 53.5 to 54.3 dB with it
        (benchmarks/bench_precision.py, released widths). The steps are those of
        `F.silu((F.normalize(x.float(), dim=1) * scale * gamma.float()).to(x.dtype))`, rounding for rounding, but in
        place on one fp32 buffer (and one in x's dtype) instead of a new tensor per step, and without a float copy of
        x. Each buffer keeps x's memory layout, which decides where a CPU kernel takes its scalar path (fp32 SiLU's
        differs from its vector path in the last bit).
        """
        norm = torch.linalg.vector_norm(x, 2, dim=1, keepdim=True, dtype=torch.float32).clamp_min_(1e-12)
        y = torch.div(x, norm).mul_(self.scale)  # fp32 whatever x's dtype
        if x.dtype == torch.float32:
            y.mul_(self.gamma)
        else:  # the product in fp32, rounded as it is stored
            y = torch.mul(y, self.gamma, out=torch.empty_like(x))
        return F.silu(y, inplace=True) if silu else y


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1 = RMSNorm(cin)
        self.conv1 = CausalConv3d(cin, cout, 3, padding=1)
        self.norm2 = RMSNorm(cout)
        self.conv2 = CausalConv3d(cout, cout, 3, padding=1)
        self.conv_shortcut = CausalConv3d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, stream):
        h = self.conv1(self.norm1(x, silu=True), stream)
        h = self.conv2(self.norm2(h, silu=True), stream)
        return h.add_(self.conv_shortcut(x))


class AttentionBlock(nn.Module):
    """Single-head self-attention over the positions of each frame."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = RMSNorm(dim, spatial_dims=2)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        frames = x.transpose(1, 2).reshape(b * t, c, h, w)
        qkv = self.to_qkv(self.norm(frames)).reshape(b * t, 1, 3 * c, h * w).transpose(2, 3)
        q, k, v = qkv.chunk(3, dim=-1)  # each [b*t, 1, h*w, c]
        out = F.scaled_dot_product_attention(q, k, v).squeeze(1).transpose(1, 2).reshape(b * t, c, h, w)
        return x + self.proj(out).view(b, t, c, h, w).transpose(1, 2)


class MidBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.resnets = nn.ModuleList([ResBlock(dim, dim), ResBlock(dim, dim)])
        self.attentions = nn.ModuleList([AttentionBlock(dim)])

    def forward(self, x, stream):
        x = self.resnets[0](x, stream)
        return self.resnets[1](self.attentions[0](x), stream)


def per_frame(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Apply a 2-D module to every frame of [B, C, T, H, W]."""
    b, c, t, h, w = x.shape
    y = module(x.transpose(1, 2).reshape(b * t, c, h, w))
    return y.view(b, t, *y.shape[1:]).transpose(1, 2)


class Downsample(nn.Module):
    """Halve height and width (and, with `temporal`, time: frames [0], then pairs of new frames)."""

    def __init__(self, dim: int, temporal: bool):
        super().__init__()
        self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=2))
        if temporal:
            self.time_conv = CausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1))

    def forward(self, x, stream):
        x = per_frame(self.resample, x)
        if not hasattr(self, "time_conv"):
            return x
        last = stream.state.get(self)
        stream.state[self] = x[:, :, -1:].clone()
        if last is None:  # the first chunk is the single first frame: it passes through
            return x
        return self.time_conv(torch.cat([last, x], dim=2))


class Upsample(nn.Module):
    """Double height and width (and, with `temporal`, time: each frame after the first becomes two)."""

    def __init__(self, dim: int, temporal: bool):
        super().__init__()
        self.resample = nn.Sequential(nn.Upsample(scale_factor=2.0, mode="nearest-exact"), nn.Conv2d(dim, dim, 3, padding=1))
        if temporal:
            self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))

    def forward(self, x, stream):
        b, c, t, h, w = x.shape
        if hasattr(self, "time_conv") and stream.state.get(self):
            # not the first chunk: every frame becomes an (earlier, later) pair, laid out image by image in one copy
            pairs = self.time_conv(x, stream).view(b, 2, c, t, h, w)
            t *= 2
            images = pairs.permute(0, 3, 1, 2, 4, 5).reshape(b * t, c, h, w)
        else:
            images = x.transpose(1, 2).reshape(b * t, c, h, w)
            if hasattr(self, "time_conv"):
                stream.state[self] = True  # the first chunk passes through, the later ones double
        # nearest-exact only copies values: in the compute dtype it gives what fp32 (as trained) gives, without the
        # two casts around the largest tensor of the block
        out = self.resample(images)
        return out.view(b, t, *out.shape[1:]).transpose(1, 2)


def space_time_to_channels(x: torch.Tensor, ft: int, fs: int) -> torch.Tensor:
    """[B, C, T, H, W] -> [B, C*ft*fs*fs, T/ft, H/fs, W/fs], channel-major then (t, y, x) offsets."""
    b, c, t, h, w = x.shape
    x = x.view(b, c, t // ft, ft, h // fs, fs, w // fs, fs).permute(0, 1, 3, 5, 7, 2, 4, 6)
    return x.reshape(b, c * ft * fs * fs, t // ft, h // fs, w // fs)


class AvgDown(nn.Module):
    """Parameter-free shortcut: fold (ft, fs, fs) blocks into channels and average groups of them."""

    def __init__(self, cin: int, cout: int, ft: int, fs: int):
        super().__init__()
        self.cout, self.ft, self.fs = cout, ft, fs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(x, (0, 0, 0, 0, (-x.shape[2]) % self.ft, 0))
        x = space_time_to_channels(x, self.ft, self.fs)
        b, c, t, h, w = x.shape
        return x.view(b, self.cout, c // self.cout, t, h, w).mean(dim=2)


class DupUp(nn.Module):
    """Parameter-free shortcut: repeat channels and unfold them into (ft, fs, fs) blocks."""

    def __init__(self, cin: int, cout: int, ft: int, fs: int):
        super().__init__()
        self.cout, self.ft, self.fs = cout, ft, fs
        self.repeats = cout * ft * fs * fs // cin

    def forward(self, x: torch.Tensor, first_chunk: bool) -> torch.Tensor:
        """The shortcut as [B, cout, T, ft, H, fs, W, fs] (time, then its offset in the block, and so on), to add to
        the block's output seen the same way: a view of x where the repeats line up with the offsets (each Wan 2.2
        decoder block: nothing is copied), one copy otherwise. The first chunk (one frame) keeps the last offset."""
        b, _, t, h, w = x.shape
        ft, fs = self.ft, self.fs
        repeated = x.view(b, -1, 1, t, h, w).expand(-1, -1, self.repeats, -1, -1, -1)  # each channel `repeats` times
        blocks = repeated.reshape(b, self.cout, ft, fs, fs, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
        return blocks[:, :, :, ft - 1 :] if first_chunk else blocks


class DownBlock(nn.Module):
    def __init__(self, cin: int, cout: int, num_res_blocks: int, temporal: bool, spatial: bool):
        super().__init__()
        self.resnets = nn.ModuleList(ResBlock(cin if i == 0 else cout, cout) for i in range(num_res_blocks))
        self.downsampler = Downsample(cout, temporal) if spatial else None
        self.avg_shortcut = AvgDown(cin, cout, 2 if temporal else 1, 2 if spatial else 1)

    def forward(self, x, stream):
        shortcut = self.avg_shortcut(x)
        for resnet in self.resnets:
            x = resnet(x, stream)
        if self.downsampler is not None:
            x = self.downsampler(x, stream)
        return x + shortcut


class UpBlock(nn.Module):
    def __init__(self, cin: int, cout: int, num_res_blocks: int, temporal: bool, spatial: bool):
        super().__init__()
        self.resnets = nn.ModuleList(ResBlock(cin if i == 0 else cout, cout) for i in range(num_res_blocks + 1))
        self.upsampler = Upsample(cout, temporal) if spatial else None
        self.avg_shortcut = DupUp(cin, cout, 2 if temporal else 1, 2) if spatial else None

    def forward(self, x, stream, first_chunk: bool):
        shortcut = self.avg_shortcut(x, first_chunk) if self.avg_shortcut is not None else None
        for resnet in self.resnets:
            x = resnet(x, stream)
        if self.upsampler is not None:
            x = self.upsampler(x, stream)
        if shortcut is not None:
            x.view(shortcut.shape).add_(shortcut)
        return x


class Encoder(nn.Module):
    def __init__(self, c: VAEConfig):
        super().__init__()
        dims = [c.base_dim * m for m in (1, *c.dim_mult)]
        last = len(c.dim_mult) - 1
        self.conv_in = CausalConv3d(c.in_channels, dims[0], 3, padding=1)
        self.down_blocks = nn.ModuleList(
            DownBlock(dims[i], dims[i + 1], c.num_res_blocks, i < last and c.temperal_downsample[i], i < last)
            for i in range(len(c.dim_mult))
        )
        self.mid_block = MidBlock(dims[-1])
        self.norm_out = RMSNorm(dims[-1])
        self.conv_out = CausalConv3d(dims[-1], 2 * c.z_dim, 3, padding=1)

    def forward(self, x, stream):
        x = self.conv_in(x, stream)
        for block in self.down_blocks:
            x = block(x, stream)
        x = self.mid_block(x, stream)
        return self.conv_out(self.norm_out(x, silu=True), stream)


class Decoder(nn.Module):
    def __init__(self, c: VAEConfig):
        super().__init__()
        d = c.decoder_dim
        dims = [d * m for m in (c.dim_mult[-1], *reversed(c.dim_mult))]
        upsample_time = tuple(reversed(c.temperal_downsample))
        last = len(c.dim_mult) - 1
        self.conv_in = CausalConv3d(c.z_dim, dims[0], 3, padding=1)
        self.mid_block = MidBlock(dims[0])
        self.up_blocks = nn.ModuleList(
            UpBlock(dims[i], dims[i + 1], c.num_res_blocks, i < last and upsample_time[i], i < last)
            for i in range(len(c.dim_mult))
        )
        self.norm_out = RMSNorm(dims[-1])
        self.conv_out = CausalConv3d(dims[-1], c.out_channels, 3, padding=1)

    def forward(self, x, stream, first_chunk: bool):
        x = self.mid_block(self.conv_in(x, stream), stream)
        for block in self.up_blocks:
            x = block(x, stream, first_chunk)
        return self.conv_out(self.norm_out(x, silu=True), stream)


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """[B, C, F, H, W] -> [B, C*p*p, F, H/p, W/p], channel index c*p*p + dx*p + dy."""
    b, c, f, h, w = x.shape
    x = x.view(b, c, f, h // p, p, w // p, p).permute(0, 1, 6, 4, 2, 3, 5)
    return x.reshape(b, c * p * p, f, h // p, w // p)


def unpatchify(x: torch.Tensor, p: int) -> torch.Tensor:
    b, cp, f, h, w = x.shape
    x = x.view(b, cp // (p * p), p, p, f, h, w).permute(0, 1, 4, 5, 3, 6, 2)
    return x.reshape(b, cp // (p * p), f, h * p, w * p)


@dataclass(frozen=True)
class TileSpec:
    """Spatial tiling in latent units: tiles of `size` latents overlapping by `overlap` latents."""

    size: int = 32
    overlap: int = 8

    def __post_init__(self):
        if not 0 <= self.overlap < self.size:
            raise InputError(f"tile overlap {self.overlap} must be at least 0 and smaller than the tile size {self.size}")

    def starts(self, length: int) -> list[int]:
        """Tile start offsets covering [0, length); the last tile is shifted back to end at `length`."""
        if length <= self.size:
            return [0]
        stride = self.size - self.overlap
        starts = list(range(0, length - self.size, stride)) + [length - self.size]
        return sorted(set(starts))


Progress = Callable[[int, int], None]  # (units done, total units); raise to stop
# (stage, done, total) of a generation around its steps: "text" (prompts encoded), "chunk" (transfer chunks begun),
# "decode" (latent frames decoded); raise to cancel
StageCallback = Callable[[str, int, int], None]


def image_frames(pixels: torch.Tensor, host: bool = True) -> torch.Tensor:
    """Decoded pixels [1, 3, F, H, W] in [-1, 1] -> frames [F, H, W, 3] in 0..1 on the CPU (ComfyUI's IMAGE); `host`
    False: where the pixels are."""
    frames = (pixels / 2 + 0.5).clamp(0, 1)[0].permute(1, 2, 3, 0)
    return frames.cpu() if host else frames


def stage(progress: StageCallback | None, name: str) -> Progress | None:
    """A (done, total) progress function reporting `name` to `progress`, or None."""
    return None if progress is None else lambda done, total: progress(name, done, total)


class _Ticker:
    """Counts finished units of work and reports them to an optional progress callback; each is a cancel point
    (`cancel.check`), with or without a callback."""

    def __init__(self, progress: Progress | None, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self) -> None:
        self.done += 1
        cancel.check()
        if self.progress is not None:
            self.progress(self.done, self.total)


def _tile_count(size, tile: TileSpec | None, unit: int) -> int:
    if tile is None:
        return 1
    spec = TileSpec(tile.size * unit, tile.overlap * unit)
    return len(spec.starts(size[0])) * len(spec.starts(size[1]))


def _ramp(length: int, before: int, after: int, device) -> torch.Tensor:
    """Blend weights along one axis: rising over `before` samples, falling over `after`."""
    w = torch.ones(length, device=device)
    if before:
        w[:before] = torch.arange(1, before + 1, device=device) / (before + 1)
    if after:
        w[length - after :] = torch.arange(after, 0, -1, device=device) / (after + 1)
    return w


class WanVAE(nn.Module):
    def __init__(self, config: VAEConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.quant_conv = CausalConv3d(2 * config.z_dim, 2 * config.z_dim, 1)
        self.post_quant_conv = CausalConv3d(config.z_dim, config.z_dim, 1)
        self.decoder = Decoder(config)

    @property
    def dtype(self) -> torch.dtype:
        return self.quant_conv.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.quant_conv.weight.device

    # --- latent statistics ---------------------------------------------------------------------

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel mean and 1/std in fp32, shaped to broadcast over [B, z, T, h, w]. fp32 whatever the VAE's
        dtype (diffusers applies them in the VAE's): bf16 statistics add a rounding to every conditioning latent."""
        mean = torch.tensor(self.config.latents_mean, dtype=torch.float32)
        inv_std = 1.0 / torch.tensor(self.config.latents_std, dtype=torch.float32)
        shape = (1, -1, 1, 1, 1)
        return mean.to(like.device).view(shape), inv_std.to(like.device).view(shape)

    def normalize(self, raw: torch.Tensor) -> torch.Tensor:
        """VAE latents -> the transformer's latent space: (z - mean) * (1/std), in fp32."""
        mean, inv_std = self._stats(raw)
        return (raw.float() - mean) * inv_std

    def denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        """The inverse of `normalize`, in fp32 (the decoder casts to its dtype)."""
        mean, inv_std = self._stats(latents)
        return latents.float() / inv_std + mean

    # --- encode / decode -----------------------------------------------------------------------

    def _check_pixels(self, x: torch.Tensor) -> None:
        s = self.config.scale_factor_spatial
        if x.ndim != 5 or x.shape[1] != 3:
            raise InputError(f"VAE encode expects pixels [B, 3, F, H, W], got {list(x.shape)}")
        if x.shape[3] % s or x.shape[4] % s:
            raise InputError(
                f"frame size {x.shape[4]}x{x.shape[3]} (WxH) is not a multiple of {s}; resize or crop to multiples of {s}"
            )

    @torch.no_grad()
    def encode(self, pixels: torch.Tensor, tile: TileSpec | None = None, progress: Progress | None = None) -> torch.Tensor:
        """Pixels [B, 3, F, H, W] in [-1, 1] -> posterior mean [B, z, 1 + (F-1)//4, H/16, W/16] (raw, not normalized).

        Frames beyond the last 4k+1 are dropped, as in the reference. `progress(done, total)` runs
        after every latent frame of every tile; an exception from it stops the encode.
        """
        self._check_pixels(pixels)
        x = pixels.to(device=self.device, dtype=self.dtype)
        s = self.config.scale_factor_spatial
        chunks = 1 + (x.shape[2] - 1) // self.config.scale_factor_temporal
        tick = _Ticker(progress, x.shape[0] * _tile_count(x.shape[-2:], tile, s) * chunks)
        if tile is None:
            return torch.cat([self._encode_one(item, tick) for item in x.split(1)])
        return torch.cat([self._tiled(item, tile, s, lambda t: self._encode_one(t, tick), 1 / s) for item in x.split(1)])

    def _encode_one(self, x: torch.Tensor, tick, stream: Stream | None = None, first: bool = True) -> torch.Tensor:
        """One clip's pixels -> raw latents: its first frame alone, then 4 at a time, through `stream` (a fresh one by
        default; `first` False: `x` continues the frames `stream` has encoded)."""
        x = patchify(x, self.config.patch_size)
        stream = Stream() if stream is None else stream
        step = self.config.scale_factor_temporal
        chunks = [x[:, :, :1]] * first + [x[:, :, i : i + step] for i in range(int(first), x.shape[2] - step + 1, step)]
        out = []
        for chunk in chunks:
            out.append(self.encoder(chunk, stream))
            tick()
        stream.release_scratch()
        return self.quant_conv(torch.cat(out, dim=2))[:, : self.config.z_dim]

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, tile: TileSpec | None = None, progress: Progress | None = None) -> torch.Tensor:
        """Raw latents [B, z, T, h, w] -> pixels [B, 3, 1 + 4(T-1), 16h, 16w] clamped to [-1, 1].

        `progress(done, total)` runs after every latent frame of every tile; an exception from it
        stops the decode (within one latent frame).
        """
        if latents.ndim != 5 or latents.shape[1] != self.config.z_dim:
            raise InputError(f"VAE decode expects latents [B, {self.config.z_dim}, T, h, w], got {list(latents.shape)}")
        z = latents.to(device=self.device, dtype=self.dtype)
        s = self.config.scale_factor_spatial
        tick = _Ticker(progress, z.shape[0] * _tile_count(z.shape[-2:], tile, 1) * z.shape[2])
        one = lambda item: self._decode_one(item, tick)  # noqa: E731
        decode = one if tile is None else lambda item: self._tiled(item, tile, 1, one, s)
        return torch.cat([decode(item) for item in z.split(1)]).clamp_(-1.0, 1.0)

    def _decode_one(self, z: torch.Tensor, tick, stream: Stream | None = None, first: int = 0) -> torch.Tensor:
        """One clip's raw latents -> pixels, one latent frame at a time through `stream` (a fresh one by default;
        `first`: how many latent frames it has already decoded)."""
        z = self.post_quant_conv(z)
        stream = Stream() if stream is None else stream
        frames = []
        for i in range(z.shape[2]):
            frames.append(self.decoder(z[:, :, i : i + 1], stream, first_chunk=first + i == 0))
            tick()
        stream.release_scratch()
        return unpatchify(torch.cat(frames, dim=2), self.config.patch_size)

    def decode_stream(self) -> "DecodeStream":
        """A decode fed a clip's latent frames a few at a time, as they are made."""
        return DecodeStream(self)

    def encode_stream(self) -> "EncodeStream":
        """An encode fed a clip's frames a few at a time, as they come."""
        return EncodeStream(self)

    def _tiled(self, x: torch.Tensor, tile: TileSpec, unit: int, run, scale: float) -> torch.Tensor:
        """Run `run` on overlapping spatial tiles of x and blend the results.

        Tiles are `tile.size * unit` input samples wide (unit = 16 pixels per latent when encoding,
        1 when decoding); outputs are `scale` times the input size.
        """
        size, overlap = tile.size * unit, tile.overlap * unit
        spec = TileSpec(size, overlap)
        height, width = x.shape[-2:]
        out = weight = None
        for top in spec.starts(height):
            for left in spec.starts(width):
                piece = run(x[..., top : top + size, left : left + size])
                th, tw = piece.shape[-2:]
                oy, ox, ov = int(top * scale), int(left * scale), int(overlap * scale)
                if out is None:
                    out_h, out_w = int(height * scale), int(width * scale)
                    out = piece.new_zeros(*piece.shape[:-2], out_h, out_w)
                    weight = torch.zeros(out_h, out_w, device=piece.device, dtype=piece.dtype)
                wy = _ramp(th, ov if top else 0, ov if oy + th < out.shape[-2] else 0, piece.device)
                wx = _ramp(tw, ov if left else 0, ov if ox + tw < out.shape[-1] else 0, piece.device)
                w = (wy[:, None] * wx[None, :]).to(piece.dtype)
                out[..., oy : oy + th, ox : ox + tw] += piece * w
                weight[oy : oy + th, ox : ox + tw] += w
        return out / weight


class DecodeStream:
    """One clip decoded in pieces (a causal rollout's chunks as each is made): each call decodes the next latent
    frames with the temporal state the earlier ones left, so the pieces join into exactly the pixels of one decode of
    the whole clip (untiled). The state is each causal layer's last two frames: memory stays that of one frame."""

    def __init__(self, vae: WanVAE):
        self.vae, self.stream, self.decoded = vae, Stream(), 0

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor, progress: Progress | None = None) -> torch.Tensor:
        """The clip's next raw latents [1, z, t, h, w] -> their pixels [1, 3, F, H, W] in [-1, 1] (F = 1 + 4(t-1) for
        the first piece, 4t after)."""
        vae = self.vae
        if latents.ndim != 5 or latents.shape[:2] != (1, vae.config.z_dim):
            raise InputError(f"VAE decode expects latents [1, {vae.config.z_dim}, T, h, w], got {list(latents.shape)}")
        pixels = vae._decode_one(latents.to(device=vae.device, dtype=vae.dtype), _Ticker(progress, latents.shape[2]),
                                 self.stream, self.decoded)
        self.decoded += latents.shape[2]
        return pixels.clamp_(-1.0, 1.0)


class EncodeStream:
    """One clip encoded in pieces (a causal session's control frames as each tick brings them): its first frame (or
    1 + 4k frames), then 4k frames a call, each piece with the temporal state the earlier ones left, so the pieces'
    latents join into exactly those of one encode of the whole clip (untiled). Memory stays that of one piece."""

    def __init__(self, vae: WanVAE):
        self.vae, self.stream, self.started = vae, Stream(), False

    @torch.no_grad()
    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        """The clip's next pixels [1, 3, F, H, W] in [-1, 1] -> their raw latents [1, z, t, H/16, W/16] (t = 1 + (F-1)/4
        for the first piece, F/4 after)."""
        vae, step = self.vae, self.vae.config.scale_factor_temporal
        vae._check_pixels(pixels)
        frames, first = pixels.shape[2], not self.started
        if pixels.shape[0] != 1 or (frames - first) % step or frames < step * (not first) + first:
            raise InputError(f"a streamed encode takes one clip's first frame (or 1 + {step}k frames), then {step}k "
                             f"frames a piece; got {frames} frame(s) for {'its first' if first else 'a later'} piece")
        latents = vae._encode_one(pixels.to(device=vae.device, dtype=vae.dtype), _Ticker(None, 0), self.stream, first)
        self.started = True
        return latents
