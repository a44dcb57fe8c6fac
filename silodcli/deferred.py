"""What a `silod` command runs, named in its parser rather than imported: its module loads when it runs.

argparse needs every subcommand's parser to parse any one command line, so every `silod` command builds them
all. A parser that imported what its command runs would make each command load what all of them run: the
simulator with numpy, the FUSE client with trio, the server, gRPC, a second before `silod status` printed
anything. So the parser modules import only what parsing needs, and a command's `run` (or a client command's
`client_command`) is a `Deferred`: the "module:function" it names is imported on the first call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from silodlib.imports import import_named


class Deferred:
    """A function named "module:function", imported when first called (or resolved)."""

    __slots__ = ("target",)

    def __init__(self, target: str) -> None:
        module, sep, name = target.partition(":")
        if not (module and sep and name):
            raise ValueError(f"{target!r} must be module:function")
        self.target = target

    def __repr__(self) -> str:
        return f"Deferred({self.target!r})"

    def resolve(self) -> Callable[..., Any]:
        """The function itself; raises ImportError or AttributeError if the target names none."""
        function: Callable[..., Any] = import_named(self.target)
        return function

    def __call__(self, *args: Any) -> Any:
        return self.resolve()(*args)
