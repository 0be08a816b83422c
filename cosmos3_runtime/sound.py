"""Sound: the Cosmos3 audio tokenizer and the sound track that is denoised alongside the video.

The tokenizer (`sound_tokenizer/` of a sound-capable checkpoint, diffusers' `Cosmos3AVAEAudioTokenizer`)
turns sound latents [sound_dim, T_s] into a waveform [channels, T_s * hop] at its sample rate (48 kHz
stereo on the release): an Oobleck decoder of weight-normalised convolutions, transposed-convolution
upsampling and Snake activations. Its encoder (a ConvNeXt over an STFT) is built only when the weights
contain `encoder.*` tensors; early checkpoints ship the decoder alone.

A soundtrack given to a run (audio conditioning, `Audio`) is fitted to the clip as NVIDIA's framework loads one
(`fit_soundtrack`: resampled by `resample`, its channels matched, trimmed or padded with silence) and encoded; the
sound track (`tracks.SoundTrack`) holds its latents clean.
"""

import math
import numbers
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .errors import CheckpointError, InputError
from .weights.files import read_headers


TOKENIZER_CLASS = "Cosmos3AVAEAudioTokenizer"

# Keys whose released value is the only one the architecture supports (as in the reference).
FIXED = {
    "model_type": "autoencoder_v2", "use_wav_as_input": True, "enc_type": "spec_convnext", "dec_type": "oobleck",
    "bottleneck_type": "vae", "dec_use_snake": True, "dec_final_tanh": False, "dec_anti_aliasing": False,
    "dec_use_nearest_upsample": False, "dec_use_tanh_at_final": False, "activation": "snakebeta",
    "snake_logscale": True, "anti_aliasing": False, "use_cuda_kernel": False, "causal": False,
    "latent_mean": None, "latent_std": None,
}


@dataclass(frozen=True)
class SoundConfig:
    sampling_rate: int = 48000
    vocoder_input_dim: int = 64  # = the transformer's sound_dim
    dec_dim: int = 320
    dec_c_mults: tuple[int, ...] = (1, 2, 4, 8, 16)
    dec_strides: tuple[int, ...] = (2, 4, 5, 6, 8)
    dec_out_channels: int = 2
    stereo: bool = True
    normalize_volume: bool = True
    hop_size: int | None = None
    input_channels: int = 1
    enc_dim: int = 192
    enc_num_blocks: int = 2
    enc_n_fft: int = 64
    enc_hop_length: int = 16
    enc_latent_dim: int = 128
    enc_c_mults: tuple[int, ...] = (1, 2, 4)
    enc_strides: tuple[int, ...] = (4, 5, 6)
    enc_use_snake: bool = True
    padding_mode: str = "zeros"
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def encoder_channels(self) -> int:
        """Channels of the waveform the encoder takes (2 on the release: stereo)."""
        return self.input_channels * (2 if self.stereo else 1)

    @property
    def hop(self) -> int:
        """Waveform samples per sound latent frame."""
        return self.hop_size if self.hop_size is not None else math.prod(self.dec_strides)

    @classmethod
    def from_dict(cls, raw: dict, source: str) -> "SoundConfig":
        for key, value in FIXED.items():
            if raw.get(key, value) != value:
                raise CheckpointError(f"{source}: {key}={raw[key]!r} is not supported (the released audio tokenizer "
                                      f"has {value!r})")
        if (raw.get("bottleneck") or {}).get("type", "vae") != "vae":
            raise CheckpointError(f"{source}: only the 'vae' bottleneck is supported")
        names = {f.name for f in fields(cls)} - {"extra"}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in names}
        config = cls(**values)
        if len(config.enc_c_mults) != len(config.enc_strides):
            raise CheckpointError(f"{source}: enc_c_mults and enc_strides must have the same length")
        return config


AUDIO_RATES = (8000, 768000)  # Hz: what audio files are sampled at, telephone speech to studio masters


def samples_for(num_frames: int, fps: float, sample_rate: int) -> int:
    """Waveform samples covering a clip, as the reference derives the sound length from it."""
    return int(num_frames / fps * sample_rate)


