"""The chat completions route without a server: OpenAI-shaped requests become checked calls and a graph of the
pack's nodes, the graph runs like a workflow and answers what `reason` answers, and the reply has OpenAI's shape.
Over real HTTP inside ComfyUI, with the real `openai` client, it is tested in test_comfyui_server.py."""

import base64
import importlib
import io
import shutil

import numpy as np
import pytest
from PIL import Image

from comfy_harness import CORE_NODES, execute

MODEL = "Cosmos3-Nano"


@pytest.fixture(scope="module")
def chat(pack):
    return importlib.import_module(f"{pack.serving.__name__}.chat")


@pytest.fixture
def nano_dir(tmp_path, monkeypatch, tiny_factory):
    root = tmp_path / "models"
    shutil.copytree(tiny_factory(kind="gated"), root / MODEL)
    shutil.copytree(tiny_factory(kind="gated", reasoner=False), root / "Cosmos3-Diffusers-Only")
    monkeypatch.setenv("COSMOS3_MODEL_DIRS", str(root))
    (tmp_path / "input").mkdir()
    Image.fromarray(PICTURE).save(tmp_path / "input" / "table.png")
    (tmp_path / "secret.png").write_bytes((tmp_path / "input" / "table.png").read_bytes())
    monkeypatch.setenv("COSMOS3_INPUT_DIR", str(tmp_path / "input"))
    return root / MODEL


