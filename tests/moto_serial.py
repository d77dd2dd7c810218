"""Run moto's S3 server with requests applied one at a time.

moto checks ``If-None-Match: *`` and then stores the object in two steps, and
its threaded server interleaves requests, so two racing conditional PUTs can
both succeed (seen here: two winners in one round of the 8-writer race). AWS
S3 applies a conditional PUT atomically. Serialising moto's request handling
(connections stay threaded, keep-alive works) gives it S3's semantics, so the
race test tests LaunchHelm, not the emulator.

    python tests/moto_serial.py HOST PORT
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from werkzeug.serving import run_simple


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def serial(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        with lock:
            return list(app(environ, start_response))

    run_simple(host, port, serial, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