@dataclass(frozen=True, eq=False)
class Audio:
    """A soundtrack: waveform [channels, samples] float32 (nominally in [-1, 1]) at `sample_rate` Hz."""

    waveform: torch.Tensor
    sample_rate: int

    @property
    def seconds(self) -> float:
        return self.waveform.shape[1] / self.sample_rate


def as_audio(value) -> Audio | None:
    """A soundtrack from what callers hand over: an `Audio`; ComfyUI's AUDIO ({"waveform": [1, C, N], "sample_rate"});
    a (waveform [C, N] or [N], sample rate) pair; or a file (wav, flac, mp3, or a video's sound track)."""
    if value is None or isinstance(value, Audio):
        return value
    if isinstance(value, (str, Path)):
        from .media import read_audio

        return as_audio(read_audio(value))
    if isinstance(value, dict) and {"waveform", "sample_rate"} <= value.keys():
        waveform, rate = value["waveform"], value["sample_rate"]
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        waveform, rate = value
    else:
        raise InputError("audio must be a file path, ComfyUI AUDIO ({'waveform': [1, channels, samples], "
                         f"'sample_rate': rate}}) or a (waveform, sample rate) pair, got {type(value).__name__}")
    waveform = torch.as_tensor(waveform)
    if waveform.dim() == 3:
        if waveform.shape[0] != 1:
            raise InputError(f"audio holds a batch of {waveform.shape[0]} soundtracks; give one")
        waveform = waveform[0]
    if waveform.dim() == 1:
        waveform = waveform.unsqueeze(0)
    if waveform.dim() != 2 or not waveform.is_floating_point():
        raise InputError(f"an audio waveform must be floats [channels, samples] in [-1, 1], got {waveform.dtype} "
                         f"{list(waveform.shape)}")
    if waveform.shape[1] == 0 or waveform.shape[0] == 0:
        raise InputError("the audio is empty (no samples)")
    if not torch.isfinite(waveform).all():
        raise InputError("the audio waveform holds NaN or infinite samples")
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not math.isfinite(rate) or rate <= 0 \
            or rate != int(rate):
        raise InputError(f"the audio's sample rate must be a positive whole number of Hz, got {rate!r}")
    if not AUDIO_RATES[0] <= rate <= AUDIO_RATES[1]:  # a rate written wrongly: 3 samples at 1 Hz would be 3 s
        raise InputError(f"the audio's sample rate {int(rate)} Hz is outside what audio is sampled at "
                         f"({AUDIO_RATES[0]} to {AUDIO_RATES[1]} Hz): check the file, or the rate given with the "
                         "waveform")
    return Audio(waveform.detach().float().cpu(), int(rate))


def lowpass(taps: int, cutoff: float) -> torch.Tensor:
    """A Kaiser-windowed (beta 5) sinc lowpass of odd length `taps`, `cutoff` a fraction of Nyquist, unit DC gain:
    the filter `scipy.signal.firwin(taps, cutoff, window=("kaiser", 5.0))` designs (float64)."""
    m = torch.arange(taps, dtype=torch.float64) - (taps - 1) / 2
    h = cutoff * torch.sinc(cutoff * m) * torch.kaiser_window(taps, periodic=False, beta=5.0, dtype=torch.float64)
    return h / h.sum()


