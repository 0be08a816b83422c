"""The frame geometry of the Wan 2.2 VAE: 16 pixels per latent across, and in time 1 + 4k frames per 1 + k latent
frames (causal: latent frame 0 holds frame 0 alone, latent frame j >= 1 holds frames 4j-3..4j); and a run's shape
(`RunGeometry`)."""

from dataclasses import dataclass

SPATIAL_FACTOR = 16  # pixels per latent (Wan 2.2 VAE 16x spatial compression); checked against vae/config.json
TEMPORAL_FACTOR = 4  # video frames per latent frame (Wan 2.2 VAE); checked against vae/config.json


def latent_size(height: int, width: int) -> tuple[int, int]:
    """The latent grid (h, w) of frames `height` x `width` (multiples of SPATIAL_FACTOR)."""
    return height // SPATIAL_FACTOR, width // SPATIAL_FACTOR


def latent_frames(pixel_frames: int) -> int:
    """Latent frames that hold the first `pixel_frames` frames (0 for none)."""
    return 0 if pixel_frames <= 0 else (pixel_frames - 1) // TEMPORAL_FACTOR + 1


def pixel_frames(latents: int) -> int:
    """The frames `latents` latent frames decode to."""
    return 1 + TEMPORAL_FACTOR * (latents - 1)


def latent_of(frame: int) -> int:
    """The latent frame that holds pixel frame `frame`."""
    return (frame - 1) // TEMPORAL_FACTOR + 1 if frame > 0 else 0


def latent_span(latent: int) -> range:
    """The pixel frames latent frame `latent` holds."""
    return range(0, 1) if latent == 0 else range(TEMPORAL_FACTOR * latent - 3, TEMPORAL_FACTOR * latent + 1)


def round_down_frames(n: int) -> int:
    """Largest 1 + 4k not above n (1 stays 1)."""
    return 1 + TEMPORAL_FACTOR * ((n - 1) // TEMPORAL_FACTOR)


def round_up_frames(n: int) -> int:
    """Smallest 1 + 4k not below n."""
    return 1 if n <= 1 else -(-(n - 1) // TEMPORAL_FACTOR) * TEMPORAL_FACTOR + 1


@dataclass(frozen=True)
class RunGeometry:
    """A run's shape: what each window holds (a chunked run holds one chunk at a time), how many windows it makes and
    what it hands back. The one account the memory budget and the time estimate read."""

    height: int
    width: int
    window_frames: int  # pixel frames of one window
    total_frames: int  # frames the run hands back
    windows: int = 1  # chunks
    overlap: int = 0  # frames each later window takes from the one before
    controls: int = 0  # control clips beside the video in each window's sequence (transfer)
    guided: bool = False  # each step also runs the negative prompt (guidance scale not 1)
    control_guided: bool = False  # each step also runs the video without its controls (control guidance not 1)
    history_frames: int = 0  # latent frames of media K/V kept across forwards and attended to (a causal rollout's)
    history_memory: str = "device"  # how that K/V is kept: on the device, in host memory ("cpu"), or in "fp8"
    history_extra_rows: int = 0  # rows each of those frames holds beside its video tokens (Sim-Bimanual's actions)
    decoded_frames: int | None = None  # frames one decode makes (None: a window's; a rollout decodes the whole clip)
    decoded_piece: int | None = None  # frames one piece of a streamed decode makes: a causal rollout's chunk, decoded
    # as it is made unless tiled (`codec.ChunkDecode`); None: not streamed

    @property
    def passes(self) -> int:
        """Forward passes a step runs."""
        return 1 + self.guided + self.control_guided

    @property
    def latent_size(self) -> tuple[int, int]:
        return latent_size(self.height, self.width)

    @property
    def window_latent_frames(self) -> int:
        return latent_frames(self.window_frames)

    @property
    def total_latent_frames(self) -> int:
        return latent_frames(self.total_frames)
