"""Shared by the benchmark scripts: fresh-process runs and peak resident memory (Linux /proc)."""

import json
import subprocess
import sys
from pathlib import Path

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
