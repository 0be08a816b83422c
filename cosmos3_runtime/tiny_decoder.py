"""The Wan 2.2 tiny autoencoder's decoder (TAEHV: madebyollin's `taew2_2`, lightx2v's `lighttaew2_2`), a fast and
softer alternative to the VAE's decoder, and the file ComfyUI reads from `models/vae_approx` for previews.

Its published layout is one `nn.Sequential` whose indices name the weights (`decoder.N.*`): a soft clamp, a 3x3
conv from the 48 latent channels, then three stages of three memory blocks, a 2x nearest upsample, a 1x1 temporal
grow and a 3x3 conv, and a last 3x3 conv to 12 channels that a pixel shuffle turns into RGB at twice the size (16x
in all). A memory block sees its input and its previous frame's input (zeros before the first), so the decoder is
causal with one frame of memory per block; the temporal grows of the second and third stage make each latent frame
4 frames, of which the first latent frame keeps only its last (1 + 4(T-1) frames, as the VAE gives).

Which latents a file takes (see docs/causal.md#the-fast-decoder): TAEHV's files decode the diffusion model's own,
normalized latents (madebyollin/taehv's README: "TAEHV does not use any latent scales / shifts"); lightx2v's
`lighttae*` retrains decode the VAE's raw latents, `latents * std + mean` (their `Wan2_2_VAE_tiny(need_scaled=True)`,
chosen by "lighttae" in the file name). The two layouts are identical, so `latent_space_of` goes by the name unless
told.
"""

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from torch import nn

from . import cancel
from .errors import CheckpointError, InputError
from .vae import Progress

LATENT_CHANNELS = 48  # Wan 2.2's latents
PATCH = 2  # the last conv's 12 channels are 2x2 patches of RGB
LATENT_SPACES = ("auto", "normalized", "raw")
FILE_SUFFIXES = (".safetensors", ".pth")
MEMORY_STAGES = ((3, 4, 5), (9, 10, 11), (15, 16, 17))  # the memory blocks' indices, stage by stage
STAGE_CONVS = (1, 8, 14, 20)  # the conv into each stage's width (its out channels: the widths), then the last stage's
TEMPORAL_GROWS = {7: 1, 13: 2, 19: 2}  # index -> frames each input frame becomes
FRAMES_PER_LATENT = 4
LAST_CONV = 22


def latent_space_of(path: str | Path, latents: str = "auto") -> str:
    """"normalized" or "raw": `latents` when given, else by the file's name ("lighttae*" raw, as lightx2v reads it)."""
    if latents not in LATENT_SPACES:
        raise InputError(f"fast_decoder_latents must be one of {', '.join(LATENT_SPACES)}, got {latents!r}")
    if latents != "auto":
        return latents
    return "raw" if Path(path).name.lower().startswith("lighttae") else "normalized"


def expected_shapes(widths: tuple[int, int, int, int]) -> dict[str, tuple[int, ...]]:
    """Every decoder weight of the published layout at these stage widths, by key."""
    shapes = {f"decoder.{STAGE_CONVS[0]}.weight": (widths[0], LATENT_CHANNELS, 3, 3),
              f"decoder.{STAGE_CONVS[0]}.bias": (widths[0],),
              f"decoder.{LAST_CONV}.weight": (3 * PATCH**2, widths[3], 3, 3),
              f"decoder.{LAST_CONV}.bias": (3 * PATCH**2,)}
    for stage, (blocks, grow) in enumerate(zip(MEMORY_STAGES, TEMPORAL_GROWS.items())):
        width = widths[stage]
        for index in blocks:
            for part, cin in ((0, 2 * width), (2, width), (4, width)):
                shapes[f"decoder.{index}.conv.{part}.weight"] = (width, cin, 3, 3)
                shapes[f"decoder.{index}.conv.{part}.bias"] = (width,)
        index, stride = grow
        shapes[f"decoder.{index}.conv.weight"] = (width * stride, width, 1, 1)
        shapes[f"decoder.{STAGE_CONVS[stage + 1]}.weight"] = (widths[stage + 1], width, 3, 3)
    return shapes


