"""One peer system in a process of its own, for bench/peers.py (not run by `make bench` itself).

    python bench/_peer_runner.py SYSTEM DATABASE_URL MODEL_BASE_URL [--recover AGENT_ID]

SYSTEM is `dbos` (DBOS Transact: a workflow of steps), `langgraph` (a
StateGraph of a model node and a tool node, PostgresSaver) or `prebuilt`
(LangGraph's prebuilt ReAct agent with ChatOpenAI, PostgresSaver). Each runs
the same agent loop as a Terret turn: call the model (OpenAI chat
completions, streamed), run the no-op tool it asks for, until it answers
with text; each with its own default durability (DBOS: every step recorded
before the next; LangGraph: durability="async").

Commands arrive on stdin, one JSON object a line; answers go to stdout the
same way (library logs go to stderr):
  {"op": "seq", "prompts": [...]}    run agents one after another -> {"walls": [s...], "cpu": s}
  {"op": "burst", "prompts": [...]}  all at once, one thread each -> {"wall": s, "cpu": s}
  {"op": "start", "id": ..., "prompt": ...}  start one in the background -> {"started": id}
With --recover, the process boots, resumes AGENT_ID (DBOS recovers its
pending workflows by itself at launch; LangGraph resumes the thread it is
told, from its last checkpoint) and prints {"done": epoch seconds} when the
agent has finished.
"""

from __future__ import annotations

import json
import operator
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

# The protocol owns the real stdout; everything printed by a library goes to stderr.
PROTO = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

WIRE_TOOL = "debug__noop"  # what the bench's model server calls Terret's debug.noop on the wire
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": WIRE_TOOL,
            "description": "Does nothing.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
MODEL = "bench/model"


class Model:
    """A streaming chat-completions client: one httpx client for every thread."""

    def __init__(self, base_url: str) -> None:
        import httpx

        self.url = base_url.rstrip("/") + "/chat/completions"
        self.client = httpx.Client(
            timeout=httpx.Timeout(120.0), limits=httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
        )

    def call(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"model": MODEL, "messages": messages, "tools": TOOLS, "stream": True}
        content: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        with self.client.stream("POST", self.url, json=body, headers={"Authorization": "Bearer bench"}) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                for choice in json.loads(data).get("choices") or []:
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        content.append(delta["content"])
                    for tc in delta.get("tool_calls") or []:
                        slot = calls.setdefault(
                            tc.get("index", 0),
                            {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                        )
                        slot["id"] = tc.get("id") or slot["id"]
                        fn = tc.get("function") or {}
                        slot["function"]["name"] += fn.get("name") or ""
                        slot["function"]["arguments"] += fn.get("arguments") or ""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return message


class State(TypedDict):
    """The StateGraph's state: the conversation, appended to by each node."""

    messages: Annotated[list[dict[str, Any]], operator.add]


def noop_tool(call: dict[str, Any]) -> str:
    return "ok"


Run = Callable[[str, str], Any]  # (agent id, prompt) -> final answer
Recover = Callable[[str], Any]  # agent id -> final answer


def build_dbos(url: str, base_url: str) -> tuple[Run, Run, Recover]:
    from dbos import DBOS, SetWorkflowID

    model = Model(base_url)
    DBOS(config={"name": "bench-peers", "system_database_url": url, "log_level": "WARNING"})

    @DBOS.step()
    def model_step(messages: list[dict[str, Any]]) -> dict[str, Any]:
        return model.call(messages)

    @DBOS.step()
    def tool_step(call: dict[str, Any]) -> str:
        return noop_tool(call)

    @DBOS.workflow()
    def agent(prompt: str) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        while True:
            message = model_step(messages)
            messages.append(message)
            if not message.get("tool_calls"):
                return str(message["content"])
            for call in message["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": tool_step(call)})

    DBOS.launch()  # recovers this executor's pending workflows, in the background

    def run(agent_id: str, prompt: str) -> Any:
        with SetWorkflowID(agent_id):
            return agent(prompt)

    def start(agent_id: str, prompt: str) -> Any:
        with SetWorkflowID(agent_id):
            return DBOS.start_workflow(agent, prompt)

    def recover(agent_id: str) -> Any:
        return DBOS.retrieve_workflow(agent_id).get_result()

    return run, start, recover


