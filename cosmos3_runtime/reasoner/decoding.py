"""Choosing each next token (greedy, or seeded sampling with NVIDIA's recommended settings), and the answer's
text as it grows.

The presence penalty and the top-k cut run where the logits are; only the k candidates (all of them when
top_k is 0) come to the CPU, where top-p and the draw run in fp32 with a CPU generator seeded once per answer,
so a seed gives the same answer on every device (as far as the logits agree). The order is the serving
stacks': presence penalty, temperature, top-k, top-p, then a draw.
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
                  ("presence_penalty", s.presence_penalty, -2.0 <= s.presence_penalty <= 2.0, "-2..2"))
        for name, value, ok, allowed in checks:
            if not ok:
                raise InputError(f"{name} {value!r} is out of range; use {allowed}")
        return s

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def candidates(logits: torch.Tensor, s: Sampling, seen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens a sampled step can draw and their probabilities (CPU, fp32, most likely first). logits [V] fp32
    and `seen` [V] bool (tokens already generated, for the presence penalty) on the same device."""
    if s.presence_penalty:
        logits = logits - s.presence_penalty * seen
    k = s.top_k if 0 < s.top_k < logits.numel() else logits.numel()
    values, ids = logits.topk(k)
    values = values.cpu() / s.temperature
    if s.top_p < 1.0:
        probs = values.softmax(-1)
        before = probs.cumsum(-1) - probs  # probability mass ranked above each token
        values[before >= s.top_p] = -float("inf")
    return ids.cpu(), values.softmax(-1)


def next_token(logits: torch.Tensor, s: Sampling, generator: torch.Generator, seen: torch.Tensor) -> int:
    if s.greedy:
        return int(logits.argmax())
    ids, probs = candidates(logits, s, seen)
    return int(ids[torch.multinomial(probs, 1, generator=generator)])


class Detokenizer:
    """The text of a growing answer, decoding a few tokens per step (decoding the whole answer at every token is
    quadratic in its length). A token's text can depend on its neighbours (a character split over byte tokens, a
    leading space a decoder drops at the start of a sequence), so each step decodes from the last complete
    token before the newest text (`prefix`) and keeps the difference once it holds no partial character."""

    def __init__(self, decode):
        self.decode = decode  # ids -> text
        self.ids: list[int] = []
        self.text = ""  # the whole characters so far
        self.prefix = self.read = 0  # ids[prefix:read] is the window's already-read part

    def add(self, token: int) -> str:
        """Append a token; the text of whole characters so far."""
        self.ids.append(token)
        new = self._tail()
        if new and not new.endswith("\ufffd"):
            self.text += new
            self.prefix, self.read = self.read, len(self.ids)
        return self.text

    def final(self) -> str:
        """Everything, a trailing partial character included (as decoding all the ids at once gives it)."""
        return self.text + self._tail()

    def _tail(self) -> str:
        window = self.decode(self.ids[self.prefix :])
        return window[len(self.decode(self.ids[self.prefix : self.read])) :]
