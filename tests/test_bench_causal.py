"""benchmarks/bench_causal.py's copy count, on the meta device at Nano's released shapes: a chunk's attention reads its
history where it is held, so the bytes a chunk copies do not grow with the history (a concatenated copy of the text
and the history per layer per forward was ~310 GB a chunkwise chunk at 150 latent frames)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_causal  # noqa: E402
from cosmos3_runtime.tiny import RELEASED  # noqa: E402


@pytest.mark.parametrize("chunk", [4, 1], ids=["chunkwise", "framewise"])
def test_a_chunk_copies_its_own_rows_whatever_the_history(chunk):
    """150 latent frames held add under 1 % to what a chunk copies with none (only the host's frame index grows);
    its copy_ is the K/V rows its forwards write: 5 forwards of the chunk and a commit a frame, keys and values, each
    read and written, in bf16."""
    c = RELEASED["nano"]
    held, empty = bench_causal.copied_bytes_per_chunk("nano", chunk, 150), bench_causal.copied_bytes_per_chunk(
        "nano", chunk, 0)
    assert sum(held.values()) - sum(empty.values()) < 1e-2 * sum(empty.values())
    rows = (5 * chunk + chunk) * 26 * 15
    own = rows * c["num_key_value_heads"] * c["head_dim"] * 2 * 2 * 2 * c["num_hidden_layers"]
    assert own <= held["copy_"] < 1.1 * own
