"""Reading a store's runs for people: the trees, timelines and JSON views, and the viewer page.

`orchestrator._cli` draws them in a terminal and serves the page on its own (``orchestrator
view``); `orchestrator.apps` mounts the page, live, beside the runs it serves.
"""
