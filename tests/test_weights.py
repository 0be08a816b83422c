"""The weight formats behind one protocol (`cosmos3_runtime.weights`): each format implements it, `detect` picks the
format from the files before any weight is read, the package knows nothing of the model above it, and the precision
policy keeps its earlier fp8 names as aliases."""

import inspect

import pytest

from cosmos3_runtime.checkpoint import Checkpoint
from cosmos3_runtime.errors import InputError
from cosmos3_runtime.request import Request, add_arguments, options_from_args
from cosmos3_runtime.weights import DECLARED, detect
from cosmos3_runtime.weights.files import Dense
from cosmos3_runtime.weights.format import WeightFormat
from cosmos3_runtime.weights.gguf import GGUF
from cosmos3_runtime.weights.local_fp8 import LocalFp8
from test_pack import import_graph

FORMATS = (Dense, LocalFp8, GGUF, *DECLARED.values())


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.__name__)
def test_every_format_implements_the_protocol(fmt):
    for name, method in inspect.getmembers(WeightFormat, inspect.isfunction):
        if not name.startswith("_"):
            assert list(inspect.signature(getattr(fmt, name)).parameters) == \
                list(inspect.signature(method).parameters), (fmt, name)


def test_detect_names_the_format_before_any_weight_is_read(tiny_gated, tiny_gguf, monkeypatch):
    from cosmos3_runtime.weights import files, gguf

    monkeypatch.setattr(files, "_tensors", lambda *a: pytest.fail("a weight was read"))
    monkeypatch.setattr(gguf, "load_gguf_weights", lambda *a, **k: pytest.fail("a GGUF weight was read"))
    checkpoint = Checkpoint(tiny_gated)
    assert isinstance(detect(checkpoint), Dense) and detect(checkpoint).describe() == "dense weights"
    scaled = "fp8 made at load (scaled fp8 matmuls in the media blocks)"
    assert detect(checkpoint, quantize="fp8_scaled").describe() == scaled
    assert isinstance(detect(checkpoint, tiny_gguf), GGUF)
    with pytest.raises(InputError, match="a GGUF file is already quantized"):
        detect(checkpoint, tiny_gguf, "fp8")


def test_the_formats_know_nothing_of_the_model_above_them():
    """weights/ imports the runtime's errors and device record only (its converter command also the checkpoint and the
    transformer's key names): a format never reaches into runs, settings or the pipeline."""
    below = {"cosmos3_runtime.errors", "cosmos3_runtime.devices"}
    for module, targets in import_graph().items():
        if module.startswith("cosmos3_runtime.weights"):
            outside = {t for t in targets if not t.startswith("cosmos3_runtime.weights")} - below
            allowed = {"cosmos3_runtime.checkpoint", "cosmos3_runtime.transformer"} if module.endswith("gguf_convert") \
                else set()
            assert outside <= allowed, (module, outside)


def test_the_precision_options_keep_their_fp8_names(capsys):
    """`fp8_policy`, `fp8_first_steps` and `fp8_last_steps` are the precision options' earlier names: taken as
    keyword options and flags; both names at once is refused."""
    import argparse

    r = Request.build(fp8_policy="off", fp8_first_steps=1, fp8_last_steps=2)
    assert (r.precision_policy, r.precision_first_steps, r.precision_last_steps) == ("off", 1, 2)
    with pytest.raises(InputError, match="fp8_policy is precision_policy's earlier name"):
        Request.build(fp8_policy="off", precision_policy="on")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for flags in (["--fp8-policy", "on", "--fp8-last-steps", "0"], ["--precision-policy", "on",
                                                                      "--precision-last-steps", "0"]):
        options = options_from_args(parser.parse_args(flags))
        assert options["precision_policy"] == "on" and options["precision_last_steps"] == 0

