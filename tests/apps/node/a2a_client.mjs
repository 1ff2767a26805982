// The official A2A JavaScript client (@a2a-js/sdk) against one of our agents served over A2A.
//
//   node a2a_client.mjs <agent base URL> <text>
//
// Reads the agent's card, sends <text> as a streaming message and reads the task's events; if
// the task waits for input (a call waiting for approval), it answers "approve" and reads the
// run that carries it out. Then it reads the task (tasks/get) and the agent's tasks
// (tasks/list). Prints what it saw as JSON.
import { ClientFactory } from "@a2a-js/sdk/client";
import { Role, TaskState } from "@a2a-js/sdk";

const [url, text] = process.argv.slice(2);

function message(value, taskId = "") {
  return {
    messageId: `js-${value}-${taskId}`,
    role: Role.ROLE_USER,
    taskId,
    contextId: "",
    parts: [{ content: { $case: "text", value } }],
  };
}

function textOf(parts) {
  return (parts || [])
    .filter((part) => part.content && part.content.$case === "text")
    .map((part) => part.content.value)
    .join("");
}

async function stream(client, sent) {
  const seen = [];
  let taskId = "";
  let last = null;
  let artifact = "";
  for await (const event of client.sendMessageStream({ message: sent })) {
    const payload = event.payload;
    if (payload.$case === "task") {
      taskId = payload.value.id;
      seen.push("task");
    } else if (payload.$case === "statusUpdate") {
      last = payload.value.status;
      seen.push(TaskState[last.state]);
    } else if (payload.$case === "artifactUpdate") {
      artifact += textOf(payload.value.artifact.parts);
      seen.push("artifact");
    } else {
      seen.push(payload.$case);
    }
  }
  return { seen, taskId, artifact, lastText: last ? textOf(last.message?.parts) : "" };
}

// The card is at <url>/.well-known/agent-card.json: a base ending in "/" keeps its path.
const client = await new ClientFactory().createFromUrl(url.endsWith("/") ? url : `${url}/`);
const first = await stream(client, message(text));
const runs = [first];
if (first.seen.at(-1) === "TASK_STATE_INPUT_REQUIRED") {
  runs.push(await stream(client, message("approve", first.taskId)));
}
const task = await client.getTask({ id: first.taskId });
const listed = await client.listTasks({ pageSize: 10 });
console.log(
  JSON.stringify({
    runs,
    task: {
      id: task.id,
      state: TaskState[task.status.state],
      answer: (task.artifacts || []).map((a) => textOf(a.parts)).join(""),
      history: (task.history || []).map((m) => textOf(m.parts)),
    },
    listed: listed.tasks.map((t) => t.id),
  }),
);
