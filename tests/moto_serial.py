"""Run moto's S3 server with object operations applied one at a time.

moto checks ``If-None-Match: *`` and then stores the object in two steps, and
its threaded server interleaves requests, so two racing conditional PUTs can
both succeed (seen here: two winners in one round of the 8-writer race). AWS
S3 applies a conditional PUT atomically. Serialising moto's object-level
handler gives it S3's semantics, so the race test tests LaunchHelm, not the
emulator. The lock is taken only after moto has read the whole request body,
so a client killed mid-upload cannot hold it.

    python tests/moto_serial.py HOST PORT
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from moto.s3.responses import S3Response
from werkzeug.serving import run_simple


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    lock = threading.RLock()
    handle = S3Response._key_response

    def serialised(self: S3Response, *args: Any, **kwargs: Any) -> Any:
        with lock:
            return handle(self, *args, **kwargs)

    S3Response._key_response = serialised  # type: ignore[method-assign]
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(host, port, app, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
