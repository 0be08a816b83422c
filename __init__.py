"""Cosmos3 for ComfyUI.

ComfyUI imports this file from custom_nodes/. Outside ComfyUI (pytest collecting tests/, the
runtime used on its own) `comfy_api` is absent and nothing is imported, so this stays importable
without ComfyUI while real import errors inside ComfyUI still surface.
"""

import importlib.util

WEB_DIRECTORY = "./web"  # front-end extension: shows the nodes' reports (detected variant, notes)

if importlib.util.find_spec("comfy_api") is not None:
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

    __all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
