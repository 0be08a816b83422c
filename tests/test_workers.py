"""The worker pool behind multi-GPU sampling in ComfyUI, with CPU worker processes (gloo) standing in for GPUs."""

import pytest
import torch

import cosmos3_runtime
from cosmos3_runtime.workers import WorkerError, WorkerPool

pytestmark = [pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built"),
              pytest.mark.slow]  # separate processes: seconds each

REQUEST = dict(width=80, height=96, num_frames=9, steps=3, seed=5, negative_prompt="blurry", guidance_scale=4.0)


@pytest.fixture(scope="module")
def pool(tiny_gated):
    pool = WorkerPool(str(tiny_gated), ["cpu", "cpu"], sp=2, dtype="fp32", local_files_only=True)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def reference(tiny_gated):
    pipe = cosmos3_runtime.load(tiny_gated, dtype="fp32")
    return pipe, pipe.generate("a cat", output="latents", **REQUEST)


def test_pool_generation_equals_one_process(pool, reference):
    steps = []
    result = pool.generate("a cat", callback=lambda step, total, latents: steps.append((step, total)), **REQUEST)
    assert steps == [(1, 3), (2, 3), (3, 3)]
    torch.testing.assert_close(result.latents, reference[1].latents, atol=1e-5, rtol=0)
    assert result.settings.mode == "t2v" and pool.variant == reference[0].variant


def test_cancel_stops_every_worker_and_the_pool_stays_usable(pool, reference):
    def cancel(step, total, latents):
        if step == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pool.generate("a cat", callback=cancel, **REQUEST)
    again = pool.generate("a cat", **REQUEST)
    torch.testing.assert_close(again.latents, reference[1].latents, atol=1e-5, rtol=0)


def test_a_bad_request_is_reported_and_the_pool_survives(pool):
    with pytest.raises(cosmos3_runtime.InputError, match="width 100 must be a positive multiple of 16"):
        pool.generate("a cat", **{**REQUEST, "width": 100})  # refused in the caller, before any worker sees it
    with pytest.raises(cosmos3_runtime.InputError, match="schedule 'distilled' needs a distilled checkpoint"):
        pool.generate("a cat", **{**REQUEST, "schedule": "distilled"})  # a variant problem: planned in the caller too
    assert all(p.is_alive() for p in pool.processes)


def test_decode_and_encode_on_the_pool(pool, reference):
    pipe, result = reference
    torch.testing.assert_close(pool.decode(result.latents), pipe.decode(result.latents), atol=1e-5, rtol=0)
    frames = torch.rand(5, 96, 80, 3)
    torch.testing.assert_close(pool.encode(frames), pipe.encode(frames), atol=1e-5, rtol=0)


def test_a_dead_worker_shuts_the_pool_down(tiny_gated):
    pool = WorkerPool(str(tiny_gated), ["cpu", "cpu"], sp=2, dtype="fp32", local_files_only=True)
    pool.processes[1].kill()
    pool.processes[1].join()
    with pytest.raises(WorkerError, match=r"workers \[1\] died"):
        pool.generate("a cat", **REQUEST)
    assert not any(p.is_alive() for p in pool.processes)


def test_loader_node_with_two_gpus(pack, models_dir):
    pack.loader.release_all()
    model, vae, info = pack.Cosmos3ModelLoader().load("Cosmos3-Edge", "fp32", "default", gpus=2)["result"]
    assert "2 GPUs (sequence)" in info and isinstance(model.pipeline, pack.loader.WorkerPool)
    bundle = pack.Cosmos3TextEncode().encode("a cat", "", "auto", True, True, True)["result"][0]
    latent = pack.Cosmos3Sampler().sample(model, bundle, 64, 48, 5, 0.0, 0.0, "auto", 1)["result"][0]
    images, fps = pack.Cosmos3VAEDecode().decode(vae, latent, False, 32, 8)
    assert images.shape == (5, 48, 64, 3) and fps == 24.0
    workers = model.pipeline.processes
    pack.Cosmos3ModelLoader().load("Cosmos3-Nano", "fp32", "default")  # switching closes the pool
    assert not any(p.is_alive() for p in workers)
    with pytest.raises(pack.loader.InputError, match="'cfg' needs 2"):
        pack.Cosmos3ModelLoader().load("Cosmos3-Edge", "fp32", "default", gpus=3, multi_gpu="cfg")


