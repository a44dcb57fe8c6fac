"""Objects named "module:attribute" and imported only when asked for.

silod names what it loads on first use this way (policies and cache systems in the scheduler's registry,
storage backends by URI scheme, what a `silod` command runs), so that naming one imports nothing.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any


def import_named(target: str) -> Any:
    """The attribute `target` ("module:attribute") names, its module imported; raises ImportError or
    AttributeError if there is no such module or attribute."""
    module, _, attribute = target.partition(":")
    return getattr(import_module(module), attribute)
