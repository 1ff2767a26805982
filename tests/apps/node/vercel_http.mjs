// Drives a UI message stream endpoint over HTTP with the `ai` package's DefaultChatTransport
// and readUIMessageStream, as useChat does: `node vercel_http.mjs URL CHAT TEXT`. It sends the
// user's message; while the reply asks for approvals, it answers them (approved, as
// addToolApprovalResponse records it) and sends the messages again. Prints, per request, the
// final assistant message and any error, as JSON.
import { DefaultChatTransport, readUIMessageStream } from "ai";

const [api, chatId, text] = process.argv.slice(2);
const transport = new DefaultChatTransport({ api });
const messages = [{ id: "user-1", role: "user", parts: [{ type: "text", text }] }];
const replies = [];
for (let round = 0; round < 5; round += 1) {
  const stream = await transport.sendMessages({
    trigger: "submit-message",
    chatId,
    messageId: undefined,
    messages,
    abortSignal: undefined,
  });
  const errors = [];
  let message = null;
  for await (const snapshot of readUIMessageStream({
    stream,
    onError: (error) => errors.push(String(error?.message ?? error)),
  })) {
    message = snapshot;
  }
  replies.push({ message: structuredClone(message), errors });
  const asking = (message?.parts ?? []).filter((part) => part.state === "approval-requested");
  if (asking.length === 0) break;
  for (const part of asking) {
    part.state = "approval-responded";
    part.approval = { ...part.approval, approved: true, reason: "fine" };
  }
  messages.push(message);
}
console.log(JSON.stringify({ replies }));
