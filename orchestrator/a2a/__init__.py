"""A2A 1.0: agents served to, and called from, other frameworks (``orchestrator[a2a]``).

Built on the official ``a2a-sdk``. Serve the agents of a `Runs` service with
``asgi_app(runs, routes=a2a_routes(runs))``: each agent answers at ``/a2a/<name>/`` (JSON-RPC)
with its card at ``/a2a/<name>/.well-known/agent-card.json``, behind the app's checks (the
Host allow-list, the bearer token when it has one, JSON bodies).

- **Tasks.** A task is a conversation: its id and context id are the run's State id, so
  ``tasks/get`` and ``tasks/list`` read the store, and any process sharing it sees the task. A
  message starts a run in the service's task group: a client that goes away never cancels it.
- **States.** A running run is ``working``; one waiting for a person to approve a call is
  ``input-required``, its status message listing the calls; one that answered is
  ``completed`` with the answer as its ``answer`` artifact (text, or a JSON data part); a
  cancelled run ``canceled``; a failed one, or one stopped at a limit, ``failed``.
- **Approvals.** A message to an ``input-required`` task decides its calls: ``approve`` (or
  ``yes``, ``ok``) approves every waiting call; any other text denies them all, the model
  reading the text as the reason; a data part ``{"approve": [ids], "deny": [ids], "reason":
  "..."}`` decides call by call (calls it leaves out still wait).
- **Streaming.** ``SendStreamingMessage`` and ``SubscribeToTask`` give the task, then
  ``working`` status updates (the text as the model writes it, tool calls and results, each
  message marked by ``metadata.orchestrator``), the ``answer`` artifact, and the final status
  with the run's usage in its metadata.

- **Calling.** ``a2a_agent(url, name=..., description=...).as_tool()`` is a remote A2A agent
  as a subagent tool: each call starts a child State that records the remote task
  (`TASK_KEY`), saved before the message goes out, so a resume re-attaches to the task and
  never sends the message again; a cancelled call cancels the remote task.

Example:
    ```python
    from orchestrator.a2a import a2a_routes
    from orchestrator.apps import asgi_app

    app = asgi_app(runs, routes=a2a_routes(runs))
    ```
"""

import importlib.util as _util

if _util.find_spec("a2a") is None:  # pragma: no cover - the extra is missing
    raise ImportError("orchestrator.a2a needs the A2A SDK: pip install 'orchestrator[a2a]'")

from ._calling import TASK_KEY as TASK_KEY
from ._calling import A2ACallError as A2ACallError
from ._calling import A2AModel as A2AModel
from ._calling import a2a_agent as a2a_agent
from ._serving import APPROVE_WORDS as APPROVE_WORDS
from ._serving import DEFAULT_PREFIX as DEFAULT_PREFIX
from ._serving import a2a_routes as a2a_routes
from ._serving import agent_card as agent_card
from ._tasks import ANSWER_ARTIFACT as ANSWER_ARTIFACT

__all__ = (
    "ANSWER_ARTIFACT",
    "APPROVE_WORDS",
    "DEFAULT_PREFIX",
    "TASK_KEY",
    "A2ACallError",
    "A2AModel",
    "a2a_agent",
    "a2a_routes",
    "agent_card",
)
