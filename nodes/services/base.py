"""What every part of the seam shares: the pack's logger and ComfyUI's modules, imported on use."""

import logging


log = logging.getLogger("cosmos3")


def _comfy(module: str):
    """Import a ComfyUI module, or None outside ComfyUI."""
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        return None


def in_comfyui() -> bool:
    return _comfy("comfy.model_patcher") is not None and _comfy("comfy.model_management") is not None


def prompt_server():
    """ComfyUI's running server, or None outside it."""
    server = _comfy("server")
    return getattr(getattr(server, "PromptServer", None), "instance", None)
