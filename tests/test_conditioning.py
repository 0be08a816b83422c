"""User images and clips into conditioning pixels, and held frames."""

import numpy as np
import pytest
import torch

from cosmos3_runtime.conditioning import (Held, frame_count, frame_size, pad_with_last_frame, preprocess_image,
                                          preprocess_video)
from cosmos3_runtime.errors import InputError


def test_held_frames_stay_exactly_clean_and_the_rest_passes_through():
    clean, x = torch.randn(1, 2, 3, 2, 2), torch.randn(1, 2, 3, 2, 2)
    held = Held(clean, torch.tensor([0.0, 1.0, 0.0]).view(3, 1, 1))
    out = held.hold(x)
    assert torch.equal(out[:, :, 1], clean[:, :, 1]) and torch.equal(out[:, :, [0, 2]], x[:, :, [0, 2]])


def test_a_short_clip_repeats_its_last_frame():
    frames = torch.arange(2.0).view(1, 1, 2, 1, 1).expand(1, 3, 2, 1, 1)
    padded = pad_with_last_frame(frames, 4)
    assert padded[0, 0, :, 0, 0].tolist() == [0.0, 1.0, 1.0, 1.0]
    assert pad_with_last_frame(frames, 1) is frames  # never cut


@pytest.mark.parametrize("image", [
    np.full((20, 40, 3), 255, dtype=np.uint8),  # uint8
    torch.ones(1, 20, 40, 3),  # ComfyUI IMAGE in 0..1
    torch.ones(20, 40, 3) * 255.0,  # floats in 0..255
])
def test_an_image_in_any_accepted_form_is_covered_and_cropped_to_the_size(image):
    pixels = preprocess_image(image, 16, 16)
    assert pixels.shape == (1, 3, 16, 16) and torch.equal(pixels, torch.ones_like(pixels))


def test_an_image_is_cropped_from_its_centre():
    image = torch.zeros(16, 48, 3)
    image[:, 16:32] = 1.0  # the middle third white
    assert torch.equal(preprocess_image(image, 16, 16), torch.ones(1, 3, 16, 16))


def test_clips_are_counted_sized_and_checked():
    clip = torch.rand(5, 12, 20, 3)
    assert frame_count(clip) == 5 and frame_size(clip) == (12, 20)
    assert preprocess_video(clip, 8, 8).shape == (1, 3, 5, 8, 8)
    with pytest.raises(InputError, match="floats in 0..1"):
        preprocess_video(clip * 2, 8, 8)
    with pytest.raises(InputError, match="one picture"):
        preprocess_image(torch.rand(2, 8, 8, 3), 8, 8)
