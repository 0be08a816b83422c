"""Reading conditioning media (files, or bytes received in memory) and writing generated frames to files
(the CLI's outputs; ComfyUI saves through its own nodes)."""

import io
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from .errors import InputError, LimitError


def to_uint8(frames: torch.Tensor) -> np.ndarray:
    """[F, H, W, 3] floats in 0..1 -> uint8 array, rounding like PIL conversions do."""
    return (frames.clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()


IMAGE_TYPES = (".png", ".jpg", ".jpeg", ".webp")
VIDEO_CODECS = {".mp4": "libx264", ".mkv": "libx264", ".webm": "libvpx-vp9"}
LATENT_TYPE = ".safetensors"
MAX_FRAME_PIXELS = 4096 * 4096  # per image or video frame received by a server or read for the Reasoner


def check_output(path: str | Path, kinds: tuple[str, ...] | None = None) -> Path:
    """An output path the CLI can write: a known file type (`kinds`, default images, video and latents) in an
    existing, writable folder. Checked before generating."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (kinds or (*IMAGE_TYPES, *VIDEO_CODECS, LATENT_TYPE)):
        known = ", ".join(kinds) if kinds else f".png, .jpg, .webp (images), .mp4, .mkv, .webm (video) or {LATENT_TYPE} (latents)"
        raise InputError(f"unsupported output file type {suffix or path.name!r}; use {known}")
    folder = path.parent
    if not folder.is_dir():
        raise InputError(f"output folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise InputError(f"output folder {folder} is not writable")
    return path


def save(frames: torch.Tensor, path: str | Path, fps: float, sound=None, sample_rate=None) -> list[Path]:
    """Save one frame as an image (.png/.jpg/.webp) or a clip as video (.mp4/.mkv/.webm, with `sound` as its
    audio track if given). Returns the written files."""
    path = check_output(path)
    if path.suffix.lower() in IMAGE_TYPES:
        return save_images(frames, path)
    return [save_video(frames, path, fps, sound, sample_rate)]


def _source(source: "str | Path | bytes"):
    """What PIL and PyAV open, and how errors name it: a file path, or bytes received in memory."""
    if isinstance(source, bytes):
        return io.BytesIO(source), "the uploaded data"
    if not Path(source).is_file():
        return None, str(source)
    return str(source), str(source)


def read_image(source: "str | Path | bytes", max_pixels: int | None = None):
    """A conditioning image from a file or from bytes, fully decoded (a broken file fails here, not mid-run).

    `max_pixels` is checked from the header, before the pixels are decoded."""
    from PIL import Image, UnidentifiedImageError

    opened, name = _source(source)
    if opened is None:
        raise InputError(f"image file {name} does not exist")
    try:
        with Image.open(opened) as image:
            if max_pixels is not None and image.width * image.height > max_pixels:
                raise LimitError(f"image {name} is {image.width}x{image.height}, over the limit of {max_pixels} pixels")
            return image.convert("RGB")
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError) as exc:
        raise InputError(f"cannot read image {name}: {exc}") from None


def read_video(source: "str | Path | bytes", max_frames: int | None = None, max_pixels: int | None = None,
               keep=None) -> list:
    """The frames of a video (a file or bytes) as PIL images: the first `max_frames` if given, or only the frame
    indices in `keep` (a set: the rest are decoded and dropped); `max_pixels` bounds each frame."""
    import av

    opened, name = _source(source)
    if opened is None:
        raise InputError(f"video file {name} does not exist")
    frames = []
    try:
        with av.open(opened) as container:
            for index, frame in enumerate(container.decode(video=0)):
                if max_pixels is not None and frame.width * frame.height > max_pixels:
                    raise LimitError(f"video {name} is {frame.width}x{frame.height}, over the limit of {max_pixels} "
                                     "pixels per frame")
                if keep is None or index in keep:
                    frames.append(frame.to_image())
                if max_frames is not None and len(frames) >= max_frames:
                    break
    except (av.error.FFmpegError, IndexError, ValueError) as exc:
        raise InputError(f"cannot read video {name}: {exc}") from None
    if not frames:
        raise InputError(f"video {name} has no frames")
    return frames


def video_header(source: "str | Path | bytes") -> tuple[int, float | None]:
    """(frame count, frames per second) of a video from its container, without decoding (count 0: not recorded)."""
    import av

    opened, name = _source(source)
    if opened is None:
        raise InputError(f"video file {name} does not exist")
    try:
        with av.open(opened) as container:
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate
            return int(stream.frames or 0), float(rate) if rate else None
    except (av.error.FFmpegError, IndexError, ValueError) as exc:
        raise InputError(f"cannot read video {name}: {exc}") from None


MAX_AUDIO_SECONDS = 3600  # a soundtrack read from a file; a run uses its first num_frames / fps seconds


def read_audio(source: "str | Path | bytes") -> tuple[torch.Tensor, int]:
    """The sound of a file (wav, flac, mp3, or a video's audio track): (waveform [channels, samples] float32, the
    file's sample rate), fully decoded (a broken file fails here, not mid-run)."""
    import av

    opened, name = _source(source)
    if opened is None:
        raise InputError(f"audio file {name} does not exist")
    chunks, rate, samples = [], None, 0
    try:
        with av.open(opened) as container:
            if not container.streams.audio:
                raise InputError(f"{name} has no audio track")
            to_float = av.AudioResampler(format="fltp")  # the file's own layout and rate
            for frame in container.decode(audio=0):
                rate = rate or frame.sample_rate
                decoded = [f.to_ndarray() for f in to_float.resample(frame)]
                chunks += decoded
                samples += sum(c.shape[1] for c in decoded)
                if samples > MAX_AUDIO_SECONDS * rate:
                    raise LimitError(f"audio {name} is over {MAX_AUDIO_SECONDS // 60} minutes long; cut the part "
                                     "you need first")
            chunks += [f.to_ndarray() for f in to_float.resample(None)]
    except (av.error.FFmpegError, IndexError, ValueError) as exc:
        raise InputError(f"cannot read audio {name}: {exc}") from None
    if not chunks or rate is None:
        raise InputError(f"audio {name} has no samples")
    return torch.from_numpy(np.concatenate(chunks, axis=1).astype(np.float32)), int(rate)


def save_images(frames: torch.Tensor, path: Path) -> list[Path]:
    """One image per frame; several frames get numbered names (out_00000.png, ...)."""
    from PIL import Image

    pixels = to_uint8(frames)
    if len(pixels) == 1:
        paths = [path]
    else:
        paths = [path.with_name(f"{path.stem}_{i:05d}{path.suffix}") for i in range(len(pixels))]
    for frame, target in zip(pixels, paths):
        Image.fromarray(frame).save(target)
    return paths


AUDIO_CODECS = {".mp4": "aac", ".mkv": "aac", ".webm": "libopus"}
MUX_RATE = 48000  # what a waveform at a rate its codec cannot store (toy checkpoints) is resampled to


def save_video(frames: torch.Tensor, path: Path, fps: float, sound: torch.Tensor | None = None,
               sample_rate: int | None = None) -> Path:
    """A clip, with `sound` ([channels, samples] in [-1, 1] at `sample_rate`) as its audio track if given."""
    try:
        import av
    except ImportError as exc:
        raise InputError("writing video needs PyAV (pip install av); or save frames as .png") from exc
    codec = VIDEO_CODECS[path.suffix.lower()]
    pixels = to_uint8(frames)
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height = pixels.shape[2], pixels.shape[1]
        stream.pix_fmt = "yuv420p"
        audio = _add_audio(container, path, sound, sample_rate) if sound is not None else None
        for frame in pixels:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
        if audio is not None:
            audio_stream, audio_frames = audio
            for frame in audio_frames:
                container.mux(audio_stream.encode(frame))
            container.mux(audio_stream.encode())
    return path


def _add_audio(container, path: Path, sound: torch.Tensor, sample_rate: int):
    """The audio stream and its frames (resampled when the codec cannot store `sample_rate`)."""
    import av

    name = AUDIO_CODECS[path.suffix.lower()]
    rate = sample_rate if sample_rate in (av.codec.Codec(name, "w").audio_rates or ()) else MUX_RATE
    layout = "stereo" if sound.shape[0] == 2 else "mono"
    stream = container.add_stream(name, rate=rate, layout=layout)
    source = av.AudioFrame.from_ndarray(sound.float().contiguous().numpy(), format="fltp", layout=layout)
    source.sample_rate = sample_rate
    resampler = av.AudioResampler(format=stream.format.name, layout=layout, rate=rate, frame_size=stream.frame_size or None)
    frames = resampler.resample(source) + resampler.resample(None)
    start = 0
    for frame in frames:  # timestamps in samples from the start, the audio stream's time base
        frame.pts, frame.time_base = start, Fraction(1, rate)
        start += frame.samples
    return stream, frames


def save_wav(sound: torch.Tensor, path: str | Path, sample_rate: int) -> Path:
    """16-bit PCM WAV of a waveform [channels, samples] in [-1, 1]."""
    import wave

    path = check_output(path, kinds=(".wav",))
    pcm = (sound.clamp(-1, 1) * 32767).round().to(torch.int16).t().contiguous().numpy()
    with wave.open(str(path), "wb") as f:
        f.setnchannels(sound.shape[0])
        f.setsampwidth(2)
        f.setframerate(sample_rate)
        f.writeframes(pcm.tobytes())
    return path


TABLE_TYPES = (".json", ".npy", ".csv")  # files of numbers: actions, a robot state


def read_array(value: str, what: str) -> torch.Tensor:
    """Numbers (float32) from a file (`TABLE_TYPES`: .json nested lists or {what: ...}, .npy, .csv rows of
    comma-separated values), or from comma-separated text."""
    path = Path(value)
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            return torch.from_numpy(np.load(path, allow_pickle=False).astype(np.float32))
        if suffix == ".csv":
            return torch.from_numpy(np.loadtxt(path, delimiter=",", ndmin=2, dtype=np.float32))
        if suffix == ".json":
            import json

            data = json.loads(path.read_text(encoding="utf-8"))
            return torch.tensor(data[what] if isinstance(data, dict) else data, dtype=torch.float32)
    except FileNotFoundError:
        raise InputError(f"{what} file {path} does not exist") from None
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise InputError(f"cannot read {what} from {value!r}: {exc}") from None
    try:
        return torch.tensor([float(v) for v in value.split(",")], dtype=torch.float32)
    except ValueError:
        raise InputError(f"{what} {value!r} is neither a table file ({', '.join(TABLE_TYPES)}) nor comma-separated "
                         "numbers") from None


def save_actions(actions: torch.Tensor, video_path: Path, request, fps: float) -> list[Path]:
    """The actions next to the video: <name>.actions.json (with what they are) and <name>.actions.npy."""
    import json

    stem = video_path.with_suffix("")
    meta = {"mode": request.mode, "domain": request.domain, "preset": request.preset, "chunk_size": request.chunk_size,
            "fps": fps, "units": "dataset" if request.stats is not None else "normalized",
            "actions": actions.tolist()}
    json_path, npy_path = Path(f"{stem}.actions.json"), Path(f"{stem}.actions.npy")
    json_path.write_text(json.dumps(meta, indent=1), encoding="utf-8")
    np.save(npy_path, actions.numpy())
    return [json_path, npy_path]