def checked_widths(shapes: dict[str, tuple[int, ...]], name: str) -> tuple[int, int, int, int]:
    """The stage widths of a file's decoder weights (`shapes`: key -> shape), or a refusal naming the file and what
    makes it another architecture."""
    decoder = {k: s for k, s in shapes.items() if k.startswith("decoder.")}
    firsts = [f"decoder.{i}.weight" for i in STAGE_CONVS]
    missing = [k for k in firsts if k not in decoder]
    if missing:
        raise CheckpointError(f"{name} is not a TAEHV tiny autoencoder (taew2_2 / lighttaew2_2): it has no "
                              f"{', '.join(missing)}")
    first = decoder[firsts[0]]
    if len(first) != 4 or first[1] != LATENT_CHANNELS:
        channels = first[1] if len(first) == 4 else "?"
        raise CheckpointError(f"{name} decodes {channels} latent channels, not Wan 2.2's {LATENT_CHANNELS} (taew2_1 "
                              "and lighttaew2_1 are Wan 2.1's): use taew2_2 or lighttaew2_2")
    widths = tuple(decoder[k][0] for k in firsts)
    expected = expected_shapes(widths)
    problems = [f"{k} missing" for k in expected if k not in decoder]
    problems += [f"{k} is {list(decoder[k])}, not {list(s)}" for k, s in expected.items()
                 if k in decoder and tuple(decoder[k]) != s]
    problems += [f"{k} unexpected" for k in decoder if k not in expected]
    if problems:
        more = f" (and {len(problems) - 4} more)" if len(problems) > 4 else ""
        raise CheckpointError(f"{name} is not the Wan 2.2 tiny autoencoder's published layout: "
                              f"{'; '.join(problems[:4])}{more}")
    return widths


def read_decoder_weights(path: str | Path) -> tuple[dict[str, torch.Tensor], tuple[int, int, int, int]]:
    """A file's decoder weights and stage widths, checked before any is read where the format allows (a
    safetensors header); a .pth is read as tensors only (`weights_only`: nothing is unpickled but tensors)."""
    path = Path(path)
    if path.suffix.lower() not in FILE_SUFFIXES:
        raise CheckpointError(f"{path.name}: the fast decoder loads .safetensors or .pth files only")
    if not path.is_file():
        raise CheckpointError(f"fast decoder file {path} not found")
    if path.suffix.lower() == ".safetensors":
        try:
            with safe_open(str(path), framework="pt") as f:
                keys = [k for k in f.keys() if k.startswith("decoder.")]
                widths = checked_widths({k: tuple(f.get_slice(k).get_shape()) for k in keys}, path.name)
                return {k: f.get_tensor(k) for k in keys}, widths
        except SafetensorError as exc:
            raise CheckpointError(f"{path.name} is not a readable safetensors file: {exc}") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a pickle that holds more than tensors is refused here, unread
        raise CheckpointError(f"{path.name} is not a weights-only tensor file: {exc}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path.name} holds no plain dict of tensors")
    state = {k: v for k, v in state.items() if isinstance(k, str) and k.startswith("decoder.")}
    return state, checked_widths({k: tuple(v.shape) for k, v in state.items()}, path.name)


class SoftClamp(nn.Module):
    """Latents squashed into (-3, 3) smoothly before the first conv."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x / 3) * 3


def conv3x3(cin: int, cout: int, bias: bool = True) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, padding=1, bias=bias)


class MemoryBlock(nn.Module):
    """A residual block over a frame and the block's input one frame earlier."""

    def __init__(self, width: int):
        super().__init__()
        self.conv = nn.Sequential(conv3x3(2 * width, width), nn.ReLU(), conv3x3(width, width), nn.ReLU(),
                                  conv3x3(width, width))

    def forward(self, x: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(torch.cat([x, previous], 1)) + x)


class TemporalGrow(nn.Module):
    """Each frame becomes `stride` frames: a 1x1 conv to `stride` times the channels, split in time order."""

    def __init__(self, width: int, stride: int):
        super().__init__()
        self.width = width
        self.conv = nn.Conv2d(width, width * stride, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).reshape(-1, self.width, *x.shape[-2:])


