"""The Reasoner: images, videos and text in, text out, on the generator's own text tower.

    pipe = cosmos3_runtime.load("path/to/Cosmos3-Nano")            # or parts="reasoner"
    answer = pipe.reason("What is on the table?", images=[picture])
    print(answer.text)

A Cosmos3 checkpoint's language model is the generator's text tower: the same tensors serve both.
What only the Reasoner needs (the output head, the final norm, the last layer's query side and MLP,
the vision tower) is read from the checkpoint when it is first asked a question.
"""

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import budget
from ..checkpoint import Checkpoint, Variant
from ..errors import CheckpointError, InputError
from ..offload import TextOffload
from ..request import Request
from ..settings import resolve as resolve_settings
from ..tokenizer import PromptTokenizer
from ..transformer import Cosmos3Transformer, linear_layers, tower_of
from ..weights import folder_format, precision
from ..weights.files import load_weights
from ..weights.format import WeightFormat, expanded_bytes, expanded_once, expanding_linears
from . import chat, processing, upsample
from .chat import IMAGE, VIDEO, Prompt
from .config import EDGE, OMNI, ProcessorConfig, ReasonerConfig, read_config, read_processor
from .decoding import Detokenizer, Sampling, next_token
from .language import KVCache, LanguageModel, ReasonerHead, head_key_mapper
from .processing import VisionInput, check_video_frames, prepare_image, prepare_video, sample_indices
from .upsample import Upsampled
from .vision_edge import EdgeVisionTower
from .vision_qwen import QwenVisionTower

DEFAULT_MAX_NEW_TOKENS = 1024
MAX_NEW_TOKENS = 32768
DEFAULT_MAX_PROMPT_TOKENS = 32768
STATIC_ROWS = 256  # a compiled decode step's cache length is a multiple of this
DEFAULT_VIDEO_FPS = 24.0  # a clip's rate when nobody says (as the reference processors assume)
ADVICE = ("ask with fewer or smaller images, a shorter clip or a lower sample_fps, fewer max_new_tokens, or "
          "check_memory=False to skip this check")

# (new tokens so far, max_new_tokens, the answer's text so far); raise from it to stop
AnswerCallback = Callable[[int, int, str], None]


@dataclass
class Answer:
    text: str  # the answer (after the thinking block when thinking was asked for)
    thinking: str | None  # the thinking block's text (thinking=True), else None
    token_ids: list[int]  # the generated ids, the end token that stopped them included
    prompt_ids: list[int]
    finish_reason: str  # "stop" (an end token) or "length" (max_new_tokens)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    logits: list[torch.Tensor] | None = field(default=None, repr=False)  # fp32 [V] per step (keep_logits=True)


@dataclass(frozen=True)
class Clip:
    """A video for the Reasoner: frames at `fps`, looked at `sample_fps` frames per second (None: the checkpoint's
    video processor setting, video_preprocessor_config.json's `fps`, as transformers and vLLM sample by default)."""

    frames: object  # PIL images, uint8 [T, H, W, 3], or floats in 0..1
    fps: float = DEFAULT_VIDEO_FPS
    sample_fps: float | None = None
    indices: list[int] | None = None  # frames already sampled: their indices in the source clip


def read_clip(source, sample_fps: float | None, root) -> Clip:
    """A video file (a path, or bytes received in memory) for checkpoint `root`'s Reasoner, decoding only the frames
    it samples when the container says how many it has (`sample_fps` None: the checkpoint's processor setting)."""
    from ..media import MAX_FRAME_PIXELS, read_video, video_header

    if sample_fps is not None and not sample_fps > 0:
        raise InputError(f"the video's sample fps must be positive, got {sample_fps}")
    total, rate = video_header(source)
    rate = rate or DEFAULT_VIDEO_FPS
    if not total:
        clip = Clip(read_video(source, max_pixels=MAX_FRAME_PIXELS), rate, sample_fps)
        check_clip(clip, root)
        return clip
    processor = video_processor(root)
    indices = sample_indices(total, rate, sample_fps or processor.fps, processor)
    check_video_frames(len(indices), processor)
    frames = read_video(source, max_pixels=MAX_FRAME_PIXELS, keep=set(indices))
    if len(frames) != len(indices):
        raise InputError(f"the video has fewer frames than its header says ({total}); re-encode it")
    return Clip(frames, rate, sample_fps, indices)


