"""The frame geometry of the Wan 2.2 VAE: 16 pixels per latent across, and in time 1 + 4k frames per 1 + k latent
frames (causal: latent frame 0 holds frame 0 alone, latent frame j >= 1 holds frames 4j-3..4j)."""

SPATIAL_FACTOR = 16  # pixels per latent (Wan 2.2 VAE 16x spatial compression); checked against vae/config.json
TEMPORAL_FACTOR = 4  # video frames per latent frame (Wan 2.2 VAE); checked against vae/config.json


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
