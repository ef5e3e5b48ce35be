"""A responder for FakeLLM that answers per input: a plan per input text
(the request's last user message), called with how many requests that input
had before, so a test can script a first attempt and a re-run apart; and the
time of every request per input, so a step asked twice shows at the model
server. Shared by the outage tests and the chaos drills."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tests.fakes.fake_llm import Reply

Plan = Callable[[int, dict[str, Any]], Reply]


def last_role(body: dict[str, Any]) -> str | None:
    messages = body.get("messages") or []
    return messages[-1].get("role") if messages else None


class PlannedModel:
    def __init__(self, *, after_tool: str = "ok") -> None:
        self.plans: dict[str, Plan] = {}
        self.seen: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        self._after_tool = after_tool  # the unplanned answer to a request that ends with a tool result

    def __call__(self, body: dict[str, Any]) -> Reply:
        users = [m.get("content") for m in body.get("messages") or [] if m.get("role") == "user"]
        text = str(users[-1]) if users else ""
        with self._lock:
            times = self.seen.setdefault(text, [])
            n = len(times)
            times.append(time.time())
        plan = self.plans.get(text)
        if plan is not None:
            return plan(n, body)
        return Reply(text=self._after_tool if last_role(body) == "tool" else "ok")

    def requests(self, text: str) -> list[float]:
        with self._lock:
            return list(self.seen.get(text, []))

    def total(self) -> int:
        with self._lock:
            return sum(len(t) for t in self.seen.values())
