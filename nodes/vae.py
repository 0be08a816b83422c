"""VAE nodes: Cosmos3 latents <-> ComfyUI IMAGE batches."""

import torch

from ..cosmos3_runtime import InputError
from ..cosmos3_runtime.request import help_of
from ..cosmos3_runtime.geometry import round_down_frames
from ..cosmos3_runtime.vae import TileSpec
from . import services
from .guardrails import GUARDRAIL, filter_frames


def latent_samples(samples: dict) -> torch.Tensor:
    latents = samples["samples"]
    if latents.ndim != 5 or latents.shape[1] != 48:
        raise InputError(
            f"expected a Cosmos3 latent [1, 48, T, h, w], got {list(latents.shape)}; connect a Cosmos3 sampler"
        )
    return latents


class Cosmos3VAEDecode:
    DESCRIPTION = "Decodes Cosmos3 latents to frames (an IMAGE batch) and passes on the clip's fps."
    CATEGORY = "cosmos3"
    RETURN_TYPES = ("IMAGE", "FLOAT")
    RETURN_NAMES = ("images", "fps")
    OUTPUT_TOOLTIPS = ("the frames", "the frame rate set on the sampler: connect it to Create Video")
    FUNCTION = "decode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "vae": ("COSMOS3_VAE",),
                "samples": ("LATENT",),
                "tiled": ("BOOLEAN", {"default": False, "tooltip": "decode in overlapping tiles: much less memory "
                          "on large frames, slightly slower, small differences at tile seams"}),
                "tile_size": ("INT", {"default": 32, "min": 4, "max": 512, "tooltip": "tile size in latents (x16 px)"}),
                "tile_overlap": ("INT", {"default": 8, "min": 0, "max": 256, "tooltip": "overlap in latents"}),
            },
            "optional": {"guardrail": (GUARDRAIL, {"tooltip": "Cosmos3 Guardrail Loader: faces in the frames are "
                                                   "pixelated before they leave"})},
        }

    def decode(self, vae, samples, tiled, tile_size, tile_overlap, guardrail=None):
        latents = latent_samples(samples)
        tile = TileSpec(tile_size, tile_overlap) if tiled else None
        with vae.use() as pipe:
            frames = pipe.decode(latents, tile=tile, progress=services.progress.Progress.bar(), raw=True)
        fps = float(samples.get("cosmos3", {}).get("fps", 24.0))
        return (filter_frames(guardrail, frames), fps)


class Cosmos3VAEEncode:
    DESCRIPTION = "Encodes an IMAGE batch (frames in order) to a LATENT of raw Wan 2.2 latents, as ComfyUI's VAE Encode."
    CATEGORY = "cosmos3"
    RETURN_TYPES = ("LATENT",)
    RETURN_NAMES = ("latent",)
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"vae": ("COSMOS3_VAE",), "images": ("IMAGE",)}}

    def encode(self, vae, images):
        count = round_down_frames(images.shape[0])
        if count != images.shape[0]:
            services.log.warning("Cosmos3 VAE encode: %d frames, using the first %d (1 + 4k)", images.shape[0], count)
        with vae.use() as pipe:
            return ({"samples": pipe.encode(images[:count], progress=services.progress.Progress.bar(), raw=True)},)


class Cosmos3SoundDecode:
    DESCRIPTION = ("Decodes the sound a Cosmos3 sampler generated with its video (sound on) to ComfyUI AUDIO, or hands "
                   "on the soundtrack an audio-conditioned run held: connect it to Create Video's audio, or to an audio "
                   "preview.")
    CATEGORY = "cosmos3"
    RETURN_TYPES = ("AUDIO",)
    RETURN_NAMES = ("audio",)
    FUNCTION = "decode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "vae": ("COSMOS3_VAE",),
                "samples": ("LATENT",),
                "trim": ("BOOLEAN", {"default": True, "tooltip": help_of("sound_trim")}),
            }
        }

    def decode(self, vae, samples, trim):
        meta = samples.get("cosmos3", {})
        if meta.get("soundtrack") is not None:  # already the video's duration, at the tokenizer's rate
            return ({"waveform": meta["soundtrack"].unsqueeze(0), "sample_rate": int(meta["sample_rate"])},)
        if meta.get("sound_latents") is None:
            raise InputError("this LATENT carries no sound: turn on 'sound' in the Cosmos3 Sampler (a checkpoint "
                             "with a sound head, such as Nano)")
        seconds = meta["num_frames"] / meta["fps"] if trim else None
        with vae.use() as pipe:
            waveform = pipe.decode_sound(meta["sound_latents"], seconds)
        services.progress.check_interrupt()
        return ({"waveform": waveform.unsqueeze(0), "sample_rate": int(meta["sample_rate"])},)
