"""Prompt -> token ids with the checkpoint's own tokenizer.json and chat template.

The chat template (chat_template.jinja, or `chat_template` in tokenizer_config.json) is rendered in
Jinja's immutable sandbox, so a template can format text but cannot reach Python objects. The ids
end with [eos, <|vision_start|>], the cue for the model to start generating media. Nothing is padded
or truncated unless `max_length` asks for it.
"""

import json
import logging
from datetime import datetime
from pathlib import Path

from .errors import CheckpointError, InputError

log = logging.getLogger(__name__)

VISION_START = "<|vision_start|>"


def _token_text(value) -> str | None:
    """tokenizer_config.json writes special tokens as strings or as {"content": ...} objects."""
    return value.get("content") if isinstance(value, dict) else value


class PromptTokenizer:
    def __init__(self, folder: Path):
        from tokenizers import Tokenizer

        self.folder = folder
        try:
            self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # the tokenizers library raises a bare Exception on bad files
            raise CheckpointError(f"{folder / 'tokenizer.json'} cannot be read ({exc}); download it again") from exc
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        self.special_tokens = {
            name: _token_text(config.get(name)) for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        }
        self.eos_id = self._id(self.special_tokens["eos_token"], "eos_token in tokenizer_config.json")
        self.vision_start_id = self._id(VISION_START, f"the {VISION_START} token")
        self.template = load_chat_template(folder, config)

    def _id(self, token: str | None, what: str) -> int:
        token_id = self.tokenizer.token_to_id(token) if token else None
        if token_id is None:
            raise CheckpointError(f"{self.folder}: {what} ({token!r}) is not in tokenizer.json")
        return token_id

    def render(self, text: str, system_prompt: str | None) -> str:
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": text}
        ]
        return self.template.render(
            messages=messages, add_generation_prompt=True, add_vision_id=False, **self.special_tokens
        )

    def encode(self, text: str, system_prompt: str | None, max_length: int | None = None) -> list[int]:
        """Token ids of one conversation turn, followed by [eos, <|vision_start|>]."""
        ids = self.tokenizer.encode(self.render(text, system_prompt), add_special_tokens=False).ids
        if max_length is not None and len(ids) + 2 > max_length:
            log.warning("prompt has %d tokens; cutting it to max_sequence_length %d", len(ids) + 2, max_length)
            ids = ids[: max(max_length - 2, 0)]
        return ids + [self.eos_id, self.vision_start_id]


def load_chat_template(folder: Path, config: dict):
    """The folder's chat template (chat_template.jinja, chat_template.json, or `chat_template` in
    tokenizer_config.json `config`), compiled in Jinja's immutable sandbox."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    path, processor_file = folder / "chat_template.jinja", folder / "chat_template.json"
    if path.is_file():
        source = path.read_text(encoding="utf-8")
    elif processor_file.is_file():
        source = json.loads(processor_file.read_text(encoding="utf-8")).get("chat_template")
    else:
        source = config.get("chat_template")
    if isinstance(source, list):  # named templates: [{"name": "default", "template": ...}, ...]
        source = next((t["template"] for t in source if t.get("name") == "default"), None)
    if not source:
        raise CheckpointError(f"{folder} has no chat template (chat_template.jinja or tokenizer_config.json)")

    def raise_exception(message):
        raise InputError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    return env.from_string(source)
