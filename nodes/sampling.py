"""Prompt, schedule, conditioning and sampler nodes.

Size, frame count and fps are set once, on the sampler (0 = the checkpoint variant's default); they
reach the prompt's metadata, the latent size and, through the decode node's fps output, the video.
"""

import re

from ..cosmos3_runtime import InputError
from ..cosmos3_runtime.prompts import parse_caption
from . import services

AUTO = "0 = automatic (the checkpoint variant's default)"


class Cosmos3TextEncode:
    DESCRIPTION = "A prompt (prose or a JSON caption) and a negative prompt, with the metadata templates to apply."
    CATEGORY = "cosmos3"
    RETURN_TYPES = ("COSMOS3_TEXT",)
    RETURN_NAMES = ("text",)
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "prompt": ("STRING", {"multiline": True, "dynamicPrompts": False,
                           "tooltip": "prose, or a JSON object (a structured caption: resolution, duration and fps "
                                      "are filled in from the sampler)"}),  # fmt: skip
                "negative_prompt": ("STRING", {"multiline": True, "dynamicPrompts": False, "default": ""}),
                "system_prompt": (["auto", "on", "off"], {"default": "auto",
                                  "tooltip": "auto: the checkpoint's default_use_system_prompt"}),  # fmt: skip
                "resolution_template": ("BOOLEAN", {"default": True, "tooltip": "append 'This video is of HxW "
                                        "resolution.' to prose prompts (negated on the negative)"}),  # fmt: skip
                "duration_template": ("BOOLEAN", {"default": True, "tooltip": "append 'The video is N seconds long "
                                      "and is of F FPS.' to prose video prompts (negated on the negative)"}),  # fmt: skip
                "json_captions": ("BOOLEAN", {"default": True, "tooltip": "treat a prompt that is a JSON object as "
                                  "a structured caption; off: every prompt is prose"}),  # fmt: skip
            }
        }

    def encode(self, prompt, negative_prompt, system_prompt, resolution_template, duration_template, json_captions):
        kind = "JSON caption" if json_captions and parse_caption(prompt) is not None else "prose"
        text = {
            "prompt": prompt,
            "negative_prompt": negative_prompt,
            "use_system_prompt": {"auto": None, "on": True, "off": False}[system_prompt],
            "add_resolution_template": resolution_template,
            "add_duration_template": duration_template,
            "json_captions": json_captions,
        }
        return {"ui": {"text": [f"prompt read as {kind}"]}, "result": (text,)}


class Cosmos3Scheduler:
    DESCRIPTION = "Sampling schedule: automatic, flow UniPC with a flow shift, the checkpoint's own, or distilled."
    CATEGORY = "cosmos3"
    RETURN_TYPES = ("COSMOS3_SCHEDULE",)
    RETURN_NAMES = ("schedule",)
    FUNCTION = "build"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "schedule": (["auto", "unipc", "checkpoint", "distilled"], {"default": "auto",
                             "tooltip": "auto: fixed sigmas on distilled checkpoints, else flow UniPC; checkpoint: "
                                        "the shipped scheduler_config.json (Karras sigmas ignore the flow shift)"}),  # fmt: skip
                "steps": ("INT", {"default": 0, "min": 0, "max": 1000, "tooltip": f"{AUTO}: 35, or the distilled "
                          "checkpoint's fixed count"}),  # fmt: skip
                "flow_shift": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01,
                               "tooltip": f"{AUTO}: 3 for images and Edge, 10 for other video"}),  # fmt: skip
            }
        }

    def build(self, schedule, steps, flow_shift):
        return ({"schedule": schedule, "steps": steps or None, "flow_shift": flow_shift or None},)


class Cosmos3ImageToVideo:
    DESCRIPTION = "Condition the first frame of the video on an image (resized to cover the sampler's size, centre-cropped)."
    CATEGORY = "cosmos3/conditioning"
    RETURN_TYPES = ("COSMOS3_MEDIA",)
    RETURN_NAMES = ("media",)
    FUNCTION = "condition"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"image": ("IMAGE", {"tooltip": "the first frame; of a batch, the first image is used"})}}

    def condition(self, image):
        if image.shape[0] > 1:
            services.log.warning("Cosmos3 image-to-video: using the first of %d images", image.shape[0])
        return ({"image": image[:1]},)


