// Reads UI message streams (SSE bytes, from the files given) with the `ai` package's own parsing
// and validation (`parseJsonEventStream` with `uiMessageChunkSchema`, as its
// DefaultChatTransport does) and `readUIMessageStream`; prints, per stream, the final message,
// the chunk types and the errors the stream reported, as JSON.
import { readFileSync } from "node:fs";
import { parseJsonEventStream, readUIMessageStream, uiMessageChunkSchema } from "ai";

async function read(file) {
  const body = readFileSync(file);
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
    onError: (error) => errors.push(String(error?.message ?? error)),
  })) {
    message = snapshot;
  }
  return { message, chunks, errors };
}

const results = [];
for (const file of process.argv.slice(2)) {
  results.push(await read(file));
}
console.log(JSON.stringify(results));
