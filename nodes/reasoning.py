"""The Reasoner nodes: ask the loaded checkpoint about images or a clip, and upsample a prompt into a JSON caption.

Both run on the loaded COSMOS3_MODEL (the Reasoner shares its text tower); the answer streams into the
node as progress text while it is written, the progress bar counts tokens, and Cancel stops it.
"""

import time

from ..cosmos3_runtime.errors import InputError
from ..cosmos3_runtime.reasoner import (DEFAULT_MAX_NEW_TOKENS, DEFAULT_VIDEO_FPS, MAX_NEW_TOKENS,
                                        Clip, Sampling, check_clip, upsample)
from ..cosmos3_runtime.reasoner.decoding import RECOMMENDED
from . import services
from .sampling import seed_widget, size_widgets

SAMPLING = "COSMOS3_SAMPLING"

STREAM_INTERVAL_S = 0.1  # progress-text updates per second, at most


class Cosmos3ReasonSampling:
    DESCRIPTION = ("How the Reasoner picks each token, for Cosmos3 Reason and Upsample Prompt. Without it, Reason uses "
                   "NVIDIA's recommended settings and Upsample Prompt is greedy. temperature 0: greedy.")
    CATEGORY = "cosmos3"
    RETURN_TYPES = (SAMPLING,)
    RETURN_NAMES = ("sampling",)
    FUNCTION = "build"

    @classmethod
    def INPUT_TYPES(cls):
        temperature, top_p, top_k, presence = RECOMMENDED[False]
        return {"required": {
            "temperature": ("FLOAT", {"default": temperature, "min": 0.0, "max": 2.0, "step": 0.05,
                            "tooltip": "0: greedy (always the likeliest token)"}),
            "top_p": ("FLOAT", {"default": top_p, "min": 0.01, "max": 1.0, "step": 0.01}),
            "top_k": ("INT", {"default": top_k, "min": 0, "max": 1000, "tooltip": "0: no limit"}),
            "presence_penalty": ("FLOAT", {"default": presence, "min": -2.0, "max": 2.0, "step": 0.1,
                                 "tooltip": "subtracted from tokens already written (NVIDIA: 1.5, 0 with thinking)"}),
        }}

    def build(self, temperature, top_p, top_k, presence_penalty):
        options = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "presence_penalty": presence_penalty}
        Sampling.resolve(False, **options)  # refused here, before the model runs
        return (options,)


class Streamer:
    """The answer as progress text on the node and the token count on the progress bar; Cancel raises here."""

    def __init__(self, node_id, total: int):
        self.node_id, self.progress, self.shown_at = node_id, services.progress.Progress(total, previews=False), 0.0

    def __call__(self, count: int, total: int, text: str) -> None:
        self.progress.update(count)
        now = time.monotonic()
        if now - self.shown_at >= STREAM_INTERVAL_S or count == total:
            self.shown_at = now
            services.progress.progress_text(text, self.node_id)


def single_pipeline(model):
    pipe = model.pipeline
    if not pipe.local:
        raise InputError("the Reasoner runs on one GPU; load the checkpoint with gpus = 1 for Cosmos3 Reason and "
                         "Cosmos3 Upsample Prompt")
    return pipe


