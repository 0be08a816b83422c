"""Progress a person reads: the Python API's progress bar (on stderr, on for a terminal unless a host reports progress
its own way) with the CLI's estimate of a CPU run, and the report's words for every stage a run reports."""

import io
import sys

import pytest
import torch

import cosmos3_runtime
from cosmos3_runtime import progress
from cosmos3_runtime.guardrails import Guardrails

SIZE = dict(width=64, height=48, num_frames=5, steps=2, cache="off")


@pytest.fixture(scope="module")
def pipe(tiny_edge):
    return cosmos3_runtime.load(tiny_edge, dtype=torch.float32)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_python_run_on_a_terminal_shows_the_estimate_and_a_bar(pipe, monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    pipe.generate("a cat", **SIZE)
    shown = sys.stderr.getvalue()
    assert shown.startswith("on the CPU this takes about") and "4 transformer forwards of" in shown
    assert f"\rstep 1/2 |{'#' * 10:<20}|, about" in shown and f"\rstep 2/2 |{'#' * 20}|" in shown
    for line in ("text tower, prompt 2/2", "VAE decode, latent frame 2/2"):
        assert line in shown


def test_no_bar_where_a_host_reports_progress_off_a_terminal_or_when_turned_off(pipe, monkeypatch):
    monkeypatch.setattr(sys, "stderr", Terminal())
    pipe.generate("a cat", callback=lambda *a: None, **SIZE)  # ComfyUI's nodes pass their callbacks
    pipe.generate("a cat", progress=lambda *a: None, **SIZE)
    pipe.generate("a cat", progress_bar=False, **SIZE)
    assert sys.stderr.getvalue() == ""
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a file or a pipe
    pipe.generate("a cat", **SIZE)
    assert sys.stderr.getvalue() == ""
    pipe.generate("a cat", progress_bar=True, **SIZE)  # asked for: whole lines, no bar
    assert "step 2/2  " in sys.stderr.getvalue() and "|" not in sys.stderr.getvalue()


def test_a_host_callback_beside_the_bar_still_hears_every_step_and_cancels(pipe, monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    steps = []

    def stop(step, total, latents):
        steps.append(step)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pipe.generate("a cat", callback=stop, progress_bar=True, **SIZE)
    assert steps == [1] and "step 1/2" in sys.stderr.getvalue()
    assert pipe.generate("a cat", seed=1, **SIZE).frames.shape[0] == 5  # usable after the cancel


def test_every_stage_a_run_reports_has_its_words(pipe):
    """A stage missing from STAGES crashed the CLI's report after a whole run (the guardrail's)."""
    seen = []
    lines = []
    report = progress.Report(lambda text, **_: lines.append(text), live=False)
    step, stage = report.around(None, lambda name, done, total: seen.append(name))
    pipe.generate("a cat", callback=step, progress=stage, guardrails=Guardrails([], face_filter=lambda f: f),
                  chunk_frames=5, **{**SIZE, "num_frames": 9})
    assert set(seen) == set(progress.STAGES)  # text, chunk, decode, guardrail
    assert lines[-1].startswith("guardrail, frames checked 9/9")
