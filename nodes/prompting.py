"""Prompt helpers: a structured (JSON) caption builder."""

import json

from ..cosmos3_runtime import InputError


class Cosmos3JSONCaption:
    DESCRIPTION = ("Builds a structured JSON caption, the prompt format Cosmos3 is trained on (Edge in particular "
                   "prefers it to plain text). The sampler fills in resolution, duration and fps.")
    CATEGORY = "cosmos3/prompt"
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("prompt",)
    FUNCTION = "build"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "temporal_caption": ("STRING", {"multiline": True, "dynamicPrompts": False,
                                     "tooltip": "what happens, in order"}),
            },
            "optional": {
                "subjects": ("STRING", {"default": "", "tooltip": "comma-separated list of the main subjects"}),
                "extra_json": ("STRING", {"multiline": True, "default": "{}", "dynamicPrompts": False,
                               "tooltip": "more caption fields as a JSON object, merged in"}),
            },
        }

    def build(self, temporal_caption, subjects="", extra_json="{}"):
        try:
            extra = json.loads(extra_json or "{}")
        except json.JSONDecodeError as exc:
            raise InputError(f"extra_json is not valid JSON: {exc}") from exc
        if not isinstance(extra, dict):
            raise InputError("extra_json must be a JSON object ({...})")
        caption = {"temporal_caption": temporal_caption.strip()}
        names = [s.strip() for s in subjects.split(",") if s.strip()]
        if names:
            caption["subjects"] = names
        caption.update(extra)
        return (json.dumps(caption, ensure_ascii=False),)
