"""Prompt text: duration/resolution templates for prose, metadata injection for JSON captions."""

import json
import logging

import pytest

from cosmos3_runtime.prompts import (
    PromptOptions,
    append_sentence,
    inject_caption_metadata,
    negative_text,
    parse_caption,
    positive_text,
)

VIDEO = PromptOptions(num_frames=189, height=480, width=832, fps=24.0)
IMAGE = PromptOptions(num_frames=1, height=640, width=640, fps=24.0)


def test_caption_metadata_vectors():
    caption = inject_caption_metadata({"temporal_caption": "a cat"}, VIDEO)
    assert caption == {"temporal_caption": "a cat", "resolution": {"H": 480, "W": 832}, "duration": "7s", "fps": 24.0}


def test_image_caption_drops_duration_and_fps():
    caption = inject_caption_metadata({"duration": "5s", "fps": 30, "subjects": ["cat"]}, IMAGE)
    assert caption == {"subjects": ["cat"], "resolution": {"H": 640, "W": 640}}


def test_request_resolution_overrides_the_caption_in_place():
    caption = inject_caption_metadata({"aspect_ratio": "16,9", "resolution": {"H": 1, "W": 2}, "x": 1}, VIDEO)
    assert list(caption) == ["aspect_ratio", "resolution", "x", "duration", "fps"]
    assert caption["resolution"] == {"H": 480, "W": 832}


def test_fps_zero_gives_zero_seconds():
    assert inject_caption_metadata({}, PromptOptions(81, 480, 832, 0.0))["duration"] == "0s"


@pytest.mark.parametrize("prompt", ["a cat", '["a", "list"]', '"a string"', "", "42", "{not json"])
def test_only_json_objects_are_captions(prompt):
    assert parse_caption(prompt) is None


def test_malformed_json_object_warns_and_is_prose(caplog):
    with caplog.at_level(logging.WARNING):
        text = positive_text('{"temporal_caption": "a cat"', VIDEO)
    assert "not valid JSON" in caplog.text
    assert text.endswith("The video is 7.9 seconds long and is of 24 FPS. This video is of 480x832 resolution.")


def test_structured_caption_has_no_prose_suffix_but_prose_does():
    structured = positive_text('{"temporal_caption": "a dog runs"}', VIDEO)
    assert json.loads(structured)["duration"] == "7s" and "seconds long" not in structured
    assert structured == json.dumps(json.loads(structured))  # json.dumps defaults, ASCII-escaped
    assert positive_text("a dog runs", VIDEO) == (
        "a dog runs. The video is 7.9 seconds long and is of 24 FPS. This video is of 480x832 resolution."
    )


def test_json_captions_can_be_treated_as_prose():
    options = PromptOptions(81, 480, 832, 24.0, json_captions=False)
    assert positive_text('{"a": 1}', options).startswith('{"a": 1}. The video is 3.4 seconds long')


def test_join_rule_strips_only_periods():
    assert append_sentence("A cat. ", "X.") == "A cat. . X."
    assert append_sentence("Wow!", "X.") == "Wow!. X."
    assert append_sentence("Done...", "X.") == "Done. X."
    assert append_sentence("", "X.") == "X."


def test_number_formatting_follows_python_rounding():
    text = positive_text("", PromptOptions(num_frames=5, height=16, width=16, fps=2.5))
    assert text.startswith("The video is 2.0 seconds long and is of 2 FPS.")


def test_negative_prompt_gets_negated_templates():
    options = PromptOptions(num_frames=189, height=720, width=1280, fps=24.0)
    assert negative_text("", options) == (
        "The video is not 7.9 seconds long and is not of 24 FPS. This video is not of 720x1280 resolution."
    )
    assert negative_text("", IMAGE) == "This image is not of 640x640 resolution."


def test_json_negative_prompt_is_kept_as_given():
    negative = '{"quality": "blurry, distorted"}'
    assert negative_text(negative, VIDEO) == negative


def test_templates_can_be_switched_off():
    options = PromptOptions(81, 480, 832, 24.0, add_resolution_template=False, add_duration_template=False)
    assert positive_text("a cat", options) == "a cat"
    only_resolution = PromptOptions(81, 480, 832, 24.0, add_duration_template=False)
    assert positive_text("a cat", only_resolution) == "a cat. This video is of 480x832 resolution."


def test_system_prompts_are_the_trained_strings():
    assert VIDEO.system_prompt == "You are a helpful assistant who will generate videos from a give prompt."
    assert IMAGE.system_prompt == "You are a helpful assistant who will generate images from a give prompt."
    assert PromptOptions(1, 16, 16, 24.0, use_system_prompt=False).system_prompt is None


def test_an_empty_prompt_warns_that_the_video_is_unconditioned(tiny_gated, caplog):
    from cosmos3_runtime.pipeline import planner

    planning = planner(tiny_gated, "cpu", "fp32")
    for empty in ("", "   "):
        notes = planning.plan(empty, num_frames=5, width=64, height=48).settings.notes
        assert any("the prompt is empty: the video is unconditioned" in note for note in notes)
    assert not any("empty" in note for note in planning.plan("a cat", num_frames=5, width=64, height=48).settings.notes)


@pytest.mark.parametrize("prompts", [["a cat", ""], '["a cat", "  "]'])
def test_an_empty_prompt_in_a_list_is_refused_by_its_index(tiny_gated, prompts):
    from cosmos3_runtime.errors import InputError
    from cosmos3_runtime.pipeline import planner

    with pytest.raises(InputError, match=r"prompt 2 of the 2 in the list \(chunk 2\) is empty"):
        planner(tiny_gated, "cpu", "fp32").plan(prompts, num_frames=9, chunk_frames=5, width=64, height=48)
