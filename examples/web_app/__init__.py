"""An agent web app: runs per request, events as server-sent events, approvals over HTTP."""
