"""Error types the runtime raises for problems a user can fix.

Every message names what is wrong (a file, a key, a size) and what to do about it, so the ComfyUI
layer can show it as is; `reworded` puts a message in the words of the interface that was used.
"""

import re


class Cosmos3Error(Exception):
    """Base class of the runtime's user-facing errors."""


class CheckpointError(Cosmos3Error, ValueError):
    """A checkpoint folder, config file or weight file is missing, malformed or incompatible."""

    def __init__(self, message: str):
        # one line, whatever a library (the Hub, safetensors, json) put into the text it quotes
        super().__init__(" ".join(line.strip() for line in str(message).splitlines() if line.strip()))


class InputError(Cosmos3Error, ValueError):
    """A generation request asks for something the model or the runtime cannot do."""


class NumericalError(Cosmos3Error, ArithmeticError):
    """A part of the model produced inf or NaN values (an overflow in a narrow dtype): the message names the part."""


class LimitError(InputError):
    """An input is over a size limit the caller set (for example an uploaded image's pixels)."""


def reworded(message: str, names: dict[str, str]) -> str:
    """`message` in another interface's words: each API name in `names` (a `generate` / `load` argument, written as
    an identifier, optionally `=True` / `=False`) replaced by that interface's (a CLI flag, a node's widget)."""
    for name in sorted(names, key=len, reverse=True):
        new = names[name]
        message = re.sub(rf"(?<![\w-]){re.escape(name)}=(True|False)(?!\w)",
                         lambda m, new=new: switched(new, m.group(1) == "True"), message)
        message = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w])", lambda m, new=new: new, message)
    return message


def switched(flag: str, on: bool) -> str:
    """A boolean CLI flag spelled for on or off (`--x` / `--no-x`); a widget name as `name on` / `name off`."""
    if flag.startswith("--"):
        return flag if on else "--no-" + flag[2:]
    return f"{flag} {'on' if on else 'off'}"
