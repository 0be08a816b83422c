"""msgpack with numpy arrays, in the encoding openpi clients and SGLang use.

An array travels as a map {b"__ndarray__": True, b"data": its C-order bytes, b"dtype": dtype.str ("<f4"),
b"shape": [...]}, a numpy scalar as {b"__npgeneric__": True, b"data": its value, b"dtype": ...}. The marker keys
are bin objects; string keys are accepted too. Object, void and complex dtypes are refused (they could carry
pickles or nothing a robot sends).
"""

import msgpack
import numpy as np

REFUSED_KINDS = "OVc"


def _encode(value):
    if isinstance(value, np.ndarray):
        if value.dtype.kind in REFUSED_KINDS:
            raise TypeError(f"arrays of dtype {value.dtype} are not sent")
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(value).tobytes(), b"dtype": value.dtype.str,
                b"shape": list(value.shape)}
    if isinstance(value, np.generic):
        return {b"__npgeneric__": True, b"data": value.item(), b"dtype": value.dtype.str}
    raise TypeError(f"cannot pack {type(value).__name__}")


def _field(obj: dict, name: str):
    return obj[name.encode()] if name.encode() in obj else obj[name]


def _decode(obj: dict):
    if obj.get(b"__ndarray__") or obj.get("__ndarray__"):
        dtype = np.dtype(_field(obj, "dtype"))
        if dtype.kind in REFUSED_KINDS:
            raise ValueError(f"arrays of dtype {dtype} are not accepted")
        shape = tuple(int(s) for s in _field(obj, "shape"))
        data = _field(obj, "data")
        if len(data) != dtype.itemsize * int(np.prod(shape)):
            raise ValueError(f"an array of shape {list(shape)} and dtype {dtype.str} needs "
                             f"{dtype.itemsize * int(np.prod(shape))} bytes, got {len(data)}")
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()  # writable, owned
    if obj.get(b"__npgeneric__") or obj.get("__npgeneric__"):
        return np.dtype(_field(obj, "dtype")).type(_field(obj, "data"))
    return obj


def packb(value) -> bytes:
    return msgpack.packb(value, default=_encode, use_bin_type=True)


def unpackb(data: bytes):
    """One msgpack document (its size is bounded by the transport); ValueError for anything that is not one."""
    try:
        return msgpack.unpackb(data, object_hook=_decode, raw=False, strict_map_key=False)
    except (msgpack.UnpackException, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"not a msgpack document ({type(exc).__name__}: {exc})") from None
