// Reads a UI message stream (SSE bytes, from the file argv[2]) with the `ai` package's own
// parsing and validation (`parseJsonEventStream` with `uiMessageChunkSchema`, as its
// DefaultChatTransport does) and `readUIMessageStream`; prints the final message as JSON.
import { readFileSync } from "node:fs";
import { parseJsonEventStream, readUIMessageStream, uiMessageChunkSchema } from "ai";

const body = readFileSync(process.argv[2]);
const stream = new ReadableStream({
  start(controller) {
    controller.enqueue(new Uint8Array(body));
    controller.close();
  },
});
const chunks = [];
const parsed = parseJsonEventStream({ stream, schema: uiMessageChunkSchema }).pipeThrough(
  new TransformStream({
    transform(part, controller) {
      if (!part.success) throw part.error;
      chunks.push(part.value.type);
      controller.enqueue(part.value);
    },
  }),
);
const errors = [];
let message = null;
for await (const snapshot of readUIMessageStream({
  stream: parsed,
  onError: (error) => errors.push(String(error)),
  terminateOnError: true,
})) {
  message = snapshot;
}
console.log(JSON.stringify({ message, chunks, errors }));