def resample(waveform: torch.Tensor, source_rate: int, target_rate: int, length: int | None = None) -> torch.Tensor:
    """[channels, n] at `source_rate` -> [channels, ceil(n * target / source)] at `target_rate` (float64), filtered
    and aligned as `scipy.signal.resample_poly` (its default Kaiser window) resamples; `length`: only the first that
    many samples, silence beyond the resampled end (a trim or pad that reads no more input than it needs)."""
    g = math.gcd(source_rate, target_rate)
    up, down = target_rate // g, source_rate // g
    x = waveform.double()
    n_in = x.shape[1]
    n_out = -(-n_in * up // down)
    wanted = n_out if length is None else length
    if up == down:
        return F.pad(x, (0, wanted - n_in)) if wanted > n_in else x[:, :wanted].clone()
    rate = max(up, down)
    half = 10 * rate  # the filter has 2 half + 1 taps
    taps = lowpass(2 * half + 1, 1 / rate) * up
    pre_pad = down - half % down  # scipy pads the filter in front so its centre lands on an output sample
    first = (half + pre_pad) // down
    # Output i sums x[n] h[k] over k = p_i - n up (p_i the output's place in the upsampled signal): k runs over one
    # phase of the filter, so each output reads at most `reach` input samples.
    reach = 2 * half // up + 1
    out = x.new_zeros(x.shape[0], wanted)
    j = torch.arange(reach)
    for start in range(0, min(wanted, n_out), 1 << 15):
        p = (first + torch.arange(start, min(wanted, n_out, start + (1 << 15)))) * down - pre_pad
        k = (p % up)[:, None] + j * up
        n = (p // up)[:, None] - j
        valid = (k <= 2 * half) & (n >= 0) & (n < n_in)
        weights = torch.where(valid, taps[k.clamp(max=2 * half)], 0.0)
        out[:, start : start + len(p)] = (x[:, n.clamp(0, n_in - 1)] * weights).sum(-1)
    return out


def fit_soundtrack(audio: Audio, config: SoundConfig, samples: int) -> torch.Tensor:
    """A soundtrack as the sound encoder takes it, as NVIDIA's framework loads one: resampled to the tokenizer's rate,
    mono repeated to stereo or stereo averaged to mono, trimmed or padded with silence at the end to `samples` ->
    [channels, samples] float32."""
    check_channels(audio, config)
    channels, wanted = audio.waveform.shape[0], config.encoder_channels
    waveform = audio.waveform
    if channels != wanted:
        waveform = waveform.repeat(wanted, 1) if channels == 1 else waveform.mean(0, keepdim=True)
    return resample(waveform, audio.sample_rate, config.sampling_rate, samples).float()


def check_channels(audio: Audio, config: SoundConfig) -> None:
    """Refuse a soundtrack the encoder cannot take: mono fits any tokenizer, stereo a stereo or mono one."""
    channels, wanted = audio.waveform.shape[0], config.encoder_channels
    if channels != wanted and channels != 1 and not (wanted == 1 and channels == 2):
        raise InputError(f"the audio has {channels} channels and the sound tokenizer takes {wanted}: give a mono "
                         "or stereo soundtrack (e.g. ffmpeg -i in.wav -ac 2 out.wav)")


def check_encoder(folder: Path, audio: Audio) -> None:
    """Refuse audio conditioning before any weight is read: a soundtrack of more channels than the sound tokenizer's
    config takes, or weight files (headers only) without `encoder.*` tensors (a tokenizer that can decode sound but
    not encode a soundtrack)."""
    if not folder.is_dir():
        return  # not fetched yet (a repo id planned from its configs): loading reads the headers, encoding refuses
    from .checkpoint import read_json

    check_channels(audio, SoundConfig.from_dict(read_json(folder / "config.json"), str(folder / "config.json")))
    headers, missing = read_headers(folder)
    if missing:
        return
    if not any(name.startswith("encoder.") for name in headers):
        files = sorted(p.name for p in folder.glob("*.safetensors")) or ["no weight files"]
        raise InputError(f"audio conditioning encodes the soundtrack with the sound tokenizer's encoder, and "
                         f"{folder} ({', '.join(files)}) has no encoder.* weights (a decoder-only release): use a "
                         "sound tokenizer that ships its encoder")


# --- building blocks ---------------------------------------------------------------------------------


class Snake(nn.Module):
    """Snake activation with log-scale parameters: x + sin(e^a x)^2 / (e^b + 1e-9)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(1, channels, 1))
        self.beta = nn.Parameter(torch.zeros(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha, beta = torch.exp(self.alpha), torch.exp(self.beta)
        return x + (beta + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)


class WeightNormed:
    """A convolution whose weight is stored as direction `weight_v` and magnitude `weight_g` (norm over dim 0)."""

    def weight_of(self) -> torch.Tensor:
        return torch._weight_norm(self.weight_v, self.weight_g, 0)


class WNConv1d(WeightNormed, nn.Module):
    def __init__(self, cin, cout, kernel, stride=1, padding=0, dilation=1, bias=True, padding_mode="zeros"):
        super().__init__()
        self.weight_v = nn.Parameter(torch.empty(cout, cin, kernel))
        self.weight_g = nn.Parameter(torch.empty(cout, 1, 1))
        self.bias = nn.Parameter(torch.empty(cout)) if bias else None
        self.stride, self.padding, self.dilation, self.padding_mode = stride, padding, dilation, padding_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.padding_mode != "zeros" and self.padding:
            x = F.pad(x, (self.padding, self.padding), mode=self.padding_mode)
            return F.conv1d(x, self.weight_of(), self.bias, self.stride, 0, self.dilation)
        return F.conv1d(x, self.weight_of(), self.bias, self.stride, self.padding, self.dilation)


class WNConvTranspose1d(WeightNormed, nn.Module):
    def __init__(self, cin, cout, kernel, stride, padding, output_padding):
        super().__init__()
        self.weight_v = nn.Parameter(torch.empty(cin, cout, kernel))
        self.weight_g = nn.Parameter(torch.empty(cin, 1, 1))
        self.bias = nn.Parameter(torch.empty(cout))
        self.stride, self.padding, self.output_padding = stride, padding, output_padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv_transpose1d(x, self.weight_of(), self.bias, self.stride, self.padding, self.output_padding)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.snake1 = Snake(dim)
        self.conv1 = WNConv1d(dim, dim, 7, dilation=dilation, padding=3 * dilation)
        self.snake2 = Snake(dim)
        self.conv2 = WNConv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.snake2(self.conv1(self.snake1(x))))  # "same" padding: lengths agree


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.snake1 = Snake(cin)
        self.conv_t1 = WNConvTranspose1d(cin, cout, 2 * stride, stride, math.ceil(stride / 2), stride % 2)
        self.res_unit1, self.res_unit2, self.res_unit3 = (ResidualUnit(cout, d) for d in (1, 3, 9))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_t1(self.snake1(x))
        return self.res_unit3(self.res_unit2(self.res_unit1(x)))


class Decoder(nn.Module):
    """Latents [B, sound_dim, T_s] -> waveform [B, channels, T_s * hop] (before clamping)."""

    def __init__(self, c: SoundConfig):
        super().__init__()
        mults = (1, *c.dec_c_mults)
        strides = tuple(reversed(c.dec_strides))
        self.conv1 = WNConv1d(c.vocoder_input_dim, c.dec_dim * mults[-1], 7, padding=3)
        n = len(strides)
        self.block = nn.ModuleList(DecoderBlock(c.dec_dim * mults[n - i], c.dec_dim * mults[n - i - 1], stride)
                                   for i, stride in enumerate(strides))
        self.snake1 = Snake(c.dec_dim)
        self.conv2 = WNConv1d(c.dec_dim, c.dec_out_channels, 7, padding=3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        for block in self.block:
            x = block(x)
        return self.conv2(self.snake1(x))


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int, use_snake: bool):
        super().__init__()
        self.dwconv = nn.Sequential(nn.ConstantPad1d((3, 3), 0.0), nn.Conv1d(dim, dim, 7, groups=dim))
        self.norm = nn.LayerNorm(dim, eps=1e-5, bias=False)
        self.pwconv1 = nn.Conv1d(dim, 4 * dim, 1)
        self.act = Snake(4 * dim) if use_snake else nn.GELU()
        self.pwconv2 = nn.Conv1d(4 * dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dwconv(x).transpose(1, 2)
        h = F.layer_norm(h.float(), self.norm.normalized_shape, self.norm.weight.float(), None, self.norm.eps)
        h = self.pwconv2(self.act(self.pwconv1(h.to(x.dtype).transpose(1, 2))))
        return x + h


class Encoder(nn.Module):
    """Waveform [B, channels, N] -> moments [B, 2 * sound_dim, N / hop] (mean first) through an STFT and ConvNeXt."""

    def __init__(self, c: SoundConfig):
        super().__init__()
        self.channels = c.encoder_channels
        self.n_fft, self.hop_length = c.enc_n_fft, c.enc_hop_length
        dims = [m * c.enc_dim for m in c.enc_c_mults]
        layers: list[nn.Module] = [WNConv1d((self.n_fft + 2) * self.channels, dims[0], 1, bias=False)]
        for i, stride in enumerate(c.enc_strides):
            out = dims[i + 1] if i + 1 < len(dims) else dims[-1]
            layers += [ConvNeXtBlock(dims[i], c.enc_use_snake) for _ in range(c.enc_num_blocks)]
            layers.append(WNConv1d(dims[i], out, 2 * stride, stride=stride, padding=math.ceil(stride / 2),
                                   padding_mode=c.padding_mode))
        layers.append(WNConv1d(dims[-1], c.enc_latent_dim, 1, bias=False))
        self.layers = nn.Sequential(*layers)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        b, channels, n = audio.shape
        if channels != self.channels:
            raise InputError(f"the sound encoder takes {self.channels}-channel audio, got {channels} channels")
        pad = self.n_fft - self.hop_length
        wave = F.pad(audio.reshape(b * channels, n), (pad // 2, pad - pad // 2)).float()
        window = torch.hann_window(self.n_fft, device=wave.device, dtype=wave.dtype)
        spec = torch.stft(wave, self.n_fft, self.hop_length, self.n_fft, window, center=False, return_complex=True)
        spec = torch.view_as_real(spec)  # [b*c, freq, frames, 2]: real parts, then imaginary parts
        features = torch.cat([spec[..., 0], spec[..., 1]], dim=1).to(audio.dtype)
        return self.layers(features.reshape(b, channels * features.shape[1], features.shape[2]))


class SoundTokenizer(nn.Module):
    def __init__(self, config: SoundConfig, with_encoder: bool):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config) if with_encoder else None
        self.decoder = Decoder(config)

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.conv1.weight_v.dtype

    @property
    def device(self) -> torch.device:
        return self.decoder.conv1.weight_v.device

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Sound latents [sound_dim, T_s] -> waveform [channels, T_s * hop] in [-1, 1]."""
        z = latents.to(device=self.device, dtype=self.dtype).unsqueeze(0)
        return self.decoder(z).clamp(-1.0, 1.0)[0]

    @torch.no_grad()
    def encode(self, waveform: torch.Tensor) -> torch.Tensor:
        """Waveform [channels, N] in [-1, 1] -> sound latents [sound_dim, ceil(N / hop)] (posterior mean)."""
        if self.encoder is None:
            raise InputError("this checkpoint's sound tokenizer is decoder-only (no encoder weights): it cannot encode")
        x = waveform.to(device=self.device, dtype=self.dtype).unsqueeze(0)
        if self.config.normalize_volume:
            x = x / (x.abs().max() + 1e-5) * 0.95
        x = F.pad(x, (0, -x.shape[-1] % self.config.hop))
        return self.encoder(x)[0, : self.config.vocoder_input_dim]


def load_sound_tokenizer(folder: Path, device: torch.device, dtype: torch.dtype) -> SoundTokenizer:
    """The tokenizer from its folder; the encoder is built only when the weights have `encoder.*` tensors."""
    from .checkpoint import read_json
    from .weights.files import load_weights

    source = folder / "config.json"
    config = SoundConfig.from_dict(read_json(source), str(source))
    headers, missing = read_headers(folder)
    if missing:
        raise CheckpointError(f"{folder}: weight files {', '.join(missing)} are missing; download them again")
    with torch.device("meta"):
        tokenizer = SoundTokenizer(config, with_encoder=any(name.startswith("encoder.") for name in headers))
    load_weights(tokenizer, folder, dtype, device)
    return tokenizer
