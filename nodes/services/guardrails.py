"""The server-wide guardrail: with COSMOS3_GUARDRAILS=on every run of the pack's nodes on this server is checked (the
prompt before weights move, the frames before they leave), and the HTTP routes check a request's prompts before they
queue it. COSMOS3_GUARDRAILS_DEVICE: cpu (default) or default (ComfyUI's device, during checks only);
COSMOS3_GUARDRAILS_FAIL_OPEN=1 lets runs through when a check itself fails. Loaded on first use, from the Hugging Face
cache only; released with /free."""

import os
import threading

from ...cosmos3_runtime.guardrails import Guardrails, load
from . import memory

_loading = threading.Lock()  # one load at a time; /free never waits for it
_state = {"guardrails": None, "generation": 0}  # the loaded guardrail; a /free counts a generation


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "on", "true", "yes")


def on() -> bool:
    return _flag("COSMOS3_GUARDRAILS")


def server_wide() -> Guardrails | None:
    """The server's guardrail when the setting is on (loaded now if needed; a refusal when it cannot load), else None."""
    if not on():
        return None
    with _loading:
        if _state["guardrails"] is None:
            generation = _state["generation"]
            loaded = managed(load(device_of(os.environ.get("COSMOS3_GUARDRAILS_DEVICE", "cpu")),
                                  fail_closed=not _flag("COSMOS3_GUARDRAILS_FAIL_OPEN")))
            if generation != _state["generation"]:  # a /free came during the load: used once, not kept
                return loaded
            _state["guardrails"] = loaded
        return _state["guardrails"]


def of(guardrail: Guardrails | None) -> Guardrails | None:
    """A node's guardrail: its input, else the server's (when the setting is on), else None."""
    return guardrail if guardrail is not None else server_wide()


def managed(guardrails: Guardrails) -> Guardrails:
    """On ComfyUI's GPU, ComfyUI makes room for the guardrail's models before each check."""
    if guardrails.device.type != "cpu":
        guardrails.make_room = lambda num_bytes: memory.free_memory(num_bytes, guardrails.device)
    return guardrails


def device_of(choice: str):
    """A node's device choice: cpu, or default (ComfyUI's device)."""
    return memory.torch_device() if choice == "default" else "cpu"


def release() -> None:
    """Drop the server's guardrail (POST /free), without waiting for a load: the next check loads it again."""
    _state["generation"] += 1
    _state["guardrails"] = None