def data_url(array: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


PICTURE = np.random.default_rng(0).integers(0, 256, (50, 80, 3), dtype=np.uint8)


def run_graph(chat, pack, call) -> dict:
    """What the route does, without ComfyUI's queue: the request's prompt executed by the harness."""
    import asyncio

    loop = asyncio.new_event_loop()
    try:
        with pack.serving.jobs.Job({"call": call, "loop": loop, "queue": asyncio.Queue()}, 0) as job:
            execute(chat.prompt_graph(call, job.key), {**pack.NODE_CLASS_MAPPINGS, **CORE_NODES})
            return job.results
    finally:
        loop.close()


def user(*parts, text="What is this?"):
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


def test_a_chat_request_runs_as_a_graph_and_answers_what_reason_answers(chat, pack, nano_dir):
    import cosmos3_runtime

    checkpoints = chat.reasoning_checkpoints()
    assert checkpoints.capable == (MODEL,)  # the diffusers-only folder has no Reasoner root files
    body = {"messages": user(image_part(data_url(PICTURE))), "max_tokens": 6, "temperature": 0, "n": 2}
    call = chat.parse_chat(body, checkpoints)
    assert call.model == MODEL and call.choices == 2 and call.messages[0]["content"][0] == {"type": "image"}
    answers = run_graph(chat, pack, call)
    expected = cosmos3_runtime.load(nano_dir, device="cpu").reason("What is this?", images=[PICTURE], max_new_tokens=6,
                                                                   temperature=0.0)
    assert [answers[c].token_ids for c in (0, 1)] == [expected.token_ids] * 2  # greedy: both choices alike
    reply = chat.completion(call, "chatcmpl-x", 0, answers)
    assert reply["object"] == "chat.completion" and reply["choices"][0]["message"] == {"role": "assistant",
                                                                                       "content": expected.text}
    assert reply["usage"] == {"prompt_tokens": len(expected.prompt_ids), "completion_tokens": 12,
                              "total_tokens": len(expected.prompt_ids) + 12}
    named = chat.parse_chat({"messages": user(image_part("table.png")), "max_tokens": 6, "temperature": 0},
                            checkpoints)  # a file in the input folder, by name
    assert (named.images[0] == call.images[0]).all()


def test_thinking_comes_back_as_reasoning_content(chat, pack, nano_dir):
    body = {"messages": user(text="Why does the cube fall?"), "max_tokens": 5,
            "chat_template_kwargs": {"enable_thinking": True}}
    call = chat.parse_chat(body, chat.reasoning_checkpoints())
    assert call.options["thinking"] is True
    answers = run_graph(chat, pack, call)
    message = chat.completion(call, "x", 0, answers)["choices"][0]["message"]
    assert set(message) == {"role", "content", "reasoning_content"} and message["reasoning_content"] == answers[0].thinking


@pytest.mark.parametrize("change, field, status", [
    ({"messages": []}, "messages", 400),
    ({"model": "Cosmos3-Missing"}, "model", 404),
    ({"max_tokens": 0}, "max_tokens", 400),
    ({"max_completion_tokens": 10**6}, "max_completion_tokens", 400),
    ({"max_tokens": 5, "max_completion_tokens": 5}, "max_tokens", 400),
    ({"temperature": 3}, "temperature", 400),
    ({"top_p": 0}, "top_p", 400),
    ({"n": 9}, "n", 400),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", 400),
    ({"seed": "x"}, "seed", 400),
    ({"stream": "yes"}, "stream", 400),
    ({"logprobs": True}, "logprobs", 400),
    ({"tools": []}, "tools", 400),
    ({"chat_template_kwargs": {"enable_thinking": "on"}}, "chat_template_kwargs.enable_thinking", 400),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", 400),
    ({"messages": user({"type": "input_audio"})}, "messages[0].content[0].type", 400),
    ({"messages": user(image_part("https://example.com/a.png"))}, "messages[0].content[0]", 400),
    ({"messages": user(image_part("../secret.png"))}, "messages[0].content[0]", 400),
    ({"messages": user(image_part("/etc/passwd"))}, "messages[0].content[0]", 400),
    ({"messages": user(image_part("data:image/png;base64,AAAA"))}, "messages[0].content[0]", 400),
    ({"messages": user({"type": "video_url", "video_url": {"url": "clip.mp4", "fps": 0}})},
     "messages[0].content[0].video_url.fps", 400),
])
def test_bad_requests_are_refused_naming_the_field(chat, nano_dir, change, field, status):
    body = {"model": MODEL, "messages": user(), **change}
    with pytest.raises(Exception) as caught:
        chat.parse_chat(body, chat.reasoning_checkpoints())
    assert getattr(caught.value, "field", None) == field and caught.value.status == status, str(caught.value)


def test_a_video_part_is_decoded_at_the_requested_fps(chat, nano_dir, tmp_path):
    import av

    clip = tmp_path / "input" / "clip.mp4"
    with av.open(str(clip), "w") as container:
        stream = container.add_stream("libx264", rate=12)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        for i in range(24):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.full((64, 96, 3), 9 * i, np.uint8), format="rgb24")))
        container.mux(stream.encode())
    data = "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()
    for url, fps in ((data, 2), ("clip.mp4", 4)):
        part = {"type": "video_url", "video_url": {"url": url, "fps": fps}}
        call = chat.parse_chat({"messages": user(part)}, chat.reasoning_checkpoints())
        (video,) = call.videos
        assert video.fps == 12.0 and video.sample_fps == fps and len(video.frames) == len(video.indices) == 2 * fps
    nim = chat.parse_chat({"messages": user({"type": "video_url", "video_url": {"url": "clip.mp4"}}),
                           "media_io_kwargs": {"video": {"fps": 1.0}}}, chat.reasoning_checkpoints())
    assert nim.videos[0].sample_fps == 1.0


def test_stream_deltas_add_up_to_the_answer(pack):
    """What the stream sends for a reply written token by token (the thinking split of a reply still being
    written holds back a tag in progress), added up, is the final split."""
    from cosmos3_runtime.reasoner import split_thinking

    reply = "<think>\nThe cube overhangs the edge.\n</think>\n\nIt falls."
    sent = ("", "")
    for end in range(len(reply) + 1):
        parts = split_thinking(reply[:end], final=end == len(reply))
        assert all(new.startswith(old) for new, old in zip(parts, sent)), (end, parts, sent)
        sent = parts
    assert sent == ("The cube overhangs the edge.", "It falls.")
