"""Shared by the benchmark scripts: fresh-process runs, peak resident memory (Linux /proc), and the bytes each aten
op of a run reads and writes (`BytesMoved`, on the meta device: shapes only)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ROOT = Path(__file__).resolve().parents[1]
PRELUDE = f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(Path(__file__).parent)!r}]\nfrom measure import PeakMemory\n"


def _status_mb(field: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


class PeakMemory:
    """Peak resident memory counted from its creation (the kernel's high-water mark is reset then)."""

    def __init__(self):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self.start = _status_mb("VmRSS")

    def mb(self) -> float:
        return _status_mb("VmHWM") - self.start


def run_child(code: str, label: str) -> dict:
    """Run `code` in a fresh interpreter (PeakMemory and the pack importable); return the JSON it prints last."""
    result = subprocess.run([sys.executable, "-c", PRELUDE + code], capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{label} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty"}
WRITE_ONLY = {torch.ops.aten.copy_.default, torch.ops.aten.fill_.Scalar, torch.ops.aten.zero_.default}


def distinct_bytes(t: torch.Tensor) -> int:
    """The bytes of t's distinct elements (a broadcast, stride-0 dimension is read once)."""
    return math.prod(n for n, step in zip(t.shape, t.stride()) if step) * t.element_size() if t.numel() else 0


def tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


class BytesMoved(TorchDispatchMode):
    """Adds up, per aten op, the bytes each call reads and writes as called: the distinct elements of its tensor
    arguments and results (a broadcast dimension is read once); views and allocations move nothing, a copy's or fill's
    destination is only written. One pass per op, as eager runs them (a fused kernel moves less)."""

    def __init__(self):
        super().__init__()
        self.by_op: dict[str, list[int]] = {}  # op -> [calls, bytes]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        storages = {t.untyped_storage()._cdata for t in tensors((args, kwargs))}
        writes = any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
        if func.overloadpacket.__name__ in ALLOCATIONS or (
                not writes and all(t.untyped_storage()._cdata in storages for t in tensors(out))):
            return out  # an allocation or a view: nothing moves
        written = {id(t) for t in tensors(out)}
        only_written = func in WRITE_ONLY or "out" in kwargs
        read = [t for t in tensors((args, kwargs)) if not (id(t) in written and only_written)]
        entry = self.by_op.setdefault(func.overloadpacket.__name__, [0, 0])
        entry[0] += 1
        entry[1] += sum(map(distinct_bytes, read)) + sum(map(distinct_bytes, tensors(out)))
        return out
