"""Per-variant defaults and overrides (the serving reference's defaults, our choices where references differ), table-driven."""

import pytest

from cosmos3_runtime import InputError, Variant
from cosmos3_runtime.request import Request
from cosmos3_runtime.settings import resolve

IMAGE, VIDEO = object(), object()  # only their presence matters here


def variant(edge=False, distilled=False, system_prompt=True):
    sigmas = (1.0, 0.9375, 0.8333333333333334, 0.625) if distilled else None
    return Variant(edge, distilled, sigmas, distilled, False, False, False, system_prompt, "Cosmos3OmniPipeline",
                   "UniPCMultistepScheduler")


GATED, EDGE, DISTILLED = variant(), variant(edge=True), variant(distilled=True)

# (variant, request, expected fields)
TABLE = [
    (GATED, {}, dict(width=1280, height=720, num_frames=81, fps=24.0, steps=35, guidance_scale=4.0, flow_shift=10.0,
                     schedule="unipc", guidance_interval=None, mode="t2v")),
    (GATED, {"num_frames": 1}, dict(width=1280, height=720, num_frames=1, guidance_scale=4.0, flow_shift=3.0,
                                    guidance_interval=(400.0, 1000.0), mode="t2i")),
    (EDGE, {}, dict(width=832, height=480, num_frames=81, guidance_scale=5.0, flow_shift=3.0, guidance_interval=None)),
    (EDGE, {"num_frames": 1}, dict(width=640, height=640, guidance_scale=7.0, flow_shift=3.0,
                                   guidance_interval=(400.0, 1000.0), mode="t2i")),
    (EDGE, {"image": IMAGE}, dict(width=832, height=480, guidance_scale=5.0, mode="i2v", condition_frames=(0,))),
    (GATED, {"video": VIDEO}, dict(mode="v2v", condition_frames=(0, 1), flow_shift=10.0)),
    (GATED, {"video": VIDEO, "condition_frame_indexes": (2, 0, 2)}, dict(condition_frames=(0, 2))),
    (EDGE, {"guidance_scale": 2.0, "flow_shift": 7.0, "steps": 12, "fps": 16}, dict(guidance_scale=2.0,
                                                                                    flow_shift=7.0, steps=12, fps=16.0)),
    (GATED, {"guidance_interval": (960, 1001)}, dict(guidance_interval=(960.0, 1001.0))),
    (GATED, {"num_frames": 1, "guidance_interval": "off"}, dict(guidance_interval=None)),
    (GATED, {"num_frames": 1, "guidance_interval": None}, dict(guidance_interval=None)),
    (GATED, {"schedule": "checkpoint"}, dict(schedule="checkpoint", flow_shift=None)),  # the config's own
    (GATED, {"schedule": "checkpoint", "flow_shift": 5.0}, dict(schedule="checkpoint", flow_shift=5.0)),
    (EDGE, {"width": 832}, dict(width=832, height=720)),  # one side given: no Edge default
    (GATED, {"num_frames": 83}, dict(num_frames=81)),
    (GATED, {"num_frames": 6}, dict(num_frames=5)),
    (EDGE, {"num_frames": 2}, dict(num_frames=1, width=832, height=480, guidance_scale=5.0, mode="t2i")),
    (DISTILLED, {}, dict(schedule="distilled", steps=4, guidance_scale=1.0, flow_shift=None, guidance_interval=None)),
    (DISTILLED, {"num_frames": 1}, dict(schedule="distilled", steps=4, guidance_scale=1.0, guidance_interval=None)),
    (variant(system_prompt=False), {}, dict(use_system_prompt=False)),
    (variant(system_prompt=False), {"use_system_prompt": True}, dict(use_system_prompt=True)),
    (GATED, {"negative_prompt": "blurry"}, dict(negative_prompt="blurry")),
]


@pytest.mark.parametrize("v, request_fields, expected", TABLE)
def test_defaults_and_overrides(v, request_fields, expected):
    settings = resolve(v, Request(**request_fields))
    assert {k: getattr(settings, k) for k in expected} == expected


def test_distilled_overrides_are_reported_not_silent():
    settings = resolve(DISTILLED, Request(steps=20, guidance_scale=7.0, flow_shift=5.0, negative_prompt="ugly"))
    assert (settings.steps, settings.guidance_scale, settings.negative_prompt) == (4, 1.0, "")
    notes = " ".join(settings.notes)
    for fragment in ("steps 20 ignored", "guidance 7.0 forced to 1.0", "flow_shift ignored", "negative prompt ignored"):
        assert fragment in notes


def test_causal_options_on_a_checkpoint_that_is_not_causal_are_noted():
    notes = resolve(GATED, Request(causal_cache="recompute", causal_window=8)).notes
    assert notes == ["causal_cache 'recompute', causal_window 8 ignored: this checkpoint is not causal (those options "
                     "are for causal checkpoints such as Cosmos3-Nano-Sim-Transfer and Sim-Bimanual)"]
    assert resolve(GATED, Request()).notes == []


def test_frame_rounding_and_edge_sizes_are_reported():
    assert "rounded to 81" in resolve(GATED, Request(num_frames=83)).notes[0]
    settings = resolve(EDGE, Request(width=1024, height=576))
    assert (settings.width, settings.height) == (1024, 576) and "1024x576 may look worse" in settings.notes[0]
    assert resolve(EDGE, Request(width=480, height=832)).notes == []


@pytest.mark.parametrize(
    "v, fields, message",
    [
        (GATED, {"width": 1000, "height": 720},
         r"width 1000 must be a positive multiple of 16 .* for example 992 \(size asked: 1000x720"),
        (GATED, {"image": IMAGE, "video": VIDEO}, "give one of an image .* a video or condition latents"),
        (GATED, {"image": IMAGE, "num_frames": 1}, "num_frames is 1"),
        (GATED, {"video": VIDEO, "num_frames": 9, "condition_frame_indexes": (3,)}, r"\[0, 2\]"),
        (GATED, {"fps": 0}, "fps must be positive"),
        (GATED, {"steps": 0}, "steps must be at least 1"),
        (GATED, {"schedule": "distilled"}, "needs a distilled checkpoint"),
        (DISTILLED, {"schedule": "checkpoint"}, "samples only with its fixed sigmas"),
        (GATED, {"schedule": "karras"}, "schedule must be one of"),
        (GATED, {"guidance_interval": (900, 100)}, "0 <= LOW <= HIGH"),
    ],
)
def test_bad_requests(v, fields, message):
    with pytest.raises(InputError, match=message):
        resolve(v, Request(**fields))  # variant-free problems already fail in Request()
