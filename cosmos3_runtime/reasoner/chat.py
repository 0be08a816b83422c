"""A conversation -> the Reasoner's prompt ids, their media token types and their 3-D positions.

The checkpoint's chat template renders the turns; media parts ({"type": "image"} / {"type": "video"})
become the template's placeholder, which is then expanded: an image into one pad token per merged
2x2 block, a video into one "<t seconds><|vision_start|>pads<|vision_end|>" span per temporal slice.
Nano/Super replace only the pad token, so the template's own start/end tokens stay around the spans
(what transformers 5.24 produces); Edge replaces the template's whole wrapper.

Positions are Qwen3-VL's: text on the diagonal, each image or video slice a (t, row, col) grid that
starts where the text stopped and advances the next position by max(rows, cols).
"""

import re
from dataclasses import dataclass

import torch

from ..errors import InputError
from ..tokenizer import PromptTokenizer
from .config import EDGE, ReasonerConfig
from .processing import VisionInput

# NVIDIA's prompt guide: Nano and Super reason step by step when the question ends with this.
THINKING_INSTRUCTION = (
    "Answer the question using the following format:\n\n<think>\nYour reasoning.\n</think>\n\n"
    "Write your final answer immediately after the </think> tag."
)
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
TEXT, IMAGE, VIDEO = 0, 1, 2
ROLES = ("system", "user", "assistant")


@dataclass
class Prompt:
    ids: list[int]
    types: torch.Tensor  # [L] 0 text, 1 image pad, 2 video pad
    positions: torch.Tensor  # [3, L] long
    delta: int  # position of the next token = its index + delta


def media_parts(images: int, video: bool) -> list[dict]:
    return [{"type": "image"}] * images + ([{"type": "video"}] if video else [])


def question_messages(question: str, system_prompt: str | None, images: int, video: bool) -> list[dict]:
    """One user turn: the media first, then the question (NVIDIA's recommended order)."""
    user = media_parts(images, video) + [{"type": "text", "text": question}]
    return ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [{"role": "user", "content": user}]


def with_thinking(messages: list[dict], family: str) -> list[dict]:
    """Nano and Super think when the last user turn asks for the format (Edge's template opens the block itself)."""
    if family == EDGE:
        return messages
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    content = messages[last]["content"]
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    texts = [i for i, part in enumerate(parts) if part["type"] == "text"]
    if texts:
        i = texts[-1]
        parts[i] = {"type": "text", "text": f"{parts[i]['text'].rstrip()}\n\n{THINKING_INSTRUCTION}"}
    else:
        parts.append({"type": "text", "text": THINKING_INSTRUCTION})
    return messages[:last] + [{**messages[last], "content": parts}] + messages[last + 1 :]


def check_messages(messages: list[dict], specials: tuple[str, ...]) -> None:
    """Turns must be role/content pairs; user text must not smuggle in the tokenizer's media tokens."""
    if not isinstance(messages, list) or not messages:
        raise InputError("messages must be a non-empty list of {'role', 'content'} turns")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise InputError(f"messages[{i}] needs a role of {', '.join(ROLES)}")
        content = message.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(parts, list):
            raise InputError(f"messages[{i}].content must be a string or a list of parts")
        for part in parts:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("text", "image", "video"):
                raise InputError(f"messages[{i}] has a part of type {kind!r}; use text, image or video")
            text = part.get("text", "") if kind == "text" else ""
            if not isinstance(text, str):
                raise InputError(f"messages[{i}] has a text part that is not a string")
            for token in specials:
                if token in text:
                    raise InputError(f"messages[{i}] contains the special token {token}; remove it from the text")


def render(tokenizer: PromptTokenizer, messages: list[dict], family: str, thinking: bool) -> str:
    """The chat template's text. Turns of text alone are passed as strings, which every template takes (the
    generator's text-only template too, for checkpoints without the Reasoner's root files)."""
    messages = [{**m, "content": _flat(m["content"])} for m in messages]
    options = {"enable_thinking": thinking} if family == EDGE else {}
    return tokenizer.template.render(messages=messages, add_generation_prompt=True, **tokenizer.special_tokens,
                                     **options)


