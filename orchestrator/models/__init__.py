"""Models: the `Model` protocol, the `Request` an Agent sends, and the provider models.

`OpenAIModel` and `AnthropicModel` need their SDK, an optional extra
(``pip install 'orchestrator[openai]'``, ``'orchestrator[anthropic]'``). Importing this package
never imports an SDK: a model imports its SDK when it is built, and says how to install it.
"""

from ._anthropic import AnthropicModel as AnthropicModel
from ._base import Model as Model
from ._base import Request as Request
from ._base import TextCallback as TextCallback
from ._openai import OpenAIModel as OpenAIModel
from ._price import Price as Price
from ._retry import RetryPolicy as RetryPolicy

__all__ = (
    "AnthropicModel",
    "Model",
    "OpenAIModel",
    "Price",
    "Request",
    "RetryPolicy",
    "TextCallback",
)
