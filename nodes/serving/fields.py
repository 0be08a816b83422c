"""What the HTTP routes refuse, by the field at fault (`FieldError`), and how they decode the media a request
carries: base64, data: URLs, uploads, pixel lists and tensor payloads, never a client's file path or URL."""

import base64
import binascii

import numpy as np
import torch

from ...cosmos3_runtime import InputError
from ...cosmos3_runtime.errors import LimitError
from ...cosmos3_runtime.media import MAX_FRAME_PIXELS, read_image, read_video


class FieldError(InputError):
    """A request the endpoint refuses; `field` names the part of the request at fault."""

    def __init__(self, field: str, message: str, status: int = 400):
        super().__init__(f"{field}: {message}")
        self.field, self.status = field, status

    def body(self) -> dict:
        message = str(self)
        return {"detail": message, "error": {"message": message, "type": "invalid_request_error", "param": self.field}}



def frames_tensor(pictures: list) -> torch.Tensor:
    """RGB PIL images or uint8 RGB arrays of one size -> a ComfyUI IMAGE batch [T, H, W, 3] in [0, 1]."""
    return torch.from_numpy(np.stack([np.asarray(p) for p in pictures]).astype(np.float32) / 255)


def encoded(value, where: str, kind: str) -> bytes | None:
    """Uploaded bytes, {"b64_json" | "base64": ...} or a data: URL -> the file's bytes; None for anything else.
    A plain string would be a server path or URL in SGLang: refused, the endpoint never reads a client's path."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, dict) and ("b64_json" in value or "base64" in value):
        value = value.get("b64_json") or value.get("base64")
        if not isinstance(value, str) or not value:
            raise FieldError(where, "must be a non-empty base64 string")
    elif not isinstance(value, str):
        return None
    elif not value.startswith("data:"):
        raise FieldError(where, f"file paths and URLs are not accepted: send the {kind} as base64 "
                                '({"b64_json": ...} or a data: URL) or upload it as multipart/form-data')
    try:
        return base64.b64decode(value.split(",", 1)[-1] if value.startswith("data:") else value, validate=True)
    except (binascii.Error, ValueError):
        raise FieldError(where, "is not valid base64") from None


def pixel_array(value, where: str) -> np.ndarray | None:
    """A numpy array (msgpack), nested number lists or a tensor payload {"values" | "data", "shape"?} -> an array;
    None for anything else."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, dict) and ("values" in value or "data" in value):
        if value.get("dtype", "uint8") != "uint8":
            raise FieldError(where, "pixel arrays must be uint8")
        value, shape = value.get("values", value.get("data")), value.get("shape")
    elif isinstance(value, list) and value and isinstance(value[0], list):
        shape = None
    else:
        return None
    try:
        array = np.asarray(value)
        return array.reshape([int(s) for s in shape]) if shape is not None else array
    except (TypeError, ValueError) as exc:
        raise FieldError(where, f"is not a pixel array ({exc})") from None


def rgb_array(array: np.ndarray, where: str) -> np.ndarray:
    """A uint8 pixel array [H, W] or [H, W, C] (C = 1, 3, 4) -> [H, W, 3], within the size limit."""
    if array.dtype.kind not in "iu" or array.size == 0 or array.min() < 0 or array.max() > 255:
        raise FieldError(where, "pixel arrays must hold uint8 values (0-255)")
    if array.ndim == 2:
        array = array[..., None]
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4):
        raise FieldError(where, f"pixel arrays must be [H, W] or [H, W, C] with C = 1, 3 or 4, got {list(array.shape)}")
    if array.shape[0] * array.shape[1] > MAX_FRAME_PIXELS:
        raise FieldError(where, f"{array.shape[1]}x{array.shape[0]} is over the limit of {MAX_FRAME_PIXELS} pixels", 413)
    return np.ascontiguousarray(np.broadcast_to(array[..., :3], (*array.shape[:2], 3)).astype(np.uint8))


def decoded(read, where: str):
    try:
        return read()
    except InputError as exc:
        raise FieldError(where, str(exc), 413 if isinstance(exc, LimitError) else 400) from None


def decode_image(value, where: str) -> torch.Tensor:
    """One observation image: uploaded bytes, {"b64_json": ...}, a data: URL, pixel lists or a tensor payload."""
    data = encoded(value, where, "image")
    if data is not None:
        return frames_tensor([decoded(lambda: read_image(data, max_pixels=MAX_FRAME_PIXELS), where)])
    array = pixel_array(value, where)
    if array is None:
        raise FieldError(where, 'must be an image: base64 ({"b64_json": ...}), a data: URL, pixel lists [H][W][C] '
                                'or {"values", "shape"}')
    return frames_tensor([rgb_array(array, where)])


def decode_video(value, where: str, num_frames: int) -> torch.Tensor:
    """The clip for inverse dynamics, its first `num_frames` frames: video bytes (uploaded or base64), a list of
    images, or pixels [T, H, W, C]."""
    data = encoded(value, where, "video")
    if data is not None:
        frames = decoded(lambda: read_video(data, max_frames=num_frames, max_pixels=MAX_FRAME_PIXELS), where)
        return frames_tensor(frames)
    array = pixel_array(value, where)
    if array is not None and array.ndim == 4:
        return frames_tensor([rgb_array(a, f"{where}[{i}]") for i, a in enumerate(array[:num_frames])])
    if isinstance(value, list) and value and array is None:
        frames = [decode_image(v, f"{where}[{i}]") for i, v in enumerate(value[:num_frames])]
        if len({f.shape for f in frames}) > 1:
            raise FieldError(where, "the frames differ in size")
        return torch.cat(frames)
    raise FieldError(where, 'must be a video: base64 video bytes ({"b64_json": ...}), a list of images or pixels '
                            "[T][H][W][C]")
