"""The time estimate: FLOPs counted on the meta device from the configs, forwards counted from the run's geometry."""

import pytest
import torch

from cosmos3_runtime import timing
from cosmos3_runtime.geometry import RunGeometry
from cosmos3_runtime.tiny import vae_config
from cosmos3_runtime.transformer import TransformerConfig
from cosmos3_runtime.vae import VAEConfig

CONFIG = TransformerConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16)
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fixed_rates(monkeypatch):
    monkeypatch.setattr(timing, "rates", lambda device, dtype, channels=32: (1e12, 1e11))  # no timing in tests


@pytest.mark.parametrize("geometry, steps, forwards", [
    (RunGeometry(64, 64, 9, 9), 10, 10),
    (RunGeometry(64, 64, 9, 9, guided=True), 10, 20),
    (RunGeometry(64, 64, 9, 21, windows=3, overlap=1, controls=1, guided=True, control_guided=True), 4, 36),
])
def test_forwards_are_steps_times_passes_times_windows(geometry, steps, forwards):
    t = timing.generation(CONFIG, None, geometry, steps, 20, decode=False, dtype=torch.float32, device=CPU)
    assert t.forwards == forwards and t.decode_flops == 0
    assert t.seconds == pytest.approx(forwards * t.forward_flops / 1e12)


def test_a_forward_costs_more_with_more_frames_text_and_controls():
    base = timing.forward_flops(CONFIG, (2, 4, 4), 20, 0, torch.float32)
    assert timing.forward_flops(CONFIG, (3, 4, 4), 20, 0, torch.float32) > base
    assert timing.forward_flops(CONFIG, (2, 4, 4), 40, 0, torch.float32) > base
    assert timing.forward_flops(CONFIG, (2, 4, 4), 20, 1, torch.float32) > 1.5 * base  # a control doubles the media


def test_the_decode_is_counted_per_window_and_grows_with_the_clip():
    vae = VAEConfig.from_dict(vae_config())
    one = timing.decode_flops(vae, 1, 2, 2, torch.float32)
    three = timing.decode_flops(vae, 3, 2, 2, torch.float32)
    assert 0 < one < three
    t = timing.generation(CONFIG, vae, RunGeometry(32, 32, 9, 17, windows=2, overlap=1), 1, 20, decode=True,
                          dtype=torch.float32, device=CPU)
    assert t.decode_flops == pytest.approx(2 * three)
    assert "VAE decode" in t.describe()


@pytest.mark.parametrize("seconds, said", [(30, "30 s"), (600, "10 min"), (7200, "2.0 h")])
def test_durations_read_as_a_person_would_say_them(seconds, said):
    assert timing.duration(seconds) == said