def _checkpointer(url: str) -> Any:
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    # The connection settings LangGraph's documentation gives for a pool.
    pool = ConnectionPool(
        url, max_size=20, kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}, open=True
    )
    saver = PostgresSaver(pool)
    saver.setup()
    return saver


def build_langgraph(
    url: str, base_url: str, prebuilt: bool
) -> tuple[Run, Callable[[str, str], Any], Callable[[str], Any]]:
    saver = _checkpointer(url)
    graph: Any
    if prebuilt:
        from langchain_core.tools import tool
        from langchain_openai import ChatOpenAI
        from langgraph.prebuilt import create_react_agent

        @tool(WIRE_TOOL)
        def noop() -> str:
            """Does nothing."""
            return "ok"

        llm = ChatOpenAI(model=MODEL, base_url=base_url, api_key="bench", streaming=True)  # type: ignore[arg-type]
        graph = create_react_agent(llm, [noop], checkpointer=saver)

        def first(prompt: str) -> dict[str, Any]:
            return {"messages": [("user", prompt)]}
    else:
        from langgraph.graph import END, START, StateGraph

        model = Model(base_url)

        def model_node(state: State) -> dict[str, Any]:
            return {"messages": [model.call(state["messages"])]}

        def tools_node(state: State) -> dict[str, Any]:
            calls = state["messages"][-1]["tool_calls"]
            return {"messages": [{"role": "tool", "tool_call_id": c["id"], "content": noop_tool(c)} for c in calls]}

        def route(state: State) -> str:
            return "tools" if state["messages"][-1].get("tool_calls") else END

        builder = StateGraph(State)
        builder.add_node("model", model_node)
        builder.add_node("tools", tools_node)
        builder.add_edge(START, "model")
        builder.add_conditional_edges("model", route, ["tools", END])
        builder.add_edge("tools", "model")
        graph = builder.compile(checkpointer=saver)

        def first(prompt: str) -> dict[str, Any]:
            return {"messages": [{"role": "user", "content": prompt}]}

    def config(agent_id: str) -> dict[str, Any]:
        return {"configurable": {"thread_id": agent_id}, "recursion_limit": 200}

    def run(agent_id: str, prompt: str) -> Any:
        return graph.invoke(first(prompt), config(agent_id))

    def start(agent_id: str, prompt: str) -> Any:
        threading.Thread(target=run, args=(agent_id, prompt), daemon=True).start()

    def recover(agent_id: str) -> Any:
        return graph.invoke(None, config(agent_id))  # from the thread's last checkpoint

    return run, start, recover


def _process_cpu() -> float:
    """User + system CPU of this process since it started, its boot included."""
    t = os.times()
    return t.user + t.system


def answer(payload: dict[str, Any]) -> None:
    PROTO.write(json.dumps(payload) + "\n")
    PROTO.flush()


def main() -> None:
    system, url, base_url = sys.argv[1:4]
    recover_id = sys.argv[5] if len(sys.argv) > 5 and sys.argv[4] == "--recover" else None
    if system == "dbos":
        run, start, recover = build_dbos(url, base_url)
    else:
        run, start, recover = build_langgraph(url, base_url, prebuilt=system == "prebuilt")
    if recover_id is not None:
        recover(recover_id)
        answer({"done": time.time(), "cpu": _process_cpu()})
        return
    answer({"ready": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        cpu0 = time.process_time()
        if cmd["op"] == "seq":
            walls = []
            for prompt in cmd["prompts"]:
                t0 = time.perf_counter()
                run(str(uuid.uuid4()), prompt)
                walls.append(time.perf_counter() - t0)
            answer({"walls": walls, "cpu": time.process_time() - cpu0})
        elif cmd["op"] == "burst":
            t0 = time.perf_counter()
            threads = [threading.Thread(target=run, args=(str(uuid.uuid4()), p)) for p in cmd["prompts"]]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            answer({"wall": time.perf_counter() - t0, "cpu": time.process_time() - cpu0})
        elif cmd["op"] == "start":
            start(cmd["id"], cmd["prompt"])
            answer({"started": cmd["id"]})


if __name__ == "__main__":
    main()
