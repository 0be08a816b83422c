"""ComfyUI nodes of the pack (classic V1 API, so the node layer is testable without ComfyUI).

Nodes translate ComfyUI types and call `cosmos3_runtime`; ComfyUI services are imported lazily
inside the functions that use them.
"""

NODE_CLASS_MAPPINGS: dict[str, type] = {}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {}
