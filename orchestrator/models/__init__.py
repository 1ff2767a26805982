"""Models: the `Model` protocol, the `Request` an Agent sends, and the provider models.

`OpenAIModel`, `OpenAIResponsesModel` and `AnthropicModel` need their SDK, an optional extra
(``pip install 'orchestrator[openai]'``, ``'orchestrator[anthropic]'``). Importing this package
never imports an SDK: a model imports its SDK when it is built, and says how to install it.
"""

import typing as _typing

from .._base._lazy import lazy_names as _lazy_names
from ._base import Model as Model
from ._base import ModelWithOptions as ModelWithOptions
from ._base import Request as Request
from ._base import TextCallback as TextCallback

if _typing.TYPE_CHECKING:
    from ._anthropic import AnthropicModel as AnthropicModel
    from ._fallback import FallbackModel as FallbackModel
    from ._openai import OpenAIModel as OpenAIModel
    from ._price import Price as Price
    from ._rate import RateLimit as RateLimit
    from ._rate import RateLimited as RateLimited
    from ._responses import OpenAIResponsesModel as OpenAIResponsesModel
    from ._retry import RetryPolicy as RetryPolicy

# The provider models, their retries and prices are imported at first use: a run with another
# model (a `FakeModel`, a user's own) never pays for them (~1 MB of a fresh process).
_LAZY = {
    "AnthropicModel": "._anthropic",
    "FallbackModel": "._fallback",
    "OpenAIModel": "._openai",
    "OpenAIResponsesModel": "._responses",
    "Price": "._price",
    "RateLimit": "._rate",
    "RateLimited": "._rate",
    "RetryPolicy": "._retry",
}


__getattr__: _typing.Callable[[str], _typing.Any] = _lazy_names(__name__, _LAZY)


__all__ = (
    "AnthropicModel",
    "FallbackModel",
    "Model",
    "ModelWithOptions",
    "OpenAIModel",
    "OpenAIResponsesModel",
    "Price",
    "RateLimit",
    "RateLimited",
    "Request",
    "RetryPolicy",
    "TextCallback",
)
