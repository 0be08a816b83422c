"""Choosing each next token: greedy, or seeded sampling with NVIDIA's recommended settings.

Sampling runs on the CPU in fp32 with a CPU generator seeded once per answer, so a seed gives the
same answer on every device (as far as the logits agree). The order is the serving stacks': presence
penalty, temperature, top-k, top-p, then a draw.
"""

from dataclasses import dataclass

import torch

from ..errors import InputError

# NVIDIA's prompt guide: (temperature, top_p, top_k, presence_penalty), without and with thinking.
RECOMMENDED = {False: (0.7, 0.8, 20, 1.5), True: (0.6, 0.95, 20, 0.0)}


@dataclass(frozen=True)
class Sampling:
    temperature: float  # 0: greedy
    top_p: float
    top_k: int  # 0: no limit
    presence_penalty: float

    @classmethod
    def resolve(cls, thinking: bool, temperature=None, top_p=None, top_k=None, presence_penalty=None) -> "Sampling":
        """Unset values take NVIDIA's recommendation for the mode; the result is checked."""
        given = (temperature, top_p, top_k, presence_penalty)
        s = cls(*(d if v is None else v for v, d in zip(given, RECOMMENDED[bool(thinking)])))
        checks = (("temperature", s.temperature, 0.0 <= s.temperature <= 2.0, "0..2 (0 is greedy)"),
                  ("top_p", s.top_p, 0.0 < s.top_p <= 1.0, "above 0 and at most 1"),
                  ("top_k", s.top_k, isinstance(s.top_k, int) and s.top_k >= 0, "a whole number, 0 for no limit"),
                  ("presence_penalty", s.presence_penalty, -2.0 <= s.presence_penalty <= 2.0, "-2..2"))  # fmt: skip
        for name, value, ok, allowed in checks:
            if not ok:
                raise InputError(f"{name} {value!r} is out of range; use {allowed}")
        return s

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def next_token(logits: torch.Tensor, s: Sampling, generator: torch.Generator, seen: torch.Tensor) -> int:
    """logits [V] fp32; `seen` [V] bool marks tokens already generated (for the presence penalty)."""
    if s.greedy:
        return int(logits.argmax())
    logits = logits.cpu().clone()
    if s.presence_penalty:
        logits[seen] -= s.presence_penalty
    logits /= s.temperature
    if 0 < s.top_k < logits.numel():
        threshold = logits.topk(s.top_k).values[-1]
        logits[logits < threshold] = -float("inf")
    if s.top_p < 1.0:
        ordered, order = logits.sort(descending=True)
        probs = ordered.softmax(-1)
        before = probs.cumsum(-1) - probs  # probability mass ranked above each token
        logits[order[before >= s.top_p]] = -float("inf")
    return int(torch.multinomial(logits.softmax(-1), 1, generator=generator))
