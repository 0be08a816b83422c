"""benchmarks/bench_workloads.py (NVIDIA's published workloads) at its tiny sizes: a row for every workload, precision
and cache, its stages timed and its forward passes counted; NVIDIA's figures keyed by workload, GPU and engine."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_workloads as bench  # noqa: E402

PASSES = {"t2v": 2, "i2v": 2, "transfer": 3}  # forward passes a step: CFG; the transfer's control guidance too


@pytest.mark.slow  # a process of its own
def test_every_workload_precision_and_cache_is_timed_by_stage(tmp_path):
    path = tmp_path / "workloads.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_workloads.py"), "--tiny", "--device", "cpu",
                           "--warmup", "--json", str(path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(path.read_text())
    assert report["tiny"] and report["warmup"] and report["nvidia_gpu"] is None  # a CPU is none of NVIDIA's GPUs
    rows = {(r["workload"], r["precision"], r["cache"]): r for r in report["rows"]}
    assert len(rows) == len(report["rows"])
    assert set(rows) == {(w.name, p, c) for w in bench.WORKLOADS for p in bench.PRECISIONS for c in bench.CACHES}
    modes = {w.name: w.mode for w in bench.WORKLOADS}
    for (name, _, cache), r in rows.items():
        assert r["steps"] == bench.TINY_STEPS, r
        assert min(r["text_s"], r["steps_s"], r["decode_s"], r["other_s"]) > 0, r
        assert r["total_s"] > r["text_s"] + r["steps_s"] + r["decode_s"], r
        if modes[name] in PASSES:
            assert r["passes"] == PASSES[modes[name]] * r["steps"], r
        else:  # an image: guidance only inside its timestep interval
            assert r["steps"] <= r["passes"] <= 2 * r["steps"], r
        assert r["forwards_run"] + r["forwards_skipped"] == r["passes"], r
        if cache == "off":
            assert r["forwards_skipped"] == 0, r
        assert r["nvidia"] == {} and r["ratio"] is None, r


def test_nvidia_figures_are_keyed_by_workload_gpu_and_engine():
    names = [w.name for w in bench.WORKLOADS]
    assert len(set(names)) == len(names)
    assert set(bench.SAME_PRECISION) == set(bench.PRECISIONS)
    assert set(bench.SAME_PRECISION.values()) <= set(bench.COLUMNS)
    for w in bench.WORKLOADS:
        assert "H200" in w.nvidia and set(w.nvidia) <= set(bench.GPUS), w.name
        assert any(column in w.nvidia["H200"] for column in bench.SAME_PRECISION.values()), w.name
        for figures in w.nvidia.values():
            assert figures and set(figures) <= set(bench.COLUMNS) and min(figures.values()) > 0, w.name
    assert bench.nvidia_gpu("NVIDIA H200") == "H200" and bench.nvidia_gpu("NVIDIA B200") == "B200"
    assert bench.nvidia_gpu("NVIDIA H200 NVL") is None and bench.nvidia_gpu("NVIDIA H100 80GB HBM3") is None
