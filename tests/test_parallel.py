"""Sequence and CFG parallelism: gloo processes on CPU, launched with torchrun, against one process.

Each case runs the real entry point (`torchrun -m cosmos3_runtime generate ... --sp N [--cfg-parallel]`)
and compares the final latents with a single-process run of the same command (fp32, <= 1e-5).
"""

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import ROOT
from cosmos3_runtime import InputError, load
from cosmos3_runtime.parallel import Group

pytestmark = [pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built"),
              pytest.mark.slow]  # separate processes: seconds each

# 80x96 pixels, 9 frames -> 3 x 3 x 3 = 27 media tokens: not a multiple of 2 or 4, so shards are padded.
ARGS = ["--prompt", "a robot stacks cubes", "--negative-prompt", "blurry", "--frames", "9", "--width", "80",
        "--height", "96", "--steps", "3", "--guidance", "4", "--dtype", "fp32", "--seed", "5"]


def run(checkpoint, out, processes=1, extra=()):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = ["-m", "cosmos3_runtime", "generate", "--checkpoint", str(checkpoint), "--output", str(out), *ARGS, *extra]
    if processes > 1:
        launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
        command = launcher + command
    else:
        command += ["--device", "cpu"]
    result = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    (tensor,) = load_file(str(out)).values()  # the latents (a transfer's: its frames)
    return tensor


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The one-process result of a checkpoint, run once and shared by the tests that compare with it."""
    results = {}

    def result_of(checkpoint):
        if str(checkpoint) not in results:
            results[str(checkpoint)] = run(checkpoint, tmp_path_factory.mktemp("single") / "single.safetensors")
        return results[str(checkpoint)]

    return result_of


@pytest.fixture(scope="module")
def four_kv_heads(tiny_factory):
    return tiny_factory(kind="gated", overrides={"num_attention_heads": 4, "num_key_value_heads": 4})


@pytest.mark.parametrize("kind", ["gated", "edge"])
def test_sequence_parallel_2_equals_one_process(tiny_factory, single, tmp_path, kind):
    checkpoint = tiny_factory(kind=kind)
    parallel = run(checkpoint, tmp_path / "sp2.safetensors", 2, ["--sp", "2"])
    assert single(checkpoint).abs().max() > 0.5
    torch.testing.assert_close(parallel, single(checkpoint), atol=1e-5, rtol=0)


def test_sequence_parallel_4_equals_one_process(four_kv_heads, single, tmp_path):
    parallel = run(four_kv_heads, tmp_path / "sp4.safetensors", 4, ["--sp", "4"])
    torch.testing.assert_close(parallel, single(four_kv_heads), atol=1e-5, rtol=0)


def test_cfg_parallel_equals_serial_cfg(tiny_factory, single, tmp_path):
    checkpoint = tiny_factory(kind="gated")
    parallel = run(checkpoint, tmp_path / "cfg.safetensors", 2, ["--cfg-parallel"])
    assert torch.equal(parallel, single(checkpoint))  # same forwards, same combine formula and order


def test_cfg_parallel_with_sequence_parallel(four_kv_heads, single, tmp_path):
    parallel = run(four_kv_heads, tmp_path / "cfg-sp2.safetensors", 4, ["--cfg-parallel", "--sp", "2"])
    torch.testing.assert_close(parallel, single(four_kv_heads), atol=1e-5, rtol=0)


def test_transfer_under_sequence_parallelism_equals_one_process(tiny_gated, tmp_path):
    """Controls, then the video, sharded across the ranks; two chunks, text and control guidance (three passes)."""
    import numpy as np

    from cosmos3_runtime.media import save_video

    clip = save_video(torch.from_numpy(np.random.default_rng(0).random((9, 96, 80, 3), dtype=np.float32)),
                      tmp_path / "edge.mp4", 24.0)
    extra = ["--control", f"edge={clip}", "--chunk-frames", "5", "--control-guidance", "1.5"]
    one = run(tiny_gated, tmp_path / "one.safetensors", 1, extra)
    two = run(tiny_gated, tmp_path / "sp2.safetensors", 2, ["--sp", "2", *extra])
    assert one.shape == (9, 96, 80, 3)
    torch.testing.assert_close(two, one, atol=1e-5, rtol=0)


def test_transfer_under_cfg_parallelism_is_refused(tiny_gated):
    from types import SimpleNamespace

    pipe = load(tiny_gated, dtype="fp32")
    with pytest.raises(InputError, match="CFG parallelism cannot split"):
        pipe.generate("x", control_videos={"edge": torch.rand(5, 16, 16, 3)}, width=32, height=32,
                      parallel=SimpleNamespace(sp=None, cfg=FAKE_GROUP))


# The checks below fail before any communication, so a stand-in group is enough.
FAKE_GROUP = Group(group=None, size=4, rank=0)


def test_head_counts_not_divisible_by_the_sp_degree(tiny_gated):
    model = load(tiny_gated, dtype="fp32").transformer
    with pytest.raises(InputError, match="needs head counts divisible by 4; this model has 4 query and 2 key/value"):
        model(torch.randn(1, 48, 1, 4, 4), torch.tensor(500), model.encode_text(torch.arange(5)), sp=FAKE_GROUP)


def test_action_under_sequence_parallelism_is_refused(tiny_factory):
    from cosmos3_runtime.transformer import Segment

    model = load(tiny_factory(kind="edge", action=True), dtype="fp32").transformer
    action = Segment("action", torch.zeros(4, 64), domain=8)
    with pytest.raises(InputError, match="sound and action tracks do not run under sequence parallelism"):
        model(torch.randn(1, 48, 1, 4, 4), torch.tensor(500), model.encode_text(torch.arange(5)), tracks=[action],
              sp=FAKE_GROUP)


def test_launching_parallel_without_torchrun_is_a_clear_error(tiny_gated, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    result = subprocess.run([sys.executable, "-m", "cosmos3_runtime", "generate", "--checkpoint", str(tiny_gated),
                             "--prompt", "x", "--sp", "2", "--output", str(tmp_path / "x.png")],
                            cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 2 and "torchrun --nproc-per-node N" in result.stderr
