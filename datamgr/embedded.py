"""A data manager running on a background thread of this process: for the demo, tests and benchmarks."""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType

from datamgr.server import ServerConfig, serve

STARTUP_TIMEOUT_SECONDS = 30.0


class EmbeddedDataManager:
    """`with EmbeddedDataManager(config) as dm:` serves on `dm.address` until the block ends.

    The real server (`serve`) on its own event loop, so callers use it exactly as they would a remote one.
    """

    def __init__(self, config: ServerConfig) -> None:
        self._config = config
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._run, name="silod-datamgr", daemon=True)

    @property
    def address(self) -> str:
        host = self._config.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(serve(self._config, stop=self._stop, on_ready=self._on_ready))
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
        finally:
            self._ready.set()
            self._loop.close()

    def _on_ready(self, port: int) -> None:
        self.port = port
        self._ready.set()

    def start(self) -> EmbeddedDataManager:
        self._thread.start()
        if not self._ready.wait(STARTUP_TIMEOUT_SECONDS):
            raise TimeoutError(f"data manager did not start within {STARTUP_TIMEOUT_SECONDS} s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join()
        if self._error is not None:
            raise self._error

    def __enter__(self) -> EmbeddedDataManager:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
