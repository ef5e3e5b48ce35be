"""What an MCP tool's images become: bounded in the log (runtime/storable.py),
prepared per model capability (llm.types.for_model), and sent by the OpenAI
adapter as image parts in a user message after the step's tool results,
counted at the fake model server."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from sessions_app.llm.openai import OpenAIAdapter
from sessions_app.llm.types import IMAGES_NOT_SHOWN, for_model
from sessions_app.runtime import storable
from tests.fakes.fake_llm import FakeLLM, Reply

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40).decode()


def image(data: str = PNG, mime: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "mime_type": mime, "data": data}


def test_images_are_kept_whole_within_the_limits(settings: Any) -> None:
    settings.TERRET_MAX_TOOL_IMAGES = 2
    settings.TERRET_MAX_TOOL_IMAGE_CHARS = 1000
    too_big = base64.b64encode(b"x" * 900).decode()  # 1200 characters
    text, kept = storable.fit_attachments(
        "t", [image(), image(too_big), image(mime="image/tiff"), image("not base64!"), image(), image()]
    )
    assert kept == [image(), image()]  # the 1st and 5th; the 6th is over the count
    assert "[image 2 (image/png, 1200 base64 characters) left out by Terret: larger than 1000" in text
    assert "[image 3 (image/tiff" in text and "[image 4 (image/png" in text
    sixth = f"[image 6 (image/png, {len(PNG)} base64 characters) left out by Terret: a result keeps at most 2 images]"
    assert sixth in text


def test_all_images_together_stay_within_half_an_event(settings: Any) -> None:
    settings.TERRET_MAX_EVENT_BYTES = 4000
    big = base64.b64encode(b"y" * 1200).decode()  # 1600 characters each
    _, kept = storable.fit_attachments("t", [image(big), image(big), image(big)])
    assert len(kept) == 1


def tool_turn(attachments: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    tool = {"role": "tool", "tool_call_id": "c1", "content": "[image 1: image/png, 48 bytes]"}
    if attachments:
        tool["attachments"] = attachments
    calls = [{"id": "c1", "type": "function", "function": {"name": "mcp.x.pic", "arguments": "{}"}}]
    return [{"role": "user", "content": "pic?"}, {"role": "assistant", "content": None, "tool_calls": calls}, tool]


def test_for_model_keeps_images_for_an_image_model_and_describes_them_otherwise() -> None:
    with_images = for_model(tool_turn([image()]), images=True)
    assert with_images[-1]["images"] == [image()] and "attachments" not in with_images[-1]
    text_only = for_model(tool_turn([image()]), images=False)
    assert "images" not in text_only[-1] and "attachments" not in text_only[-1]
    assert text_only[-1]["content"].endswith(IMAGES_NOT_SHOWN.format(n=1))
    plain = tool_turn(None)
    assert for_model(plain, images=True) is plain  # nothing to do: the same list


@pytest.mark.parametrize("prepared", [True, False])
def test_the_adapter_sends_images_only_when_prepared_for_an_image_model(prepared: bool) -> None:
    messages = for_model(tool_turn([image()]), images=True) if prepared else tool_turn([image()])
    with FakeLLM() as llm:
        llm.script(Reply(text="a logo"))
        OpenAIAdapter(base_url=llm.base_url, api_key="k", retries=0).complete("test/model", messages, [])
        (sent,) = llm.requests
    wire = sent["messages"]
    assert [m["role"] for m in wire] == (
        ["user", "assistant", "tool", "user"] if prepared else ["user", "assistant", "tool"]
    )
    assert all("attachments" not in m and "images" not in m for m in wire)
    if prepared:
        text, part = wire[-1]["content"]
        assert text == {"type": "text", "text": "The image(s) returned by tool call c1, in order:"}
        assert part == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}
    else:  # never prepared (a compaction's request): text only, described
        assert wire[-1]["content"].endswith(IMAGES_NOT_SHOWN.format(n=1))
