// Drives an AG-UI endpoint over HTTP with `@ag-ui/client`'s HttpAgent, as an app's frontend does:
// `node agui_http.mjs URL THREAD TEXT`. It sends the user's message, then answers every
// interrupt the run left open (approved) in the next run's input, until no interrupt is open.
// Prints, per run, the event types, the interrupts it answered and any error, and the agent's
// messages at the end, as JSON.
import { HttpAgent, buildResumeArray } from "@ag-ui/client";

const [url, threadId, text] = process.argv.slice(2);
const agent = new HttpAgent({ url, threadId });
agent.messages = [{ id: "user-1", role: "user", content: text }];
const runs = [];
for (let round = 0; round < 5; round += 1) {
  const open = agent.pendingInterrupts ?? [];
  if (round > 0 && open.length === 0) break;
  const answers = Object.fromEntries(
    open.map((interrupt) => [interrupt.id, { status: "resolved", payload: { approved: true } }]),
  );
  const resume = open.length > 0 ? buildResumeArray(open, answers) : undefined;
  const types = [];
  let error = null;
  try {
    await agent.runAgent(
      { runId: `run-${round + 1}`, resume },
      {
        onEvent({ event }) {
          types.push(event.type);
        },
      },
    );
  } catch (caught) {
    error = String(caught?.stack ?? caught);
  }
  runs.push({ types, answered: open.map((interrupt) => interrupt.id), error });
}
console.log(JSON.stringify({ runs, messages: agent.messages }));
