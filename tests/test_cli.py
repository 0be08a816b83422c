"""The command line: generate (PNG and MP4), demo, info, make-tiny, and its error exit."""

import numpy as np
import pytest

from cosmos3_runtime.__main__ import main


def test_generate_an_image(tiny_gated, tmp_path, capsys):
    out = tmp_path / "cat.png"
    assert main(["generate", "--checkpoint", str(tiny_gated), "--prompt", "a cat", "--frames", "1", "--steps", "2",
                 "--width", "64", "--height", "48", "--output", str(out), "--device", "cpu"]) == 0  # fmt: skip
    from PIL import Image

    assert Image.open(out).size == (64, 48)
    assert "t2i 64x48, 1 frames" in capsys.readouterr().out


def test_generate_a_video(tiny_edge, tmp_path):
    av = pytest.importorskip("av")
    out = tmp_path / "clip.mp4"
    assert main(["generate", "--checkpoint", str(tiny_edge), "--prompt", "a cat", "--frames", "9", "--steps", "2",
                 "--width", "64", "--height", "48", "--fps", "16", "--output", str(out), "--tile", "2"]) == 0  # fmt: skip
    with av.open(str(out)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        rate = container.streams.video[0].average_rate
    assert len(frames) == 9 and frames[0].shape == (48, 64, 3) and rate == 16
    assert np.std(frames[0]) > 0


def test_errors_exit_with_a_message(tiny_gated, tmp_path, capsys):
    code = main(["generate", "--checkpoint", str(tiny_gated), "--prompt", "x", "--width", "100",
                 "--output", str(tmp_path / "x.png")])  # fmt: skip
    assert code == 2 and "multiple of 16" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "missing")]) == 2


def test_demo_info_and_make_tiny(tmp_path, capsys):
    assert main(["make-tiny", str(tmp_path / "t"), "--kind", "edge", "--distilled"]) == 0
    assert main(["info", str(tmp_path / "t")]) == 0
    assert "Edge (dense relu2), distilled 4-step (SDE)" in capsys.readouterr().out
    assert main(["demo", "--checkpoint", str(tmp_path / "t"), "--width", "64", "--height", "48"]) == 0
    assert "one transformer forward" in capsys.readouterr().out