def _flat(content):
    if isinstance(content, list) and all(part["type"] == "text" for part in content):
        return "".join(part["text"] for part in content)
    return content


def expand(text: str, media: list[VisionInput], family: str) -> str:
    """Replace each media placeholder, in order, with the tokens standing for that image or video."""
    images = iter([m for m in media if m.kind == "image"])
    videos = iter([m for m in media if m.kind == "video"])
    video_pattern = re.escape(VIDEO_PAD)
    if family == EDGE:
        video_pattern = re.escape(VISION_START + VIDEO_PAD + VISION_END) + "|" + video_pattern
    counts = {"image": 0, "video": 0}

    def replace(match: re.Match) -> str:
        kind = match.lastgroup
        counts[kind] += 1
        item = next(images if kind == "image" else videos, None)
        if item is None:
            return ""
        if kind == "image":
            return IMAGE_PAD * item.tokens
        per_slice = item.tokens // item.grid[0]
        return "".join(f"<{t:.1f} seconds>{VISION_START}{VIDEO_PAD * per_slice}{VISION_END}" for t in item.timestamps)

    expanded = re.sub(f"(?P<image>{re.escape(IMAGE_PAD)})|(?P<video>{video_pattern})", replace, text)
    given = {"image": sum(m.kind == "image" for m in media), "video": sum(m.kind == "video" for m in media)}
    if counts != given:
        raise InputError(f"the conversation has {counts['image']} image and {counts['video']} video parts but "
                         f"{given['image']} images and {given['video']} videos were given")
    return expanded


def encode(tokenizer: PromptTokenizer, config: ReasonerConfig, messages: list[dict], media: list[VisionInput],
           thinking: bool) -> Prompt:
    text = expand(render(tokenizer, messages, config.family, thinking), media, config.family)
    bos = tokenizer.special_tokens.get("bos_token")
    ids = tokenizer.tokenizer.encode(text, add_special_tokens=not (bos and text.startswith(bos))).ids
    types = torch.zeros(len(ids), dtype=torch.long)
    if media:
        tensor = torch.tensor(ids)
        types[tensor == config.image_token_id] = IMAGE
        types[tensor == config.video_token_id] = VIDEO
    positions, delta = rope_positions(types, media, config.merge if media else 1)
    return Prompt(ids, types, positions, delta)


def rope_positions(types: torch.Tensor, media: list[VisionInput], merge: int) -> tuple[torch.Tensor, int]:
    """[3, L] positions and the decode offset. Each video slice is its own (1, h, w) grid."""
    grids = {IMAGE: [], VIDEO: []}
    for item in media:
        t, h, w = item.grid
        grids[IMAGE if item.kind == "image" else VIDEO] += [(1, h, w)] * (1 if item.kind == "image" else t)
    grids = {kind: iter(items) for kind, items in grids.items()}
    chunks, cursor, start = [], 0, 0
    boundaries = (torch.nonzero(types[1:] != types[:-1]).flatten() + 1).tolist() + [len(types)]
    for end in boundaries:
        kind = int(types[start])
        if kind == TEXT:
            chunks.append(torch.arange(cursor, cursor + end - start).expand(3, -1))
            cursor += end - start
        else:
            while start < end:  # a run of pads may hold several grids (consecutive slices without text between)
                _, h, w = next(grids[kind])
                rows, cols = h // merge, w // merge
                grid_t = torch.full((rows, cols), cursor)
                grid_h = torch.arange(rows).view(-1, 1).expand(rows, cols) + cursor
                grid_w = torch.arange(cols).view(1, -1).expand(rows, cols) + cursor
                chunks.append(torch.stack([grid_t, grid_h, grid_w]).reshape(3, -1))
                cursor += max(rows, cols)
                start += rows * cols
        start = end
    positions = torch.cat(chunks, dim=1) if chunks else torch.zeros(3, 0, dtype=torch.long)
    delta = int(positions.max()) + 1 - len(types) if len(types) else 0
    return positions, delta
