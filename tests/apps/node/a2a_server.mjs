// An A2A server made of the official JavaScript SDK's parts (@a2a-js/sdk with express): its
// DefaultRequestHandler, InMemoryTaskStore, JSON-RPC handler and card handler, and a small
// executor. It answers "js echo: <text>" as an artifact; a text starting with "hold" waits
// until the task is cancelled.
//
//   node a2a_server.mjs
//
// Listens on 127.0.0.1 (a free port), prints {"url": ...} once it listens, and prints
// {"cancelled": <task id>} for each task it cancels. Stops when its stdin closes.
import express from "express";
import { AGENT_CARD_PATH, TaskState } from "@a2a-js/sdk";
import { AgentEvent, DefaultRequestHandler, InMemoryTaskStore } from "@a2a-js/sdk/server";
import { UserBuilder, agentCardHandler, jsonRpcHandler } from "@a2a-js/sdk/server/express";

const holding = new Map();

function textOf(message) {
  return (message?.parts || [])
    .filter((part) => part.content && part.content.$case === "text")
    .map((part) => part.content.value)
    .join("");
}

function status(taskId, contextId, state) {
  return AgentEvent.statusUpdate({
    taskId,
    contextId,
    status: { state, message: undefined, timestamp: new Date().toISOString() },
    metadata: { usage: { input_tokens: 11, output_tokens: 13, requests: 1 } },
  });
}

const executor = {
  async execute(context, bus) {
    const { taskId, contextId } = context;
    const text = textOf(context.userMessage);
    bus.publish(
      AgentEvent.task(
        context.task ?? {
          id: taskId,
          contextId,
          status: { state: TaskState.TASK_STATE_SUBMITTED, message: undefined, timestamp: undefined },
          artifacts: [],
          history: [context.userMessage],
          metadata: undefined,
        },
      ),
    );
    bus.publish(status(taskId, contextId, TaskState.TASK_STATE_WORKING));
    if (text.startsWith("hold")) {
      await new Promise((resolve) => holding.set(taskId, resolve));
      return;
    }
    bus.publish(
      AgentEvent.artifactUpdate({
        taskId,
        contextId,
        artifact: {
          artifactId: "echo",
          name: "echo",
          description: "",
          parts: [{ content: { $case: "text", value: `js echo: ${text}` }, metadata: undefined, filename: "", mediaType: "" }],
          metadata: undefined,
          extensions: [],
        },
        append: false,
        lastChunk: true,
        metadata: undefined,
      }),
    );
    bus.publish(status(taskId, contextId, TaskState.TASK_STATE_COMPLETED));
    bus.finished();
  },
  async cancelTask(taskId, bus) {
    console.log(JSON.stringify({ cancelled: taskId }));
    bus.publish(status(taskId, "", TaskState.TASK_STATE_CANCELED));
    bus.finished();
    holding.get(taskId)?.();
  },
};

let card = null;
const app = express();
const server = app.listen(0, "127.0.0.1", () => {
  const url = `http://127.0.0.1:${server.address().port}`;
  card = {
    name: "js-echo",
    description: "Echoes what it is sent, in JavaScript.",
    version: "1.0.0",
    supportedInterfaces: [{ url: `${url}/`, protocolBinding: "JSONRPC", tenant: "", protocolVersion: "1.0" }],
    capabilities: { streaming: true, pushNotifications: false, extensions: [], extendedAgentCard: false },
    defaultInputModes: ["text/plain"],
    defaultOutputModes: ["text/plain"],
    skills: [{ id: "echo", name: "echo", description: "Echoes.", tags: ["echo"], examples: [], inputModes: [], outputModes: [], securityRequirements: [] }],
    securitySchemes: {},
    securityRequirements: [],
    signatures: [],
    provider: undefined,
    documentationUrl: undefined,
    iconUrl: undefined,
  };
  const handler = new DefaultRequestHandler(card, new InMemoryTaskStore(), executor);
  app.use(`/${AGENT_CARD_PATH}`, agentCardHandler({ agentCardProvider: handler }));
  app.use("/", jsonRpcHandler({ requestHandler: handler, userBuilder: UserBuilder.noAuthentication }));
  console.log(JSON.stringify({ url }));
});
process.stdin.on("end", () => server.close(() => process.exit(0)));
process.stdin.resume();
