"""NVIDIA's guardrails in graphs: Cosmos3 Guardrail Loader, and what a node with a `guardrail` input (or any node, with
the server-wide setting on: `services.guardrails`) does with it: the prompt checked before any weights move, the
faces in the frames pixelated before they leave the node."""

from ..cosmos3_runtime.guardrails import load
from ..cosmos3_runtime.pipeline import prompt_list
from . import services

GUARDRAIL = "COSMOS3_GUARDRAIL"
GUARDRAIL_INPUT = {"guardrail": (GUARDRAIL, {"tooltip": "Cosmos3 Guardrail Loader: the prompt is checked before any "
                                             "weights move (a blocked prompt stops the run)"})}


class Cosmos3GuardrailLoader:
    DESCRIPTION = ("NVIDIA's guardrails (the optional cosmos-guardrail package): a keyword blocklist and the Qwen3Guard "
                   "classifier check prompts, RetinaFace pixelates faces in decoded frames. Connect it to a sampler "
                   "(the prompt is checked before any weights move) and to Cosmos3 VAE Decode (faces pixelated).")
    CATEGORY = "cosmos3"
    RETURN_TYPES = (GUARDRAIL,)
    RETURN_NAMES = ("guardrail",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "device": (["cpu", "default"], {"default": "cpu", "tooltip": "where its models run while they check: cpu, "
                       "or default (ComfyUI's device, which makes room for them; in CPU memory between checks)"}),
            "fail_closed": ("BOOLEAN", {"default": True, "tooltip": "block a run when a check itself fails (the "
                            "package alone lets it through); off: such runs pass, with a warning in the log"}),
            "allow_download": ("BOOLEAN", {"default": False, "tooltip": "fetch the guardrail's files (nvidia/"
                               "Cosmos-1.0-Guardrail, Qwen/Qwen3Guard-Gen-0.6B) into the Hugging Face cache when "
                               "missing; off: the cache only"}),
        }}

    def load(self, device, fail_closed, allow_download):
        guardrails = load(services.guardrails.device_of(device), fail_closed=fail_closed, allow_download=allow_download)
        return (services.guardrails.managed(guardrails),)


def check_prompt(guardrail, prompt) -> None:
    """Every prompt of `prompt` (a chunked prompt's too) through the node's guardrail, or the server-wide one."""
    guardrails = services.guardrails.of(guardrail)
    if guardrails is not None:
        guardrails.check_prompts(prompt_list(prompt))


def filter_frames(guardrail, frames):
    """The frames through the node's guardrail (or the server-wide one), with a progress bar and Cancel."""
    guardrails = services.guardrails.of(guardrail)
    if guardrails is None:
        return frames
    bar = services.progress.Progress.bar()

    def progress(done: int, total: int) -> None:
        bar(done, total)
        services.progress.check_interrupt()

    return guardrails.filter_frames(frames, progress)
