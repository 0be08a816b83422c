"""The codec: the Wan 2.2 VAE and the sound tokenizer, taking pixels and waveforms to and from the transformer's
latent space on one device. Runs, tracks and hosts encode and decode through it, never through the pipeline; a
pipeline loaded without its VAE (latents only, or the Reasoner alone) has a codec that refuses by name what needs it.
"""

from collections.abc import Callable

import torch

from .errors import InputError
from .sound import SoundTokenizer
from .tiny_decoder import TinyDecoder, latent_space_of
from .vae import EncodeStream, Progress, TileSpec, WanVAE, image_frames

Pixels = Callable[..., torch.Tensor]  # a clip's next normalized latents (and a Progress) -> their pixels in [-1, 1]
cuda = torch.cuda  # the stream API `ChunkDecode` runs on (tests put a recording stand-in here)


class Codec:
    def __init__(self, vae: WanVAE | None, sound_tokenizer: SoundTokenizer | None, device: torch.device):
        self.vae, self.sound_tokenizer, self.device = vae, sound_tokenizer, device
        # told of every decode's pixels during a generation (its finite check), else None
        self.observe: Callable[[str, torch.dtype, torch.Tensor], None] | None = None
        self.fast: dict[tuple[str, str], TinyDecoder] = {}  # the fast decoder loaded, by (file, latent space)

    def vae_for(self, what: str) -> WanVAE:
        """The VAE, or a refusal naming `what` needs it."""
        if self.vae is None:
            raise InputError(f"{what} needs the VAE; load the pipeline with its VAE")
        return self.vae

    def to(self, device: torch.device) -> None:
        for part in (self.vae, self.sound_tokenizer, *self.fast.values()):
            if part is not None:
                part.to(device)
        self.device = device

    def encode_pixels(self, pixels: torch.Tensor, stream: EncodeStream | None = None) -> torch.Tensor:
        """Pixels [1, 3, F, H, W] in [-1, 1] -> normalized latents (float32, on the device); through `stream`
        (`WanVAE.encode_stream`), the frames after those it has encoded."""
        vae = self.vae_for("encoding frames")
        return vae.normalize((stream or vae.encode)(pixels.to(self.device, vae.dtype))).float()

    def fast_decoder(self, path: str | None, latents: str = "auto") -> TinyDecoder | None:
        """The tiny autoencoder's decoder in `path` (None: none, the VAE decodes), loaded on this device (in the VAE's
        dtype) and kept until another file is asked for, refused by name when the file is not one; `latents`: which
        latents it takes (`tiny_decoder.latent_space_of`)."""
        if path is None:
            return None
        key = (str(path), latent_space_of(path, latents))
        if key not in self.fast:
            if key[1] == "raw":
                self.vae_for(f"the fast decoder {key[0]} (it takes the VAE's raw latents)")
            dtype = self.vae.dtype if self.vae is not None else torch.float32
            self.fast = {key: TinyDecoder.load(path, key[1], self.device, dtype)}
        return self.fast[key]

    def _in_space_of(self, fast: TinyDecoder, z: torch.Tensor, raw: bool) -> torch.Tensor:
        """Latents (normalized, or with `raw` the VAE's own) in the space `fast` takes."""
        if raw == (fast.latent_space == "raw"):
            return z
        vae = self.vae_for("the fast decoder's latents")
        return vae.normalize(z) if raw else vae.denormalize(z)

    def decode_pixels(self, latents: torch.Tensor, tile: TileSpec | None = None, progress: Progress | None = None,
                      raw: bool = False, fast: TinyDecoder | None = None, stream: Pixels | None = None
                      ) -> torch.Tensor:
        """Latents [1, 48, T, h, w] (normalized, or with `raw` the VAE's own) -> pixels [1, 3, F, H, W] in [-1, 1],
        float32 on the device, by the VAE or the `fast` decoder (`fast_decoder`; no tiles). `progress(done, total)`
        runs after every latent frame of every tile. Through `stream` (`decode_stream(fast)`; normalized latents,
        untiled), the frames after those it has decoded."""
        z = latents.to(self.device)
        if fast is not None:
            part, dtype = "the fast decoder", fast.dtype
        else:
            vae = self.vae_for("decoding")
            part, dtype = "the VAE decoder", vae.dtype
        if stream is not None:
            pixels = stream(z, progress)
        elif fast is not None:
            pixels = fast.decode(self._in_space_of(fast, z, raw), progress)
        else:
            pixels = vae.decode(z if raw else vae.denormalize(z), tile=tile, progress=progress)
        if self.observe is not None:
            self.observe(part, dtype, pixels)
        return pixels.float()

    def decode_stream(self, fast: TinyDecoder | None = None) -> Pixels:
        """A decode fed a clip's normalized latents a few frames at a time, as a causal session makes them, by the VAE
        (`DecodeStream`) or the `fast` decoder: pixels [1, 3, F, H, W] in [-1, 1], the pieces joined equal to one
        decode of the whole clip."""
        if fast is not None:
            stream = fast.stream()
            return lambda latents, progress=None: stream(self._in_space_of(fast, latents, raw=False), progress)
        vae = self.vae_for("decoding")
        stream = vae.decode_stream()
        return lambda latents, progress=None: stream(vae.denormalize(latents), progress)

    @torch.inference_mode()
    def encode(self, frames: torch.Tensor, progress: Progress | None = None, raw: bool = False) -> torch.Tensor:
        """Frames [F, H, W, 3] in 0..1 (an IMAGE batch) -> latents [1, 48, 1 + (F-1)//4, H/16, W/16] on the CPU:
        normalized (the transformer's space), or with `raw` the VAE's posterior mean (what ComfyUI's LATENT holds).
        `progress(done, total)` runs after every latent frame; raise from it to cancel."""
        vae = self.vae_for("encoding")
        pixels = frames[..., :3].permute(3, 0, 1, 2).unsqueeze(0).to(self.device) * 2 - 1
        encoded = vae.encode(pixels, progress=progress)
        return (encoded if raw else vae.normalize(encoded)).float().cpu()

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor, tile: TileSpec | None = None, progress: Progress | None = None,
               raw: bool = False, fast: TinyDecoder | None = None) -> torch.Tensor:
        """Latents [1, 48, T, h, w] -> frames [F, H, W, 3] float32 in 0..1 on the CPU (`decode_pixels`)."""
        return image_frames(self.decode_pixels(latents, tile, progress, raw, fast))

    @torch.inference_mode()
    def raw_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalized latents -> the VAE's raw latents (float32, CPU), as the decoder sees them."""
        return self.vae_for("converting latents").denormalize(latents.to(self.device)).float().cpu()

    def sound_for(self, what: str) -> SoundTokenizer:
        """The sound tokenizer, or a refusal naming `what` needs it."""
        if self.sound_tokenizer is None:
            raise InputError(f"{what} needs the checkpoint's sound tokenizer (sound_tokenizer/ in model_index.json): "
                             "load the pipeline with its VAE (the sound tokenizer loads with it)")
        return self.sound_tokenizer

    @torch.inference_mode()
    def encode_sound(self, waveform: torch.Tensor) -> torch.Tensor:
        """Waveform [channels, samples] at the tokenizer's rate -> sound latents [sound_dim, ceil(samples / hop)],
        float32 on the device."""
        return self.sound_for("audio conditioning").encode(waveform).float()

    @torch.inference_mode()
    def decode_sound(self, sound_latents: torch.Tensor, seconds: float | None = None) -> torch.Tensor:
        """Sound latents [sound_dim, T_s] -> waveform [channels, samples] float32 in [-1, 1] on the CPU; `seconds`:
        trimmed to `int(seconds * sample_rate)` samples (None: the full T_s * hop)."""
        tokenizer = self.sound_for("decoding sound")
        waveform = tokenizer.decode(sound_latents).float().cpu()
        if seconds is not None:
            waveform = waveform[:, : int(seconds * tokenizer.config.sampling_rate)]
        return waveform


