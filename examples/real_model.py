"""A real model: OpenAI or Anthropic when a key is set, else offline with FakeModel.

Set ``OPENAI_API_KEY`` (or ``ANTHROPIC_API_KEY``) and install the extra
(``pip install 'orchestrator[openai]'``) to ask a real model; with neither key set this runs
offline on a scripted `FakeModel`, so it always works. The reply streams to the terminal through
a `Reporter`, retries are shown as they happen, and the usage (with its cost, from the `Price`
given) is printed at the end. Any OpenAI-compatible server works too:
``OpenAIModel("llama3", base_url="http://localhost:11434/v1")`` or the string ``"ollama:llama3"``.
"""

from __future__ import annotations

import os

from orchestrator import Agent, Message, Reply, Reporter, State, tool
from orchestrator.models import AnthropicModel, Model, OpenAIModel, Price
from orchestrator.testing import FakeModel, tool_call


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


class Printer(Reporter):
    """Shows the reply as it streams, and each retry."""

    def on_text(self, state: State, chunk: str) -> None:
        print(chunk, end="", flush=True)

    def on_think_end(self, state: State, reply: Reply) -> None:
        if reply.message.text:
            print()

    def on_retry(self, state: State, attempt: int, delay: float, error: BaseException) -> None:
        print(f"(retry {attempt} in {delay:.1f}s: {error})")


def pick_model() -> Model:
    """A real model when its key is set, else a scripted one."""
    if os.environ.get("OPENAI_API_KEY"):
        return OpenAIModel("gpt-4o-mini", price=Price(input=0.15, output=0.6, cache_read=0.075))
    if os.environ.get("ANTHROPIC_API_KEY"):
        return AnthropicModel("claude-haiku-4-5", price=Price(input=1, output=5, cache_read=0.1))
    return FakeModel([tool_call("multiply", a=6, b=7), "6 times 7 is 42."], name="fake")


def main() -> None:
    model = pick_model()
    print(f"model: {model.name}")
    agent = Agent(
        model,
        instructions="Use the multiply tool for arithmetic. Answer in one short sentence.",
        tools=[multiply],
        reporter=Printer(),
    )
    state = State(messages=[Message.user("What is 6 times 7?")])
    answer = agent.run(state)
    print(f"answer: {answer}")
    usage = state.usage
    cost = "unknown" if usage.cost is None else f"${usage.cost:.6f}"
    print(
        f"usage: {usage.requests} requests, {usage.input_tokens} tokens in,"
        f" {usage.output_tokens} out, cost {cost}"
    )


if __name__ == "__main__":
    main()
