// Runs `@ag-ui/client`'s HttpAgent against a server on 127.0.0.1 that answers each run with the
// AG-UI SSE bytes of the next file given: `node agui.mjs THREAD RUN_ID FILE [RUN_ID FILE ...]`.
// The client parses, verifies and applies the events as it does for any agent; one agent runs
// them all in turn, as a client continuing a thread does, answering the interrupts a run left
// open (approved) in the next run's input. Prints, per run, the events, the interrupts it
// answered and any error, and the agent's messages at the end, as JSON.
import http from "node:http";
import { readFileSync } from "node:fs";
import { HttpAgent, buildResumeArray } from "@ag-ui/client";

const [threadId, ...rest] = process.argv.slice(2);
const runs = [];
for (let index = 0; index < rest.length; index += 2) {
  runs.push({ runId: rest[index], body: readFileSync(rest[index + 1]) });
}
let current = null;
const server = http.createServer((request, response) => {
  request.resume();
  request.on("end", () => {
    response.writeHead(200, { "content-type": "text/event-stream" });
    response.end(current.body);
  });
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const { port } = server.address();
const agent = new HttpAgent({ url: `http://127.0.0.1:${port}/`, threadId });
const results = [];
for (const run of runs) {
  current = run;
  const events = [];
  let error = null;
  const open = agent.pendingInterrupts ?? [];
  const answers = Object.fromEntries(
    open.map((interrupt) => [interrupt.id, { status: "resolved", payload: { approved: true } }]),
  );
  const resume = open.length > 0 ? buildResumeArray(open, answers) : undefined;
  try {
    await agent.runAgent(
      { runId: run.runId, resume },
      {
        onEvent({ event }) {
          events.push(event);
        },
      },
    );
  } catch (caught) {
    error = String(caught?.stack ?? caught);
  }
  results.push({ events, answered: open.map((interrupt) => interrupt.id), error });
}
server.close();
console.log(JSON.stringify({ runs: results, messages: agent.messages }));
