"""PromptTokenizer: chat-template rendering, ids ending [eos, <|vision_start|>], max_length cuts, and bad folders."""

import json
import logging
import shutil

import pytest

from cosmos3_runtime import InputError
from cosmos3_runtime.checkpoint import Checkpoint
from cosmos3_runtime.errors import CheckpointError
from cosmos3_runtime.tokenizer import VISION_START, PromptTokenizer, load_chat_template

TEXT = "A robot arm picks up a red cube on a wooden table."
SYSTEM = "You are a helpful assistant who will generate videos from a give prompt."


@pytest.fixture(scope="module")
def tokenizer(tiny_gated):
    return PromptTokenizer(Checkpoint(tiny_gated).tokenizer_dir())


@pytest.fixture
def folder(tiny_gated, tmp_path):
    """A writable copy of the tiny checkpoint's tokenizer folder."""
    return shutil.copytree(Checkpoint(tiny_gated).tokenizer_dir(), tmp_path / "tokenizer")


def test_special_ids_come_from_the_config_and_the_vocabulary(tokenizer):
    assert tokenizer.special_tokens["eos_token"] == "<|im_end|>"
    assert tokenizer.eos_id == tokenizer.tokenizer.token_to_id("<|im_end|>")
    assert tokenizer.vision_start_id == tokenizer.tokenizer.token_to_id(VISION_START)
    assert tokenizer.eos_id != tokenizer.vision_start_id


def test_render_puts_the_system_turn_before_the_user_turn(tokenizer):
    user_turn = f"<|im_start|>user\n{TEXT}<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.render(TEXT, None) == user_turn
    assert tokenizer.render(TEXT, SYSTEM) == f"<|im_start|>system\n{SYSTEM}<|im_end|>\n" + user_turn
    assert tokenizer.render(TEXT, "") == user_turn  # an empty system prompt is no system turn


def test_encode_is_the_rendered_turn_then_eos_and_vision_start(tokenizer):
    ids = tokenizer.encode(TEXT, None)
    assert ids[-2:] == [tokenizer.eos_id, tokenizer.vision_start_id]
    assert tokenizer.tokenizer.decode(ids[:-2], skip_special_tokens=False) == tokenizer.render(TEXT, None)
    assert tokenizer.tokenizer.decode(ids, skip_special_tokens=True) == f"user\n{TEXT}\nassistant\n"


def test_encode_adds_no_special_tokens_of_its_own(folder):
    """The rendered template already holds the turn markers: a post-processor's bos/eos are not added."""
    from tokenizers import Tokenizer, processors

    plain = PromptTokenizer(folder).encode(TEXT, None)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    pad = tokenizer.token_to_id("<|endoftext|>")
    tokenizer.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A <|endoftext|>",
                                                             special_tokens=[("<|endoftext|>", pad)])
    tokenizer.save(str(folder / "tokenizer.json"))
    with_post_processor = PromptTokenizer(folder)
    assert with_post_processor.tokenizer.encode("hi").ids[0] == pad  # the post-processor is live
    assert with_post_processor.encode(TEXT, None) == plain


def test_system_prompt_adds_its_turn_in_front_of_the_same_ids(tokenizer):
    plain, with_system = tokenizer.encode(TEXT, None), tokenizer.encode(TEXT, SYSTEM)
    assert with_system != plain
    # special tokens split the text, so the user turn tokenises the same after a system turn
    assert with_system[-len(plain):] == plain
    head = tokenizer.tokenizer.decode(with_system[: len(with_system) - len(plain)], skip_special_tokens=False)
    assert head == f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
    assert tokenizer.encode(TEXT, "") == plain


def test_max_length_cuts_the_prompt_but_keeps_the_cue(tokenizer, caplog):
    full = tokenizer.encode(TEXT, SYSTEM)
    cue = [tokenizer.eos_id, tokenizer.vision_start_id]
    with caplog.at_level(logging.WARNING, logger="cosmos3_runtime.tokenizer"):
        assert tokenizer.encode(TEXT, SYSTEM, max_length=len(full)) == full  # fits exactly: untouched
        assert tokenizer.encode(TEXT, SYSTEM, max_length=len(full) + 50) == full
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="cosmos3_runtime.tokenizer"):
        cut = tokenizer.encode(TEXT, SYSTEM, max_length=10)
    assert cut == full[:8] + cue
    assert f"prompt has {len(full)} tokens" in caplog.text
    assert tokenizer.encode(TEXT, SYSTEM, max_length=len(full) - 1) == full[:-3] + cue
    # nothing of the prompt fits: the cue alone, never a negative slice
    assert tokenizer.encode(TEXT, SYSTEM, max_length=2) == cue
    assert tokenizer.encode(TEXT, SYSTEM, max_length=1) == cue


def test_template_comes_from_tokenizer_config_without_a_jinja_file(folder):
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "TOOLS"},
                               {"name": "default", "template": "[{{ messages[-1]['content'] }}|{{ eos_token }}]"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert PromptTokenizer(folder).render("hi", None) == "[hi|<|im_end|>]"


def test_template_runs_sandboxed_and_raise_exception_is_an_input_error(folder):
    from jinja2.exceptions import SecurityError

    (folder / "chat_template.jinja").write_text("{{ messages.append(1) }}")
    with pytest.raises(SecurityError):
        PromptTokenizer(folder).render("hi", None)
    (folder / "chat_template.jinja").write_text("{{ raise_exception('no system turn allowed') }}")
    with pytest.raises(InputError, match="no system turn allowed"):
        PromptTokenizer(folder).render("hi", None)


def test_bad_folders_are_checkpoint_errors(folder):
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(CheckpointError, match="no chat template"):
        load_chat_template(folder, {})

    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": {"content": "<|nope|>"}}))
    with pytest.raises(CheckpointError, match="eos_token"):
        PromptTokenizer(folder)

    (folder / "tokenizer.json").write_text("{ not json")
    with pytest.raises(CheckpointError, match="cannot be read"):
        PromptTokenizer(folder)
