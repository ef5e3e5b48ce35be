// The basic LangGraph flow with the official JS client (@langchain/langgraph-sdk)
// against Terret's /lg door: create a thread, stream a run to its approval
// interrupt, resume it with a decision, read the state. Run by
// tests/sessions_app/lg/test_node_sdk.py; prints one JSON summary line.
import { Client } from "@langchain/langgraph-sdk";

const apiUrl = process.env.TERRET_LG_URL;
const apiKey = process.env.TERRET_TOKEN;
const graphId = process.env.TERRET_PROFILE;
const client = new Client({ apiUrl, apiKey });

const assistants = await client.assistants.search({ graphId });
const assistantId = assistants[0].assistant_id;
const thread = await client.threads.create({ graphId });

const first = [];
let runId = null;
for await (const part of client.runs.stream(thread.thread_id, assistantId, {
  input: { messages: [{ role: "user", content: "please write notes.txt" }] },
  streamMode: ["values", "updates"],
  streamResumable: true,
  onRunCreated: (meta) => { runId = meta.run_id; },
})) {
  first.push({ event: part.event, id: part.id ?? null, data: part.data });
}
const values = first.filter((p) => p.event === "values").at(-1).data;
const interrupt = values.__interrupt__[0];
const state = await client.threads.getState(thread.thread_id);

const second = [];
for await (const part of client.runs.stream(thread.thread_id, assistantId, {
  command: { resume: { decisions: [{ type: "approve" }] } },
  streamMode: ["values"],
})) {
  second.push({ event: part.event, id: part.id ?? null, data: part.data });
}
const finalValues = second.filter((p) => p.event === "values").at(-1).data;
const after = await client.threads.get(thread.thread_id);
const run = await client.runs.get(thread.thread_id, runId);

console.log(JSON.stringify({
  threadId: thread.thread_id,
  runId,
  runStatus: run.status,
  events: first.map((p) => p.event),
  ids: first.map((p) => p.id),
  action: interrupt.value.action_requests[0],
  stateNext: state.next,
  taskInterrupts: state.tasks[0].interrupts.length,
  finalTypes: finalValues.messages.map((m) => m.type),
  finalText: finalValues.messages.at(-1).content,
  threadStatus: after.status,
}));