class ChunkDecode:
    """A causal rollout's frames decoded chunk by chunk as it makes them (`Codec.decode_stream`: the pieces join into
    exactly one decode of the clip, untiled), off the sampling's critical path: on a CUDA device each chunk's decode
    runs on a second stream while the next chunk samples (and this one commits). The side stream first waits for what
    the sampling stream has queued (the chunk's latents are written there); the latents are marked as read on the side
    stream (`record_stream`: their memory is not handed to the sampling stream before the decode has read them); the
    frames come back to a pinned buffer without blocking, so Python goes on queueing the next chunk. A chunk later,
    when that copy is long done, they move to ordinary host memory and the buffer serves a later chunk: the pinned
    memory a run holds (and PyTorch then keeps cached) stays a few chunks', not the clip's. `take` waits for the rest.
    Elsewhere (the CPU) there is no second stream: each chunk decodes in line, the same pixels. With the clip's frame
    count (a batch's), the pieces land in one buffer of the clip, never joined by a copy."""

    def __init__(self, codec: Codec, fast: TinyDecoder | None, frames: int | None = None):
        self.codec, self.fast, self.frames = codec, fast, frames
        self.pixels = codec.decode_stream(fast)
        self.side = cuda.Stream(codec.device) if codec.device.type == "cuda" else None
        self.pieces: list[torch.Tensor] = []  # each decoded chunk's frames [F, H, W, 3] in ordinary host memory
        self.clip: torch.Tensor | None = None  # with `frames`: the clip's, filled piece by piece
        self.filled = 0
        self.copying: list[tuple[torch.Tensor, object]] = []  # pinned pieces and the event their copy ends with
        self.free: list[torch.Tensor] = []  # pinned buffers landed, for the next chunks

    def add(self, latents: torch.Tensor, progress: Progress | None = None) -> None:
        """Decode the clip's next normalized latents [1, 48, t, h, w] (on the device)."""
        if self.side is None:
            self.keep(image_frames(self.codec.decode_pixels(latents, progress=progress, fast=self.fast,
                                                             stream=self.pixels)))
            return
        self.land(leave=1)  # the chunks before the last: their copies ended while this one sampled
        self.side.wait_stream(cuda.current_stream(self.codec.device))
        with cuda.stream(self.side):
            latents.record_stream(self.side)
            frames = image_frames(self.codec.decode_pixels(latents, progress=progress, fast=self.fast,
                                                           stream=self.pixels), host=False)
            pinned = self.buffer(frames)
            pinned.copy_(frames, non_blocking=True)
            copied = cuda.Event()
            copied.record(self.side)
        self.copying.append((pinned, copied))

    def buffer(self, frames: torch.Tensor) -> torch.Tensor:
        """A pinned buffer for `frames`: a landed one of its shape, or a new one."""
        for i, pinned in enumerate(self.free):
            if pinned.shape == frames.shape:
                return self.free.pop(i)
        return torch.empty(frames.shape, dtype=frames.dtype, pin_memory=cuda.is_available())

    def land(self, leave: int = 0) -> None:
        """The pieces in pinned buffers, all but the last `leave`, into ordinary host memory (waiting for their
        copies); their buffers free for later pieces."""
        while len(self.copying) > leave:
            pinned, copied = self.copying.pop(0)
            copied.synchronize()
            owned = pinned if self.frames is not None else torch.empty(pinned.shape, dtype=pinned.dtype).copy_(pinned)
            self.keep(owned)  # (into the clip's buffer, a copy; kept apart, a copy of its own)
            self.free.append(pinned)

    def keep(self, piece: torch.Tensor) -> None:
        """A decoded piece [F, H, W, 3] on the host: into the clip's buffer (copied), or kept as it is."""
        if self.frames is None:
            self.pieces.append(piece)
            return
        if self.clip is None:
            self.clip = torch.empty((self.frames, *piece.shape[1:]), dtype=piece.dtype)
        self.clip[self.filled : self.filled + piece.shape[0]] = piece
        self.filled += piece.shape[0]

    def take(self) -> torch.Tensor:
        """The frames of the chunks added since the last take, [F, H, W, 3] float32 in 0..1 on the host."""
        self.land()
        if self.frames is not None:
            frames, self.clip, self.filled = self.clip[: self.filled], None, 0
            return frames
        frames, self.pieces = torch.cat(self.pieces) if len(self.pieces) > 1 else self.pieces[0], []
        return frames
