"""Prompt upsampling: a short prompt (and optionally a starting image) -> the generator's JSON caption.

The Reasoner is asked with an upsampling template per task (text-to-video, text-to-image, image-to-video): the
model authors' own V4.2 templates when the user has their framework, else the pack's own (`templates`). The reply is
a fenced JSON object; any thinking block before it is dropped, the fence removed, and for a video the
duration set to the request's whole seconds as the authors' pipeline does. The caption goes into the
Text Encode nodes or `generate` unchanged (they set resolution, duration and fps again anyway).
"""

import json
import logging
import math
import re
from dataclasses import dataclass

from ..errors import InputError
from .templates import TASKS, Templates, templates

log = logging.getLogger(__name__)
DEFAULT_MAX_NEW_TOKENS = 4096  # the authors' captions run to 1.6k-2.9k tokens
THINKING_BLOCK = re.compile(r"<(think|thought|thinking|reasoning|scratch|reflection)>.*?</\1>", re.S | re.I)


@dataclass
class Upsampled:
    caption: str  # the JSON caption, or the prompt unchanged when the reply was no JSON object
    reply: str  # what the Reasoner wrote
    parsed: bool  # whether the reply held a JSON object
    templates: str = ""  # which templates asked (the pack's own, or the authors' from a file)


def task_for(num_frames: int, image: bool) -> str:
    if image:
        return "i2v"
    return "t2i" if num_frames == 1 else "t2v"


def user_text(task: str, description: str, width: int, height: int, num_frames: int, fps: float,
              chosen: Templates | None = None) -> str:
    """The template for `task` (from `chosen`, default: `templates()`) with the request's values filled in."""
    if task not in TASKS:
        raise InputError(f"upsampling task must be one of {', '.join(TASKS)}, got {task!r}")
    divisor = math.gcd(int(width), int(height)) or 1
    values = {"{description}": description, "{aspect_ratio}": f"{width // divisor},{height // divisor}",
              "{resolution_w}": str(int(width)), "{resolution_h}": str(int(height))}
    if task != "t2i":
        seconds = duration_seconds(num_frames, fps)
        values.update({"{duration}": f"{seconds // 60}:{seconds % 60:02d}", "{fps}": f"{fps:g}"})
    text = (chosen or templates())[task]
    for placeholder, value in values.items():
        text = text.replace(placeholder, value)
    return text


def duration_seconds(num_frames: int, fps: float) -> int:
    return int(num_frames / fps) if fps > 0 else 0


def messages_for(task: str, description: str, width: int, height: int, num_frames: int, fps: float,
                 chosen: Templates) -> list[dict]:
    user = ([{"type": "image"}] if task == "i2v" else []) + [
        {"type": "text", "text": user_text(task, description, width, height, num_frames, fps, chosen)}]
    return [{"role": "system", "content": chosen.system}, {"role": "user", "content": user}]


def caption_from_reply(reply: str, prompt: str, task: str, num_frames: int, fps: float) -> Upsampled:
    """The JSON caption in a reply (thinking dropped, fence removed); the prompt itself when there is none."""
    text = THINKING_BLOCK.sub("", reply)
    if "```json" in text:
        text = text.split("```json", 1)[1].split("```", 1)[0]
    try:
        caption = json.loads(text)
    except json.JSONDecodeError:
        caption = None
    if not isinstance(caption, dict):
        log.warning("the Reasoner's reply holds no JSON caption; the prompt is used as given")
        return Upsampled(prompt, reply, False)
    if task != "t2i":
        caption["duration"] = f"{duration_seconds(num_frames, fps)}s"
    return Upsampled(json.dumps(caption, ensure_ascii=False), reply, True)
