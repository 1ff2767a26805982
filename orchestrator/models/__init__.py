"""Models: the `Model` protocol and the `Request` an Agent sends."""

from ._base import Model as Model
from ._base import Request as Request
from ._base import TextCallback as TextCallback

__all__ = ("Model", "Request", "TextCallback")