class TinyDecoder(nn.Module):
    """The decoder at a file's stage widths; `latent_space` is what its file takes ("normalized" or "raw")."""

    def __init__(self, widths: tuple[int, int, int, int], latent_space: str):
        super().__init__()
        self.widths, self.latent_space = widths, latent_space
        layers: list[nn.Module] = [SoftClamp(), conv3x3(LATENT_CHANNELS, widths[0]), nn.ReLU()]
        for stage, (blocks, stride) in enumerate(zip(MEMORY_STAGES, TEMPORAL_GROWS.values())):
            width = widths[stage]
            layers += [MemoryBlock(width) for _ in blocks]
            layers += [nn.Upsample(scale_factor=2), TemporalGrow(width, stride),
                       conv3x3(width, widths[stage + 1], bias=False)]
        layers += [nn.ReLU(), conv3x3(widths[3], 3 * PATCH**2)]
        self.decoder = nn.Sequential(*layers)

    @classmethod
    def load(cls, path: str | Path, latents: str = "auto", device: torch.device | str = "cpu",
             dtype: torch.dtype = torch.float32) -> "TinyDecoder":
        """A taew2_2 / lighttaew2_2 file's decoder (`latents`: which latents it takes, `latent_space_of`), refused by
        name before anything is built when the file is not that architecture."""
        space = latent_space_of(path, latents)
        state, widths = read_decoder_weights(path)
        with torch.device("meta"):
            decoder = cls(widths, space)
        decoder.load_state_dict(state, assign=True)
        return decoder.to(device=device, dtype=dtype).eval().requires_grad_(False)

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder[LAST_CONV].weight.dtype

    @property
    def device(self) -> torch.device:
        return self.decoder[LAST_CONV].weight.device

    def stream(self) -> "TinyDecodeStream":
        """A decode fed a clip's latent frames a few at a time, as they are made."""
        return TinyDecodeStream(self)

    def decode(self, latents: torch.Tensor, progress: Progress | None = None) -> torch.Tensor:
        """A whole clip's latents (in `latent_space`) [1, 48, T, h, w] -> pixels [1, 3, 1 + 4(T-1), 16h, 16w] in
        [-1, 1], as `stream()` gives them piece by piece."""
        return self.stream()(latents, progress)

    def latent_frame(self, z: torch.Tensor, memory: dict[int, torch.Tensor]) -> torch.Tensor:
        """One latent frame [1, 48, h, w] -> its 4 frames [4, 3, 16h, 16w] in 0..1. `memory` (block index -> its
        last input frame) is read and updated. A stage's frames from one latent frame go through a block together,
        each with the one before it as its past: the same work whatever pieces a clip comes in."""
        x = z
        for index, layer in enumerate(self.decoder):
            if isinstance(layer, MemoryBlock):
                past = memory.get(index)
                previous = torch.cat([torch.zeros_like(x[:1]) if past is None else past, x[:-1]])
                memory[index] = x[-1:].clone()
                x = layer(x, previous)
            else:
                x = layer(x)
        return F.pixel_shuffle(x, PATCH).clamp_(0, 1)


class TinyDecodeStream:
    """One clip decoded in pieces, as `vae.DecodeStream` does for the VAE: each call decodes the next latent frames
    with the memory the earlier ones left (each memory block's last input frame), so the pieces join into exactly the
    pixels of one decode of the whole clip."""

    def __init__(self, decoder: TinyDecoder):
        self.decoder, self.memory, self.decoded = decoder, {}, 0

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor, progress: Progress | None = None) -> torch.Tensor:
        """The clip's next latents [1, 48, t, h, w] (in the decoder's latent space) -> pixels [1, 3, F, 16h, 16w] in
        [-1, 1] (F = 1 + 4(t-1) for the first piece, 4t after). `progress(done, t)` after every latent frame."""
        if latents.ndim != 5 or latents.shape[:2] != (1, LATENT_CHANNELS):
            raise InputError(f"the fast decoder takes latents [1, {LATENT_CHANNELS}, T, h, w], got "
                             f"{list(latents.shape)}")
        z = latents.to(device=self.decoder.device, dtype=self.decoder.dtype)
        frames = []
        for i in range(z.shape[2]):
            out = self.decoder.latent_frame(z[:, :, i], self.memory)
            frames.append(out if self.decoded + i else out[FRAMES_PER_LATENT - 1 :])  # the first keeps its last
            cancel.check()
            if progress is not None:
                progress(i + 1, z.shape[2])
        self.decoded += z.shape[2]
        return torch.cat(frames).permute(1, 0, 2, 3).unsqueeze(0) * 2 - 1
