"""benchmarks/bench_roofline.py counts what the docs' floors stand on: its FLOPs must be the layers' own arithmetic."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_roofline  # noqa: E402
from cosmos3_runtime.tiny import RELEASED  # noqa: E402


def test_the_counted_flops_are_the_layers_arithmetic():
    """Nano at 832x480x189 after 300 text tokens: every media layer's linears (q, k, v, out, gate, up, down), the
    patch projections and the time embedder (one token), and attention over [text ; media] keys, as 2 M N K and
    4 Nq Nk heads head_dim."""
    c = RELEASED["nano"]
    counts, tokens = bench_roofline.count_forward("nano", 832, 480, 189, 300)
    assert tokens == 48 * 15 * 26
    H, A, K, D, I, layers = (c[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                            "intermediate_size", "num_hidden_layers"))
    per_token = 2 * (H * A * D + 2 * H * K * D + A * D * H + 3 * H * I) * layers + 2 * 2 * 192 * H
    time_embedder = 2 * (256 * H + H * H)
    assert counts.flops["linears"] == tokens * per_token + time_embedder
    assert counts.flops["attention"] == 4 * tokens * (tokens + 300) * A * D * layers
    assert counts.bytes["the rest"] > counts.bytes["linears"]  # eager: the elementwise traffic outweighs the GEMMs'


@pytest.mark.slow  # a process of its own
def test_it_prints_the_floors():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_roofline.py"), "--variant", "edge",
                           "--size", "832x480x121"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "compiled, fp8 linears" in done.stdout and "the rest by op" in done.stdout
