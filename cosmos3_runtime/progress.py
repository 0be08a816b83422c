"""A generation's progress as lines a person reads: the command line's report, and the Python API's progress bar.

One `Report` takes the stages a run reports (`STAGES`: `generate`'s `progress(stage, done, total)`) and its steps
(`callback(step, total, latents)`), each stage on one line with the time it has taken, the steps with a bar and the
time left. On a terminal the line is rewritten in place; in a file or a pipe whole lines are written, fewer of them.
"""

import sys
import time

from . import timing

# Every stage `generate` reports, with its words (a stage missing here shows as its own name)
STAGES = {"text": "text tower, prompt", "chunk": "chunk", "decode": "VAE decode, latent frame",
          "guardrail": "guardrail, frames checked"}
BAR = 20  # characters of the steps' bar


class Report:
    """Progress lines written with `write` (print's signature); `live`: the stream is a terminal."""

    def __init__(self, write, live: bool):
        self.write, self.live = write, live
        self.stage_name, self.last, self.steps_began = None, time.perf_counter(), None

    @classmethod
    def on_stderr(cls) -> "Report":
        """The Python API's progress bar: on stderr, rewritten in place where it is a terminal."""
        return cls(lambda *a, **k: print(*a, file=sys.stderr, **k), sys.stderr.isatty())

    def stage(self, name: str, done: int, total: int) -> None:
        self._show(name, f"{STAGES.get(name, name)} {done}/{total}", done == total or name == "chunk")

    def step(self, done: int, total: int, _latents) -> None:
        self.steps_began = self.steps_began or self.last  # over every chunk of a chunked run
        left = (time.perf_counter() - self.steps_began) / done * (total - done)
        bar = f" |{'#' * (BAR * done // total):<{BAR}}|" if self.live else ""
        text = f"step {done}/{total}{bar}" + (f", about {timing.duration(left)} left" if done < total else "")
        self._show("step", text, done == total, quiet=done % max(1, total // 10) != 0)

    def around(self, callback, progress):
        """(step callback, stage callback) reporting here and then to a host's own (None: none)."""

        def step(done, total, latents):
            self.step(done, total, latents)
            if callback is not None:
                callback(done, total, latents)

        def stage(name, done, total):
            self.stage(name, done, total)
            if progress is not None:
                progress(name, done, total)

        return step, stage

    def _show(self, name: str, text: str, last: bool, quiet: bool = False) -> None:
        now = time.perf_counter()
        if name != self.stage_name or name == "chunk":  # a new stage began when the previous line was written
            self.stage_name, self.began = name, self.last
        if self.live:
            self.write(f"\r{text}  {now - self.began:.1f}s\033[K", end="\n" if last else "", flush=True)
        elif last or not quiet:
            self.write(f"{text}  {now - self.began:.1f}s", flush=True)
        self.last = now
