"""Prompt helpers: the prompt widgets both text-encode nodes share, and a structured (JSON) caption builder."""

import json

from ..cosmos3_runtime import InputError
from ..cosmos3_runtime.request import TRI_STATE, help_of


def prompt_inputs(filled_from: str) -> dict:
    """The prompt widgets of both text-encode nodes: the prompts and how their metadata is applied."""
    return {
        "prompt": ("STRING", {"multiline": True, "dynamicPrompts": False,
                   "tooltip": "prose, or a JSON object (a structured caption: resolution, duration and fps are filled "
                              f"in from {filled_from})"}),
        "negative_prompt": ("STRING", {"multiline": True, "dynamicPrompts": False, "default": "",
                            "tooltip": help_of("negative_prompt")}),
        "system_prompt": (list(TRI_STATE), {"default": "auto", "tooltip": help_of("use_system_prompt")}),
        "resolution_template": ("BOOLEAN", {"default": True, "tooltip": help_of("add_resolution_template")}),
        "duration_template": ("BOOLEAN", {"default": True, "tooltip": help_of("add_duration_template")}),
        "json_captions": ("BOOLEAN", {"default": True, "tooltip": help_of("json_captions")}),
    }


def prompt_options(system_prompt, resolution_template, duration_template, json_captions) -> dict:
    """Those widgets as Request fields."""
    return {"use_system_prompt": TRI_STATE[system_prompt], "add_resolution_template": resolution_template,
            "add_duration_template": duration_template, "json_captions": json_captions}


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
