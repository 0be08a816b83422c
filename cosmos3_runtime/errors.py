"""Error types the runtime raises for problems a user can fix.

Every message names what is wrong (a file, a key, a size) and what to do about it, so the ComfyUI
layer can show it as is.
"""


class Cosmos3Error(Exception):
    """Base class of the runtime's user-facing errors."""


class CheckpointError(Cosmos3Error, ValueError):
    """A checkpoint folder, config file or weight file is missing, malformed or incompatible."""

    def __init__(self, message: str):
        # one line, whatever a library (the Hub, safetensors, json) put into the text it quotes
        super().__init__(" ".join(line.strip() for line in str(message).splitlines() if line.strip()))


class InputError(Cosmos3Error, ValueError):
    """A generation request asks for something the model or the runtime cannot do."""


class LimitError(InputError):
    """An input is over a size limit the caller set (for example an uploaded image's pixels)."""