class Cosmos3VideoToVideo:
    DESCRIPTION = "Condition the first latent frames of the video on a clip (frames resized to the sampler's size)."
    CATEGORY = "cosmos3/conditioning"
    RETURN_TYPES = ("COSMOS3_MEDIA",)
    RETURN_NAMES = ("media",)
    FUNCTION = "condition"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "video": ("IMAGE", {"tooltip": "the conditioning clip as an IMAGE batch"}),
                "condition_frames": ("STRING", {"default": "0,1", "tooltip": "latent frames held fixed (latent f "
                                     "covers video frames up to 4f): '0,1' keeps the first 5 frames"}),  # fmt: skip
                "keep": (["first", "last"], {"default": "first", "tooltip": "use the start or the end of the clip"}),
            }
        }

    def condition(self, video, condition_frames, keep):
        try:
            frames = tuple(int(v) for v in re.split(r"[,\s]+", condition_frames.strip()) if v)
        except ValueError:
            raise InputError(f"condition_frames {condition_frames!r} must be latent frame numbers like '0,1'") from None
        return ({"video": video, "condition_frame_indexes": frames, "condition_video_keep": keep},)


def parse_guidance_interval(value: str):
    text = value.strip().lower()
    if text in ("auto", "off"):
        return text if text == "auto" else None
    parts = [p for p in re.split(r"[,\s]+|(?<=\d)-(?=\d)", text) if p]
    try:
        low, high = (float(p) for p in parts)
    except ValueError:
        raise InputError(f"guidance_interval {value!r} must be 'auto', 'off' or 'LOW,HIGH' (timesteps 0-1000)") from None
    return low, high


class Cosmos3Sampler:
    DESCRIPTION = "Generates Cosmos3 latents: text-to-image (frames = 1), text-to-video, image- or video-to-video."
    CATEGORY = "cosmos3"
    RETURN_TYPES = ("LATENT",)
    RETURN_NAMES = ("latent",)
    FUNCTION = "sample"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": ("COSMOS3_MODEL",),
                "text": ("COSMOS3_TEXT",),
                "width": ("INT", {"default": 0, "min": 0, "max": 8192, "step": 16,
                          "tooltip": f"multiple of 16; {AUTO}: 832 Edge video, 640 Edge image, else 1280"}),  # fmt: skip
                "height": ("INT", {"default": 0, "min": 0, "max": 8192, "step": 16,
                           "tooltip": f"multiple of 16; {AUTO}: 480 Edge video, 640 Edge image, else 720"}),  # fmt: skip
                "frames": ("INT", {"default": 0, "min": 0, "max": 4097, "tooltip": f"1 = an image; video counts "
                           f"are 1 + 4k (others round down); {AUTO}: 81"}),  # fmt: skip
                "fps": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 240.0, "step": 0.5, "tooltip": f"{AUTO}: 24"}),
                "guidance": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 30.0, "step": 0.1, "round": 0.01,
                             "tooltip": f"classifier-free guidance; {AUTO}: 4, Edge 5 (video) / 7 (image); "
                                        "distilled checkpoints always use 1"}),  # fmt: skip
                "guidance_interval": ("STRING", {"default": "auto", "tooltip": "timesteps where guidance applies: "
                                      "auto ([400, 1000] for images, always for video), off, or LOW,HIGH"}),  # fmt: skip
                "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF, "control_after_generate": True}),
            },
            "optional": {
                "schedule": ("COSMOS3_SCHEDULE", {"tooltip": "default: automatic"}),
                "media": ("COSMOS3_MEDIA", {"tooltip": "an image (image-to-video) or clip (video-to-video)"}),
            },
        }

    def sample(self, model, text, width, height, frames, fps, guidance, guidance_interval, seed, schedule=None,
               media=None):  # fmt: skip
        schedule = schedule or {"schedule": "auto", "steps": None, "flow_shift": None}
        media = media or {}
        progress = None

        def on_step(step, total, latents):
            nonlocal progress
            progress = progress or services.Progress(total)
            progress.update(step, latents)

        with model.use() as pipe:
            result = pipe.generate(
                text["prompt"], negative_prompt=text["negative_prompt"], width=width or None, height=height or None,
                num_frames=frames or None, fps=fps or None, guidance_scale=guidance or None,
                steps=schedule["steps"], flow_shift=schedule["flow_shift"], schedule=schedule["schedule"],
                guidance_interval=parse_guidance_interval(guidance_interval), seed=seed,
                use_system_prompt=text["use_system_prompt"], add_resolution_template=text["add_resolution_template"],
                add_duration_template=text["add_duration_template"], json_captions=text["json_captions"],
                output="latents", callback=on_step, **media,
            )  # fmt: skip
        s = result.settings
        summary = (f"{s.mode}: {s.width}x{s.height}, {s.num_frames} frames at {s.fps:g} fps, {s.steps} steps "
                   f"({s.schedule}), guidance {s.guidance_scale:g}")  # fmt: skip
        latent = {"samples": result.latents, "cosmos3": {"fps": s.fps, "num_frames": s.num_frames, "mode": s.mode}}
        return {"ui": {"text": [summary, *s.notes]}, "result": (latent,)}
