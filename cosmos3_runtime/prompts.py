"""The text Cosmos3 is conditioned on: prompt plus metadata, as the model was trained to read it.

Prose prompts get sentences stating the clip's duration and resolution appended (their negations on
the negative prompt), with the exact strings of the reference pipeline. A prompt that parses as a
JSON object is a structured caption: its `resolution`, `duration` and `fps` keys are set from the
request instead, and no prose sentence is appended. Anything else (JSON lists or strings, malformed
JSON) is prose.
"""

import json
import logging
from dataclasses import dataclass

from .errors import InputError

log = logging.getLogger(__name__)

# The trained system prompts, including the reference's "give" (not "given"): the model saw these tokens.
SYSTEM_PROMPT_IMAGE = "You are a helpful assistant who will generate images from a give prompt."
SYSTEM_PROMPT_VIDEO = "You are a helpful assistant who will generate videos from a give prompt."

DURATION = "The video is {seconds:.1f} seconds long and is of {fps:.0f} FPS."
DURATION_NEGATED = "The video is not {seconds:.1f} seconds long and is not of {fps:.0f} FPS."
RESOLUTION = "This {kind} is of {height}x{width} resolution."
RESOLUTION_NEGATED = "This {kind} is not of {height}x{width} resolution."


@dataclass(frozen=True)
class PromptOptions:
    num_frames: int
    height: int
    width: int
    fps: float
    use_system_prompt: bool = True
    add_resolution_template: bool = True
    add_duration_template: bool = True
    json_captions: bool = True  # treat JSON-object prompts as structured captions

    @property
    def is_image(self) -> bool:
        return self.num_frames == 1

    @property
    def system_prompt(self) -> str | None:
        if not self.use_system_prompt:
            return None
        return SYSTEM_PROMPT_IMAGE if self.is_image else SYSTEM_PROMPT_VIDEO


def append_sentence(base: str, sentence: str) -> str:
    """Join like the reference: trailing periods of `base` dropped, then '. ' (only periods are stripped)."""
    base = base.rstrip(".")
    return f"{base}. {sentence}" if base else sentence


def parse_caption(prompt: str) -> dict | None:
    """The prompt as a JSON object, or None when it is prose (including JSON that is not an object)."""
    try:
        value = json.loads(prompt)
    except RecursionError:
        raise InputError("the JSON caption is nested too deeply to read; flatten it (captions need a few levels)") from None
    except (json.JSONDecodeError, TypeError):
        stripped = prompt.lstrip()
        if stripped.startswith("{"):
            log.warning("prompt starts with '{' but is not valid JSON; using it as prose")
        return None
    return value if isinstance(value, dict) else None


def inject_caption_metadata(caption: dict, options: PromptOptions) -> dict:
    """Set the request's resolution (and, for video, duration and fps) on a structured caption."""
    caption = dict(caption)
    caption["resolution"] = {"H": int(options.height), "W": int(options.width)}
    if options.is_image:
        caption.pop("duration", None)
        caption.pop("fps", None)
    else:
        seconds = int(options.num_frames / options.fps) if options.fps > 0 else 0
        caption["duration"] = f"{seconds}s"
        caption["fps"] = float(options.fps)
    return caption


def prose_with_templates(text: str, options: PromptOptions, negated: bool) -> str:
    kind = "image" if options.is_image else "video"
    if not options.is_image and options.add_duration_template:
        template = DURATION_NEGATED if negated else DURATION
        seconds = options.num_frames / options.fps if options.fps else 0.0
        text = append_sentence(text, template.format(seconds=seconds, fps=options.fps))
    if options.add_resolution_template:
        template = RESOLUTION_NEGATED if negated else RESOLUTION
        text = append_sentence(text, template.format(kind=kind, height=options.height, width=options.width))
    return text


def positive_text(prompt: str, options: PromptOptions) -> str:
    caption = parse_caption(prompt) if options.json_captions else None
    if caption is not None:
        return json.dumps(inject_caption_metadata(caption, options))
    return prose_with_templates(prompt, options, negated=False)


def negative_text(prompt: str, options: PromptOptions) -> str:
    """The unconditional text: a JSON negative prompt is kept as given, prose gets the negated templates."""
    if options.json_captions and parse_caption(prompt) is not None:
        return prompt
    return prose_with_templates(prompt, options, negated=True)
