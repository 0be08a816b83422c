"""The server-wide guardrail: with COSMOS3_GUARDRAILS=on every run of the pack's nodes on this server is checked (the
prompt before weights move, the frames before they leave), and the HTTP routes check a request's prompts before they
queue it. COSMOS3_GUARDRAILS_DEVICE: cpu (default) or default (ComfyUI's device, during checks only);
COSMOS3_GUARDRAILS_FAIL_OPEN=1 lets runs through when a check itself fails. Loaded on first use, from the Hugging Face
cache only; released with /free."""

import os
import threading

from ...cosmos3_runtime.guardrails import Guardrails, load
from . import memory

_lock = threading.Lock()
_loaded: list[Guardrails] = []


def on() -> bool:
    return os.environ.get("COSMOS3_GUARDRAILS", "").strip().lower() in ("1", "on", "true", "yes")


def server_wide() -> Guardrails | None:
    """The server's guardrail when the setting is on (loaded now if needed; a refusal when it cannot load), else None."""
    if not on():
        return None
    with _lock:
        if not _loaded:
            fail_open = os.environ.get("COSMOS3_GUARDRAILS_FAIL_OPEN", "").strip().lower() in ("1", "on", "true", "yes")
            device = device_of(os.environ.get("COSMOS3_GUARDRAILS_DEVICE", "cpu"))
            _loaded.append(managed(load(device, fail_closed=not fail_open)))
        return _loaded[0]


def managed(guardrails: Guardrails) -> Guardrails:
    """On ComfyUI's GPU, ComfyUI makes room for the guardrail's models before each check."""
    if guardrails.device.type != "cpu":
        guardrails.make_room = lambda num_bytes: memory.free_memory(num_bytes, guardrails.device)
    return guardrails


def device_of(choice: str):
    """A node's device choice: cpu, or default (ComfyUI's device)."""
    return memory.torch_device() if choice == "default" else "cpu"


def release() -> None:
    """Drop the server's guardrail (POST /free): the next check loads it again."""
    with _lock:
        _loaded.clear()
