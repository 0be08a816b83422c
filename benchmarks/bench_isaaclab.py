"""Isaac Lab's camera service (`serve-isaaclab`): the latency of an update as a camera sees it, and a soak.

A service on a Unix socket in this process (its own thread, as `serve-isaaclab` runs it) and a camera on the same
protocol (`isaaclab.Client`): episodes of `--episode-frames` (their first frame, then updates of 4 random control
frames) one after another, each after the first begun by a reset with a new seed, until `--chunks` control chunks
have gone through. Each step is timed from its send to its reply (the camera's latency: the chunk's control encode,
its commit, the fixed steps, the frame's commit, the decode of 4 frames, the socket both ways); the process's
resident memory is read after every episode (a soak: it must stay flat).

Default: a "small" random framewise checkpoint (window 8 latent frames, 1 sink), 256x256, fp32 on this machine's CPU.
On a GPU, `--device cuda --dtype bf16 --canvas 832x480` gives one episode's per-update latency at Isaac Lab's
landscape canvas (with the small checkpoint: the cost of everything but the model's width and depth).

    python benchmarks/bench_isaaclab.py [--chunks 200 --episode-frames 41 --canvas 256x256 --device cpu]
"""

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cosmos3_runtime  # noqa: E402
from bench_causal import rss_mib  # noqa: E402
from cosmos3_runtime import isaaclab  # noqa: E402
from cosmos3_runtime.tiny import make_tiny_checkpoint, sim_transfer_block  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--episode-frames", type=int, default=41)
    parser.add_argument("--canvas", default="256x256", help="WIDTHxHEIGHT")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="fp32")
    args = parser.parse_args()
    width, height = map(int, args.canvas.split("x"))
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_tiny_checkpoint(Path(tmp) / "framewise", kind="gated", size="small", distilled=True,
                                    dtype="float32", reasoner=False, causal=sim_transfer_block(1, 8, 1))
        pipe = cosmos3_runtime.load(root, device=args.device, dtype=args.dtype)
        service = isaaclab.Service(pipe, None)
        with isaaclab.listening(f"unix://{tmp}/cosmos.sock") as listener:
            thread = threading.Thread(target=service.serve, args=(listener,))
            thread.start()
            first, updates, memory, chunks = [], [], [], 0
            with isaaclab.Client(isaaclab.endpoint_of(listener)) as camera:
                camera.open("A red ball rolls across a stone floor.", "edge", height, width, args.episode_frames)
                episode = 0
                while chunks < args.chunks:
                    sizes = [1] + [4] * ((args.episode_frames - 1) // 4)
                    for k, count in enumerate(sizes):
                        control = rng.integers(0, 256, (count, height, width, 3), dtype=np.uint8)
                        start = time.perf_counter()
                        camera.step(control, episode if k == 0 and episode else None)
                        (first if k == 0 else updates).append(time.perf_counter() - start)
                    chunks += len(sizes)
                    episode += 1
                    memory.append(rss_mib())
                camera.shutdown()
            thread.join()
    steady = updates[(args.episode_frames - 1) // 4:]  # after the first episode
    print(f"Isaac Lab camera service, small random framewise checkpoint (window 8, 1 sink), {width}x{height}, "
          f"{args.dtype} on {args.device} ({torch.get_num_threads()} threads): {episode} episodes of "
          f"{args.episode_frames} frames, {chunks} control chunks through a Unix socket\n")
    print(f"- an update (4 control frames in, 4 frames out), as the camera waits for it: median "
          f"{statistics.median(steady):.3f} s, max/min {max(steady) / min(steady):.2f}x over {len(steady)} updates; "
          f"{4 / statistics.median(steady):.1f} frames/s")
    print(f"- an episode's first frame (after the first episode: a reset): median {statistics.median(first[1:]):.3f} s")
    print(f"- resident memory after each episode (MiB): {', '.join(f'{m:.0f}' for m in memory)}; after the second "
          f"{memory[1]:.0f}, at most {max(memory[1:]):.0f}, at the end {memory[-1]:.0f}")


if __name__ == "__main__":
    main()
