// Every method of @langchain/langgraph-sdk that Terret's /lg door serves,
// called with the client's default arguments (only what a method requires is
// given). Run by tests/sessions_app/lg/test_node_sdk.py; prints one JSON line.
import { Client } from "@langchain/langgraph-sdk";

const client = new Client({ apiUrl: process.env.TERRET_LG_URL, apiKey: process.env.TERRET_TOKEN });
const graphId = process.env.TERRET_PROFILE;
const say = (text) => ({ input: { messages: [{ role: "user", content: text }] } });

const assistants = await client.assistants.search();
const assistant = await client.assistants.get(assistants.find((a) => a.graph_id === graphId).assistant_id);
const thread = await client.threads.create(); // no metadata: the first run binds it
const tid = thread.thread_id;
const fetched = await client.threads.get(tid);
const searched = await client.threads.search();

let runId = null;
const parts = [];
for await (const part of client.runs.stream(tid, graphId, { ...say("one"), onRunCreated: (m) => { runId = m.run_id; } })) {
  parts.push(part.event);
}
const replay = [];
for await (const part of client.runs.joinStream(tid, runId)) replay.push(part.event);
const joined = await client.runs.join(tid, runId);
const run = await client.runs.get(tid, runId);
const state = await client.threads.getState(tid);
const history = await client.threads.getHistory(tid);
const waited = await client.runs.wait(tid, graphId, say("two"));
const slow = await client.runs.create(tid, graphId, say("slow, please"));
const listed = await client.runs.list(tid);
await client.runs.cancel(tid, slow.run_id);
await client.runs.join(tid, slow.run_id);
const cancelled = await client.runs.get(tid, slow.run_id);

console.log(JSON.stringify({
  assistant: assistant.graph_id,
  created: fetched.status,
  searched: searched.map((t) => t.thread_id).includes(tid),
  bound: (await client.threads.get(tid)).metadata.graph_id,
  parts,
  replay,
  joined: joined.messages.at(-1).content,
  runStatus: run.status,
  sameHead: history[0].checkpoint.checkpoint_id === state.checkpoint.checkpoint_id,
  waited: waited.messages.at(-1).content,
  listed: listed.length,
  cancelled: cancelled.status,
}));
