// Runs `@ag-ui/client`'s HttpAgent against a server on 127.0.0.1 that answers with the AG-UI
// SSE bytes of the file argv[2]: the client parses, verifies and applies the events as it
// does for any agent. Prints the events, the resulting messages and any error as JSON.
import http from "node:http";
import { readFileSync } from "node:fs";
import { HttpAgent } from "@ag-ui/client";

const [file, threadId, runId] = process.argv.slice(2);
const body = readFileSync(file);
const server = http.createServer((request, response) => {
  request.resume();
  request.on("end", () => {
    response.writeHead(200, { "content-type": "text/event-stream" });
    response.end(body);
  });
});
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const { port } = server.address();
const agent = new HttpAgent({ url: `http://127.0.0.1:${port}/`, threadId });
const events = [];
let error = null;
let result = null;
try {
  const run = await agent.runAgent(
    { runId },
    {
      onEvent({ event }) {
        events.push(event);
      },
    },
  );
  result = run.result ?? null;
} catch (caught) {
  error = String(caught?.stack ?? caught);
}
server.close();
console.log(JSON.stringify({ events, messages: agent.messages, result, error }));