def test_a_pool_starts_under_a_host_script_with_its_own_nodes_module(tiny_gated, tmp_path):
    """ComfyUI's situation: the parent's main script has top-level code and a top-level module `nodes`
    (ComfyUI's nodes.py) that the pack's `nodes/` package must not shadow in the workers."""
    import subprocess
    import sys

    from conftest import ROOT

    (tmp_path / "nodes.py").write_text("HOST_NODES = True\n")
    (tmp_path / "host_main.py").write_text(f"""
import importlib.util, os, sys
with open("main_runs.txt", "a") as f:  # the host's main must run once, never again in a worker
    f.write("ran\\n")
import nodes
assert nodes.HOST_NODES
spec = importlib.util.spec_from_file_location("cosmos3_host_pack", {str(ROOT / "__init__.py")!r},
                                              submodule_search_locations=[{str(ROOT)!r}])
pack = importlib.util.module_from_spec(spec)
sys.modules["cosmos3_host_pack"] = pack
spec.loader.exec_module(pack)
workers = importlib.import_module("cosmos3_host_pack.cosmos3_runtime.workers")
pool = workers.WorkerPool({str(tiny_gated)!r}, ["cpu", "cpu"], sp=2, dtype="fp32", local_files_only=True)
result = pool.generate("a cat", width=64, height=48, num_frames=5, steps=1)
pool.close()
print("generated", tuple(result.latents.shape))


class Unreadable:  # fails while a worker unpickles its arguments, before it can report anything
    def __reduce__(self):
        return (int, ("not a number",))


try:
    workers.WorkerPool({str(tiny_gated)!r}, ["cpu", "cpu"], sp=2, dtype=Unreadable(), local_files_only=True)
except workers.WorkerError as exc:
    print("error:", exc)
""")
    done = subprocess.run([sys.executable, "host_main.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "generated (1, 48, 2, 3, 4)" in done.stdout, done.stdout + done.stderr
    assert (tmp_path / "main_runs.txt").read_text() == "ran\n"
    assert "died" in done.stdout and "invalid literal for int() with base 10: 'not a number'" in done.stdout


def test_low_vram_options_reach_the_workers(pack, monkeypatch):
    """The loader hands its low-VRAM options to every worker's load() (the pool passes load options through)."""
    seen = {}
    monkeypatch.setattr(pack.loader, "WorkerPool", lambda source, devices, **options: seen.update(options) or "pool")
    spec = pack.loader.ModelSpec("ckpt", "fp32", "default", gpus=2, offload_text=True, blocks_to_swap=3,
                                 quantize="fp8")
    assert pack.loader.worker_pool(spec, torch.device("cpu"), "fp32") == "pool"
    assert (seen["offload_text"], seen["blocks_to_swap"], seen["quantize"]) == (True, 3, "fp8")


def test_a_transfer_on_the_pool_equals_one_process(pool, reference):
    """The pool returns a transfer's frames (it decodes every chunk to start the next)."""
    controls = {"edge": torch.rand(9, 40, 56, 3)}
    options = dict(width=80, height=96, steps=2, seed=3, chunk_frames=5, control_videos=controls)
    steps = []
    result = pool.generate("a cat", callback=lambda step, total, latents: steps.append((step, total)), **options)
    expected = reference[0].generate("a cat", **options)
    assert steps == [(1, 4), (2, 4), (3, 4), (4, 4)] and result.latents is None
    torch.testing.assert_close(result.frames, expected.frames, atol=1e-5, rtol=0)
