"""ComfyUI's step caches (EasyCache, LazyCache) on the Cosmos3 core MODEL: forwards skipped, sampling time and
the difference to the plain run, from one run each in one process.

    COMFYUI_DIR=/path/to/ComfyUI /path/to/comfyui/python benchmarks/bench_step_cache.py [--threshold 0.2]

A 4-layer, 256-wide random Edge checkpoint at 832x480, 33 frames (3,510 media tokens), 20 Euler steps with
CFG 5 on the Cosmos3 Scheduler's sigmas: the transformer dominates the sampling time. Random weights make
the caches' skip decisions differ from a trained model's; the ratios show the mechanism working.
"""

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SIZE = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            intermediate_size=1024, rope_axes_dim=[12, 10, 10])


def comfyui_with_the_pack():
    sys.path.insert(0, os.environ["COMFYUI_DIR"])
    from comfy.cli_args import args

    args.cpu = not torch.cuda.is_available()
    spec = importlib.util.spec_from_file_location("cosmos3_bench", ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])
    pack = importlib.util.module_from_spec(spec)
    sys.modules["cosmos3_bench"] = pack
    spec.loader.exec_module(pack)
    return pack.nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threshold", type=float, default=0.2, help="reuse_threshold of both caches (their default)")
    parser.add_argument("--steps", type=int, default=20)
    options = parser.parse_args()
    nodes = comfyui_with_the_pack()
    import comfy.samplers
    import comfy_extras.nodes_easycache as easycache
    import folder_paths

    from cosmos3_bench.cosmos3_runtime.tiny import make_tiny_checkpoint

    models = Path(tempfile.mkdtemp(prefix="cosmos3-bench-"))
    make_tiny_checkpoint(models / "Cosmos3-Edge-Bench", kind="edge", overrides=SIZE)
    folder_paths.add_model_folder_path("cosmos3", str(models))
    handle, _, _ = nodes.Cosmos3ModelLoader().load("Cosmos3-Edge-Bench", "auto", "default")["result"]
    model, _ = nodes.Cosmos3CoreModel().build(handle)
    positive, negative = nodes.Cosmos3CoreTextEncode().encode(
        "A robotic arm picks up a red cube and places it on a blue cube.", "blurry, static", "auto", True, True, True,
        24.0)
    _, sigmas = nodes.Cosmos3Scheduler().build("unipc", options.steps, 0.0, model=handle)
    latent = torch.zeros(1, 48, 9, 30, 52)  # 832x480, 33 frames
    transformer, forwards = handle.pipeline.transformer, []
    forward = transformer.forward
    transformer.forward = lambda *a, **k: forwards.append(1) or forward(*a, **k)

    def run(patched) -> tuple[torch.Tensor, float, int]:
        guider = comfy.samplers.CFGGuider(patched)
        guider.set_conds(positive, negative)
        guider.set_cfg(5.0)
        noise = torch.randn(latent.shape, generator=torch.manual_seed(1))
        forwards.clear()
        start = time.perf_counter()
        out = guider.sample(noise, latent, comfy.samplers.sampler_object("euler"), sigmas, disable_pbar=True, seed=1)
        return out, time.perf_counter() - start, len(forwards)

    run(model)  # warm-up: allocator and thread pools
    plain, plain_s, plain_n = run(model)
    print(f"plain:      {plain_n} forwards, {plain_s:.2f} s")
    for name, node in (("EasyCache", easycache.EasyCacheNode), ("LazyCache", easycache.LazyCacheNode)):
        cached = node.execute(model, options.threshold, 0.15, 0.95, False).args[0]
        out, seconds, n = run(cached)
        diff = (out - plain).abs()
        print(f"{name}:  {n} forwards ({1 - n / plain_n:.0%} skipped), {seconds:.2f} s = {seconds / plain_s:.2f}x the "
              f"plain run; final latents differ by {diff.max():.3g} max, {diff.mean():.3g} mean (plain's mean |x|: "
              f"{plain.abs().mean():.3g})")


if __name__ == "__main__":
    main()
