"""The ComfyUI seam, by concern, each with a fallback for running without ComfyUI (tests, scripts): files and
model folders (`files`), devices and the memory manager (`memory`), progress, previews and Cancel (`progress`),
errors in a node's words (`words`), the prompt queue's flags (`server`), the server-wide guardrail (`guardrails`).
ComfyUI modules are imported inside the functions: importing the pack never imports ComfyUI."""

from . import files, guardrails, memory, progress, server, words
from .base import in_comfyui, log, prompt_server