def video_processor(root) -> ProcessorConfig:
    family = EDGE if Checkpoint(root).transformer_config().is_dense else OMNI
    return read_processor(Path(root), family, "video")


def check_clip(clip: Clip, root) -> None:
    """Refuse a clip too short for checkpoint `root`'s video processor once sampled, from the config files alone
    (before the Reasoner's weights are read)."""
    p = video_processor(root)
    sampled = len(clip.indices) if clip.indices is not None else len(
        sample_indices(len(clip.frames), clip.fps, clip.sample_fps or p.fps, p))
    check_video_frames(sampled, p)


def check_max_new_tokens(value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_NEW_TOKENS:
        raise InputError(f"max_new_tokens must be a whole number in 1..{MAX_NEW_TOKENS}, got {value!r}")


def image_list(images) -> list:
    """`images` as a list: None, one picture, a list of pictures, or an array / tensor batch [N, H, W, 3]."""
    if images is None:
        return []
    if isinstance(images, (list, tuple)):
        return list(images)
    if getattr(images, "ndim", 0) == 4:
        return list(images)
    return [images]


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
MAX_STOP_STRINGS = 4


def _without_partial(text: str, markers) -> str:
    """`text` less a tail that could be the start of one of `markers` (still being written)."""
    longest = max((k for m in markers for k in range(1, min(len(m) - 1, len(text)) + 1) if text.endswith(m[:k])),
                  default=0)
    return text[: len(text) - longest]


def split_thinking(text: str, final: bool = True) -> tuple[str, str]:
    """(thinking, answer) of a reply that was asked to think; an unfinished block is all thinking. With
    `final=False` (a reply still being written) a tag not yet complete is held back, so each call's parts extend
    the previous call's."""
    head, closed, tail = text.partition(THINK_CLOSE)
    if not closed and not final:
        head = _without_partial(head, [THINK_CLOSE])
        if THINK_OPEN.startswith(head.strip()):
            return "", ""
    return head.strip().removeprefix(THINK_OPEN).strip(), tail.strip()


def check_stop(stop) -> tuple[str, ...]:
    stop = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stop) > MAX_STOP_STRINGS or not all(isinstance(s, str) and s for s in stop):
        raise InputError(f"stop must be up to {MAX_STOP_STRINGS} non-empty strings, got {stop!r}")
    return stop