class Cosmos3Reason:
    DESCRIPTION = ("Asks the checkpoint's Reasoner a question about images or a clip (or text alone): describe, "
                   "locate, explain, judge physical plausibility. The same weights as generation.")
    CATEGORY = "cosmos3"
    RETURN_TYPES = ("STRING", "STRING")
    RETURN_NAMES = ("answer", "thinking")
    OUTPUT_TOOLTIPS = ("the answer", "the reasoning before it (thinking on), else empty")
    FUNCTION = "reason"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": ("COSMOS3_MODEL",),
                "question": ("STRING", {"multiline": True, "dynamicPrompts": False, "default": "Describe this image.",
                             "tooltip": "the question (media come first in the prompt, as NVIDIA recommends)"}),
                "system_prompt": ("STRING", {"dynamicPrompts": False, "default": "",
                                  "tooltip": "empty: none (NVIDIA suggests 'You are a helpful assistant.')"}),
                "max_new_tokens": ("INT", {"default": DEFAULT_MAX_NEW_TOKENS, "min": 1, "max": MAX_NEW_TOKENS,
                                   "tooltip": "the answer's length limit, in tokens"}),
                "thinking": ("BOOLEAN", {"default": False, "tooltip": "reason step by step first; the reasoning "
                             "comes out as the second output"}),
                "seed": seed_widget(),
            },
            "optional": {
                "sampling": (SAMPLING, {"tooltip": "from Cosmos3 Reason Sampling; default: NVIDIA's recommended "
                             "settings for the mode"}),
                "image": ("IMAGE", {"tooltip": "one picture, or a batch of pictures each asked about"}),
                "video": ("IMAGE", {"tooltip": "a clip (an IMAGE batch, e.g. from Load Video or a VAE decode)"}),
                "video_fps": ("FLOAT", {"default": DEFAULT_VIDEO_FPS, "min": 0.1, "max": 240.0, "step": 0.1,
                              "tooltip": "the clip's frame rate (its timestamps in the prompt come from it)"}),
                "sample_fps": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 60.0, "step": 0.1,
                               "tooltip": "frames per second of the clip the Reasoner looks at; 0 = the checkpoint's "
                                          "processor setting (NVIDIA recommends 4)"}),
            },
            "hidden": {"node_id": "UNIQUE_ID"},
        }

    def reason(self, model, question, system_prompt, max_new_tokens, thinking, seed, sampling=None, image=None,
               video=None, video_fps=DEFAULT_VIDEO_FPS, sample_fps=0.0, node_id=None):
        single_pipeline(model)
        images = [] if image is None else list(image)
        clip = None if video is None else Clip(video, video_fps, sample_fps or None)
        if clip is not None:  # a clip too short is refused before the Reasoner's parts load
            check_clip(clip, model.spec.source)
        with model.use(reasoner=True) as pipe:
            answer = pipe.reason(question, images=images, video=clip, system_prompt=system_prompt.strip() or None,
                                 max_new_tokens=max_new_tokens, thinking=thinking,
                                 callback=Streamer(node_id, max_new_tokens), seed=seed, **(sampling or {}))
        tokens = len(answer.token_ids)
        report = [answer.text, f"({tokens} tokens, {answer.finish_reason}; "
                  f"{tokens / max(answer.decode_seconds, 1e-9):.1f} tokens/s)"]
        return {"ui": {"text": report}, "result": (answer.text, answer.thinking or "")}


class Cosmos3UpsamplePrompt:
    DESCRIPTION = ("Turns a short prompt (and optionally the starting image, or the clip to continue) into the "
                   "detailed JSON caption Cosmos3 was trained on, with the model authors' own upsampling templates. "
                   "Feed it to Text Encode.")
    CATEGORY = "cosmos3"
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("caption",)
    OUTPUT_TOOLTIPS = ("the JSON caption (the prompt unchanged when the reply held none)",)
    FUNCTION = "upsample"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": ("COSMOS3_MODEL",),
                "prompt": ("STRING", {"multiline": True, "dynamicPrompts": False, "tooltip": "a short description"}),
                **size_widgets(),
                "frames": ("INT", {"default": 0, "min": 0, "max": 4097, "tooltip": "the generation's frame count "
                           "(1: an image caption); 0 = automatic"}),
                "fps": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 240.0, "step": 0.5, "tooltip": "0 = automatic"}),
                "max_new_tokens": ("INT", {"default": upsample.DEFAULT_MAX_NEW_TOKENS, "min": 1, "max": MAX_NEW_TOKENS}),
                "seed": seed_widget(),
            },
            "optional": {
                "sampling": (SAMPLING, {"tooltip": "from Cosmos3 Reason Sampling; default: greedy, as the model "
                             "authors upsample"}),
                "image": ("IMAGE", {"tooltip": "the starting frame of an image-to-video generation"}),
                "video": ("IMAGE", {"tooltip": "the clip a video-to-video generation continues (described from its "
                          "last frame)"}),
            },
            "hidden": {"node_id": "UNIQUE_ID"},
        }

    def upsample(self, model, prompt, width, height, frames, fps, max_new_tokens, seed, sampling=None, image=None,
                 video=None, node_id=None):
        single_pipeline(model)
        if image is not None and image.shape[0] != 1:
            raise InputError(f"Upsample Prompt takes one starting image, got a batch of {image.shape[0]}")
        with model.use(reasoner=True) as pipe:
            result = pipe.upsample_prompt(prompt, image=None if image is None else image[0], video=video,
                                          width=width or None, height=height or None, num_frames=frames or None,
                                          fps=fps or None, max_new_tokens=max_new_tokens,
                                          callback=Streamer(node_id, max_new_tokens), seed=seed, **(sampling or {}))
        note = "JSON caption" if result.parsed else "the reply held no JSON caption: the prompt is passed on unchanged"
        note += f" (asked with {result.templates})"
        return {"ui": {"text": [note, result.caption]}, "result": (result.caption,)}
