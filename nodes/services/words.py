"""Errors in a node's words: queue-time validation results and errors raised while a node runs."""

from contextlib import contextmanager

from ...cosmos3_runtime.errors import InputError, reworded


def validation(check, value, names: dict[str, str] | None = None) -> bool | str:
    """A VALIDATE_INPUTS result: True, or the error text that the front end shows on the node (`names`: the API
    names in it -> the node's widget names)."""
    try:
        check()
    except InputError as exc:
        return f"{reworded(str(exc), names or {})} (got {value!r})"
    return True


@contextmanager
def widget_words(names: dict[str, str]):
    """Errors raised inside come out in the node's words: the API names in `names` -> its widget names."""
    try:
        yield
    except InputError as exc:
        raise type(exc)(reworded(str(exc), names)) from exc