class Reasoner:
    def __init__(self, config: ReasonerConfig, tokenizer: PromptTokenizer, tower: Cosmos3Transformer,
                 head: ReasonerHead, vision, processors: dict, device: torch.device, variant: Variant):
        self.config, self.variant = config, variant
        self.tokenizer = tokenizer
        self.language = LanguageModel(tower, head)
        self.head = head
        self.vision = vision  # None: text only
        self.processors = processors  # {"image": ProcessorConfig, "video": ProcessorConfig}
        self.device = device
        self.parts = torch.nn.ModuleList([m for m in (head, vision) if m is not None])  # what a host manages
        added = tokenizer.tokenizer.get_added_tokens_decoder().values()
        self.special_texts = tuple(t.content for t in added if t.special)  # never accepted inside user text
        self.end_ids = {tokenizer.eos_id, *config.end_token_ids}
        self.compiled_step = None  # made on the first answer with compile=True
        self.text_offload: TextOffload | None = None  # the text tower kept elsewhere between answers (shared)

    @classmethod
    def load(cls, checkpoint: Checkpoint, tower: Cosmos3Transformer, device: torch.device, dtype: torch.dtype,
             linear_class: type | None = None, weights: WeightFormat | None = None) -> "Reasoner":
        """Read what the Reasoner adds to `tower` (the loaded text tower) from `checkpoint`, its head in the format of
        the transformer folder's safetensors (`weights`: `folder_format`'s unless given)."""
        tc = tower.config
        family = EDGE if tc.is_dense else OMNI
        config = read_config(checkpoint.root, family, tc.hidden_size, tc.num_hidden_layers)
        root_tokenizer = (checkpoint.root / "tokenizer.json").is_file()
        tokenizer = PromptTokenizer(checkpoint.root if root_tokenizer else checkpoint.tokenizer_dir())
        rename = head_key_mapper(tc)
        try:
            weights = weights or folder_format(checkpoint)
            with torch.device("meta"), linear_layers(linear_class):
                head = ReasonerHead(tc)
                weights.build(head, rename, lambda name: "text")  # (the text pathway's precision)
            weights.read(head, dtype, device, rename)
        except CheckpointError as exc:
            raise CheckpointError(f"the Reasoner's output head and last text layer could not be read from "
                                  f"{checkpoint.path('transformer')} ({exc}); a GGUF transformer file does not hold "
                                  "them: keep the checkpoint's safetensors shards in transformer/ beside it") from None
        vision = None
        if config.vision is not None:
            with torch.device("meta"), linear_layers(linear_class):
                vision = (QwenVisionTower if family == OMNI else EdgeVisionTower)(config.vision)
            prefix = "model.visual." if family == OMNI else "model."
            load_weights(vision, checkpoint.root, dtype, device, rename=lambda key: key.removeprefix(prefix),
                         files=list(config.vision_weights))
        processors = {kind: read_processor(checkpoint.root, family, kind) for kind in ("image", "video")}
        return cls(config, tokenizer, tower, head, vision, processors, device, checkpoint.variant)

    def to(self, device: torch.device) -> None:
        self.parts.to(device)
        self.device = torch.device(device)

    def reason(
        self,
        question: str,
        *,
        images=None,
        video=None,
        video_fps: float | None = None,
        sample_fps: float | None = None,
        system_prompt: str | None = None,
        **options,
    ) -> Answer:
        """Answer a question about `images` (a list of PIL images or uint8 [H, W, 3] arrays) and/or a `video`
        (PIL images, uint8 [T, H, W, 3] or floats in 0..1 at `video_fps`, default 24, looked at `sample_fps`
        frames per second, default the checkpoint's video processor setting (NVIDIA recommends 4); or a
        `reasoner.Clip`), or a text-only question.

        `options`: max_new_tokens (default 1024), temperature / top_p / top_k / presence_penalty (unset: NVIDIA's
        recommendation, 0.7 / 0.8 / 20 / 1.5, or 0.6 / 0.95 / 20 / 0 with thinking; temperature=0 is greedy),
        seed, thinking (the reply's reasoning comes back separately as `answer.thinking`), callback(new tokens,
        max_new_tokens, text so far) after every token (raise from it to stop), max_prompt_tokens, check_memory,
        stop (strings that end the answer), compile (decode with a torch.compile'd fixed-shape step).
        """
        if not isinstance(question, str) or not question.strip():
            raise InputError("no question: pass the question as a non-empty string")
        images = image_list(images)
        if video is None or isinstance(video, Clip):
            videos = [] if video is None else [video]
        else:
            videos = [Clip(video, video_fps or DEFAULT_VIDEO_FPS, sample_fps)]
        messages = chat.question_messages(question, system_prompt, len(images), bool(videos))
        return self.chat(messages, images, videos, **options)

    def upsample_prompt(self, prompt: str, *, image=None, video=None, width: int | None = None,
                        height: int | None = None, num_frames: int | None = None, fps: float | None = None,
                        **options) -> Upsampled:
        """Turn a short prompt (and optionally the starting image of an image-to-video request, or the clip a
        video-to-video request continues) into the JSON caption the generator was trained on, with the model
        authors' upsampling templates where the user has their framework (`reasoner.templates`), else the pack's
        own. A clip is described from its last frame, where the continuation starts (the templates take one
        starting image). width, height, num_frames and fps are the generation's
        (unset: the variant's defaults; num_frames=1 asks for an image caption). `options` as for `reason`;
        greedy by default (temperature=0), max_new_tokens 4096."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise InputError("no prompt to upsample: pass a non-empty string")
        if image is not None and video is not None:
            raise InputError("upsample with a starting image or a clip to continue, not both")
        if self.variant.causal is not None:
            raise InputError("prompt upsampling writes the JSON captions Cosmos3's bidirectional checkpoints read; a "
                             "causal Sim-Transfer checkpoint reads its caption as given: write it directly")
        if video is not None:
            image = processing.uint8_frames(video, "video")[-1].permute(1, 2, 0)
        s = resolve_settings(self.variant, Request.build(width=width, height=height, num_frames=num_frames, fps=fps))
        task = upsample.task_for(s.num_frames, image is not None)
        chosen = upsample.templates()  # the authors' where the user has them, else the pack's own
        messages = upsample.messages_for(task, prompt, s.width, s.height, s.num_frames, s.fps, chosen)
        options.setdefault("temperature", 0.0)
        options.setdefault("max_new_tokens", upsample.DEFAULT_MAX_NEW_TOKENS)
        answer = self.chat(messages, [] if image is None else [image], **options)
        upsampled = upsample.caption_from_reply(answer.text, prompt, task, s.num_frames, s.fps)
        upsampled.templates = chosen.source
        return upsampled

    @torch.inference_mode()
    def chat(self, messages: list[dict], images=(), videos=(), *, temperature=None, top_p=None, top_k=None,
             presence_penalty=None, thinking: bool = False, **options) -> Answer:
        """Answer the last user turn of a conversation: turns {"role", "content"}, content a string or parts
        ({"type": "text", "text": ...}, {"type": "image"}, {"type": "video"}) that take `images` and `videos`
        (`reasoner.Clip`s) in order. Options as for `reason`."""
        sampling = Sampling.resolve(thinking, temperature, top_p, top_k, presence_penalty)
        offload = self.text_offload
        on_device = offload.on(self.device) if offload is not None else nullcontext()
        with on_device, precision.for_text(self.variant.precision):
            return self.answer(messages, images, videos, sampling=sampling, thinking=thinking, **options)

    def _media(self, images, videos) -> list[VisionInput]:
        if (images or videos) and self.vision is None:
            raise InputError(f"this checkpoint cannot look at images or videos: {self.config.why_no_vision}; ask a "
                             "text-only question, or download the checkpoint's vision_encoder/ and root files")
        family = self.config.family
        media = [prepare_image(image, family, self.processors["image"]) for image in images]
        for clip in videos:
            clip = clip if isinstance(clip, Clip) else Clip(clip)
            media.append(prepare_video(clip.frames, clip.fps, clip.sample_fps, family, self.processors["video"],
                                       clip.indices))
        return media

    def prepare(self, messages: list[dict], images=(), videos=(), thinking: bool = False,
                max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS) -> tuple[Prompt, list[VisionInput]]:
        """The prompt (ids, types, positions) and the pre-processed media of a conversation; too long is refused."""
        chat.check_messages(messages, self.special_texts)
        if not any(m["role"] == "user" for m in messages):
            raise InputError("the conversation has no user turn; ask a question")
        media = self._media(list(images), list(videos))
        if thinking:
            messages = chat.with_thinking(messages, self.config.family)
        prompt = chat.encode(self.tokenizer, self.config, messages, media, thinking)
        if len(prompt.ids) > max_prompt_tokens:
            seen = sum(m.tokens for m in media)
            raise InputError(f"the prompt is {len(prompt.ids)} tokens ({seen} of them for the images and video), over "
                             f"max_prompt_tokens {max_prompt_tokens}; lower the video's sample_fps, shorten the clip or "
                             "the question, use smaller images, or raise max_prompt_tokens")
        return prompt, media

    def memory_estimate(self, prompt_tokens: int, max_new_tokens: int, media: list[VisionInput],
                        dtype: torch.dtype) -> budget.Estimate:
        c = self.language.config
        b = torch.finfo(dtype).bits // 8
        total = prompt_tokens + max_new_tokens
        parts = {"K/V cache": 2 * c.num_hidden_layers * total * c.num_key_value_heads * c.head_dim * b,
                 "prefill": prompt_tokens * (6 * c.hidden_size + 3 * c.intermediate_size) * b + c.vocab_size * 8}
        if media and self.vision is not None:
            v = self.config.vision
            patches = sum(m.pixels.shape[0] for m in media)
            pixels = patches * media[0].pixels.shape[1] * 4  # the fp32 patch vectors
            parts["vision"] = patches * (8 * v.hidden_size + 2 * v.intermediate_size) * b + pixels
        return budget.Estimate(parts)

    @torch.inference_mode()
    def answer(self, messages: list[dict], images=(), videos=(), *, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
               sampling: Sampling | None = None, seed: int = 0, thinking: bool = False,
               callback: AnswerCallback | None = None, max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
               check_memory: bool = True, keep_logits: bool = False, stop=(), compile: bool = False) -> Answer:
        """Answer the last user turn of `messages` (see `Cosmos3Pipeline.reason` for the arguments). `stop`: up to
        four strings that end the answer where one first appears (it is cut before it). `compile`: decode with the
        fixed-shape step compiled by torch.compile (the first answer pays the compile)."""
        check_max_new_tokens(max_new_tokens)
        stop = check_stop(stop)
        sampling = sampling or Sampling.resolve(thinking)
        prompt, media = self.prepare(messages, images, videos, thinking, max_prompt_tokens)
        dtype = self.head.norm.weight.dtype
        needed = self.memory_estimate(len(prompt.ids), max_new_tokens, media, dtype)
        expanded = self._expanded_tower(needed, dtype)
        if check_memory:
            budget.check(needed, self.device, ADVICE)
        with expanded_once(expanded, dtype, self.device):
            return self._answer(prompt, media, max_new_tokens, sampling, seed, thinking, callback, keep_logits, stop,
                                compile)

    def _expanded_tower(self, needed: budget.Estimate, dtype: torch.dtype) -> list:
        """The quantized layers of the text tower and the head (GGUF, NVFP4) to expand once for this answer: all of
        them when their expanded size fits beside the answer's other needs (each token would otherwise dequantize the
        whole tower again, about the tower's bf16 size in memory traffic per token), else none (dequantized per token,
        in bounded slices). Layers that run their format's own arithmetic now (NVFP4's FP4 matmuls) never expand."""
        layers = [m for m in expanding_linears(self.language.tower, lambda name: tower_of(name) == "text tower") +
                  expanding_linears(self.head) if not m.runs_natively(self.device)]
        extra = expanded_bytes(layers, dtype)
        available = budget.available_bytes(self.device)
        if not layers or (available is not None and needed.total + extra > available):
            return []
        needed.parts["quantized text tower expanded"] = extra
        return layers

    def _answer(self, prompt, media, max_new_tokens, sampling, seed, thinking, callback, keep_logits, stop,
                compile) -> Answer:
        started = time.perf_counter()
        ids = torch.tensor(prompt.ids, dtype=torch.long)
        x = self.language.embed(ids, self.device)
        deepstack = self._insert_media(x, prompt, media)
        rows = len(prompt.ids) + max_new_tokens
        if compile:  # cache lengths in steps of STATIC_ROWS: answers of similar length reuse one compiled step
            rows = -(-rows // STATIC_ROWS) * STATIC_ROWS
        cache = KVCache(self.language.config, rows, x.dtype, self.device)
        logits = self.language.forward(x, prompt.positions, cache, deepstack)
        prefill = time.perf_counter() - started

        step = self._compiled_step() if compile else None
        generator = torch.Generator("cpu").manual_seed(int(seed))
        seen = torch.zeros(logits.numel(), dtype=torch.bool, device=logits.device)
        generated, kept = [], []
        shown = Detokenizer(self.decode) if callback is not None or stop else None
        longest_stop = max(map(len, stop), default=0)
        decode_started = time.perf_counter()
        while True:
            if keep_logits:
                kept.append(logits.cpu())
            token = next_token(logits, sampling, generator, seen)
            generated.append(token)
            seen[token] = True
            finish = "stop" if token in self.end_ids else "length" if len(generated) == max_new_tokens else None
            if shown is not None:
                before = len(shown.text)
                text = shown.add(token)
                if finish:  # with a trailing partial character, as decoding every id at once gives it
                    text = shown.final()
                window = max(0, before - longest_stop)  # a stop string ends in the new text, or it was found before
                cut = min((text.find(s, window) for s in stop if s in text[window:]), default=-1)
                if cut >= 0:
                    text, finish = text[:cut], "stop"
                if callback is not None:  # mid-answer, a stop string still forming is held back
                    callback(len(generated), max_new_tokens, text if finish else _without_partial(text, stop))
            if finish:
                break
            position = torch.full((3, 1), cache.length + prompt.delta, dtype=torch.long)
            x = self.language.embed(torch.tensor([token]), self.device)
            if step is None:
                logits = self.language.forward(x, position, cache)
            else:
                row = torch.tensor([cache.length], device=self.device)
                logits = step(x, position.to(self.device), row, cache.keys, cache.values).clone()
                cache.length += 1
        decode = time.perf_counter() - decode_started

        text = text if stop else self.decode(generated)
        reasoning = None
        if thinking:
            reasoning, text = split_thinking(text)
        return Answer(text, reasoning, generated, prompt.ids, finish, prefill, decode, kept if keep_logits else None)

    def _compiled_step(self):
        """`LanguageModel.decode_step` compiled once per Reasoner (CUDA graphs on a GPU), recompiled only for a new
        cache length bucket."""
        if self.compiled_step is None:
            mode = "reduce-overhead" if self.device.type == "cuda" else None
            self.compiled_step = torch.compile(self.language.decode_step, fullgraph=True, dynamic=False, mode=mode)
        return self.compiled_step

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.tokenizer.decode([i for i in ids if i not in self.end_ids], skip_special_tokens=True)

    def _insert_media(self, x: torch.Tensor, prompt: Prompt, media: list[VisionInput]):
        """Write the vision tokens into their pad rows of x [L, H]; the deepstack (mask, features) or None."""
        if not media:
            return None
        mask = torch.zeros(len(prompt.ids), dtype=torch.bool)
        levels = None
        for kind, name in ((IMAGE, "image"), (VIDEO, "video")):
            items = [m for m in media if m.kind == name]
            if not items:
                continue
            pixels = torch.cat([m.pixels for m in items]).to(self.device, self.vision.dtype)
            tokens, deepstack = self.vision(pixels, [m.grid for m in items])
            rows = prompt.types == kind
            x[rows.to(x.device)] = tokens.to(x.dtype)
            mask |= rows
            if deepstack:
                joint = levels or [torch.zeros(len(prompt.ids), f.shape[-1], dtype=f.dtype, device=f.device) for f in deepstack]
                for level, features in zip(joint, deepstack):
                    level[rows.to(level.device)] = features
                levels = joint
        if levels is None:
            return None
        mask = mask.to(x.device)
        return mask, [level[mask] for level in levels]
