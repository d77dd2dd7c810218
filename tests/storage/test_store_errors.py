"""A misconfigured store fails fast with one clear error, never a hang.

If these fail, a typo in an endpoint freezes ``launchhelm.init`` for minutes,
or a missing bucket or a wrong key surfaces as a confusing "object not found"
or as a raw botocore / azure traceback.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from emulators import azurite_connection_string
from gcs_finalize_proxy import GcsFinalizeProxy
from lhtest import BUCKET, run_python

import launchhelm as lh
from launchhelm.storage import (
    BucketNotFoundError,
    StorageError,
    StoreAccessDeniedError,
    StoreUnreachableError,
    open_store,
)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


def _unreachable(backend: str, port: int) -> tuple[str, dict[str, object]]:
    endpoint = f"http://127.0.0.1:{port}"
    if backend == "s3":
        return f"s3://{BUCKET}/x", {"client_kwargs": {"endpoint_url": endpoint}, "key": "k", "secret": "s"}
    if backend == "gcs":
        return f"gs://{BUCKET}/x", {"endpoint_url": endpoint, "token": "anon"}
    return f"az://{BUCKET}/x", {"connection_string": azurite_connection_string(endpoint)}


@pytest.mark.parametrize("backend", ["s3", "gcs", "azure"])
def test_an_unreachable_endpoint_fails_within_seconds(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    port = _closed_port()
    url, options = _unreachable(backend, port)
    start = time.monotonic()
    with pytest.raises(StoreUnreachableError) as info:
        lh.init("unreachable", store=url, storage_options=options)
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert url in message and f"127.0.0.1:{port}" in message and "Check the endpoint" in message
    assert isinstance(info.value, ConnectionError) and isinstance(info.value, StorageError)


@pytest.mark.parametrize("backend", ["s3", "gcs", "azure"])
@pytest.mark.slow
def test_a_store_that_goes_away_after_opening_gives_the_same_error(backend: str) -> None:
    # The endpoint took the connection check when the store was opened, then went away.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = int(listener.getsockname()[1])
    url, options = _unreachable(backend, port)
    store = open_store(url, options)
    listener.close()
    start = time.monotonic()
    with pytest.raises(StoreUnreachableError, match=f"cannot reach the store {url} at .*127.0.0.1:{port}"):
        store.create("b", b"2")
    # bounded by the client libraries' own retries (gcsfs and azure-core back off for longest)
    assert time.monotonic() - start < 120


def test_a_missing_bucket_is_named(moto_endpoint: str) -> None:
    url = "s3://launchhelm-no-such-bucket/prefix"
    with pytest.raises(BucketNotFoundError, match=r"bucket 'launchhelm-no-such-bucket' of store s3://") as info:
        lh.init("nobucket", store=url)
    assert "create it first" in str(info.value)
    store = open_store(url)
    with pytest.raises(BucketNotFoundError):
        store.read("runs/x/run.json")  # not "object not found"
    with pytest.raises(BucketNotFoundError):
        lh.Api(url).projects()


def test_a_missing_gcs_bucket_and_azure_container_are_named(gcs_endpoint: str, azurite_endpoint: str) -> None:
    with pytest.raises(BucketNotFoundError, match="bucket 'no-such-bucket'"):
        open_store("gs://no-such-bucket/p").create("k", b"v")
    with pytest.raises(BucketNotFoundError, match="container 'no-such-container'"):
        open_store("az://no-such-container/p").create("k", b"v")


def test_wrong_azure_credentials_are_refused_clearly(azurite_endpoint: str) -> None:
    wrong = azurite_connection_string(azurite_endpoint, key="d3Jvbmcga2V5IGZvciB0aGUgdGVzdA==")
    start = time.monotonic()
    with pytest.raises(StoreAccessDeniedError) as info:
        lh.init("denied", store=f"az://{BUCKET}/denied", storage_options={"connection_string": wrong})
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert f"az://{BUCKET}/denied" in message and "AZURE_STORAGE_CONNECTION_STRING" in message
    assert isinstance(info.value, PermissionError)


@pytest.mark.slow
def test_credentials_come_from_the_usual_environment_variables(
    moto_endpoint: str, gcs_endpoint: str, azurite_endpoint: str
) -> None:
    # a fresh process given only the environment: AWS_*, STORAGE_EMULATOR_HOST,
    # AZURE_STORAGE_CONNECTION_STRING (AZURE_STORAGE_ACCOUNT_NAME + _KEY reach
    # https://<account>.blob.core.windows.net, so they are not exercised offline;
    # they sign requests as the connection string's AccountName/AccountKey do)
    code = """
    import sys, launchhelm as lh
    for url in sys.argv[1:]:
        run = lh.init("env", store=url)
        run.log({"x": 1.0})
        run.finish()
        print(url, lh.Api(url).run(run.id).history()["x"].tolist())
    """
    done = run_python(code, f"s3://{BUCKET}/env", f"gs://{BUCKET}/env", f"abfs://{BUCKET}/env", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("[1.0]") == 3, done.stdout


@pytest.mark.slow
def test_info_logging_is_not_flooded_by_azure_request_lines(azurite_endpoint: str) -> None:
    # azure-core logs each request at INFO; a user's own level on that logger wins
    code = """
        import logging, sys
        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(message)s")
        if sys.argv[2] == "user-chose-info":
            logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.INFO)
        import launchhelm as lh
        run = lh.init("quiet", store=sys.argv[1], heartbeat_interval=0.2)
        for step in range(20):
            run.log({"loss": 1.0 / (step + 1)}, step=step)
        run.finish()
        print("finished")
    """
    url = f"az://{BUCKET}/quiet-{time.time_ns()}"
    quiet = run_python(code, url, "default")
    assert quiet.returncode == 0 and "finished" in quiet.stdout, quiet.stderr[-2000:]
    assert "Request URL" not in quiet.stdout + quiet.stderr
    chosen = run_python(code, url + "-info", "user-chose-info")
    assert chosen.returncode == 0, chosen.stderr[-2000:]
    assert chosen.stdout.count("Request URL") >= 5  # the user asked for them: still printed


def _service_account(path: Path, token_uri: str) -> str:
    """A Google service-account key file whose tokens come from ``token_uri``; returns its email."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    email = "trainer@launchhelm-tests.iam.gserviceaccount.com"
    info = {
        "type": "service_account",
        "project_id": "launchhelm-tests",
        "private_key_id": "k1",
        "private_key": pem,
        "client_email": email,
        "client_id": "1",
        "token_uri": token_uri,
    }
    path.write_text(json.dumps(info))
    return email


class _TokenServer:
    """An OAuth token endpoint on 127.0.0.1: trades a service account's signed JWT for a token."""

    TOKEN = "lh-test-access-token"

    def __init__(self) -> None:
        self.issuers: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                form = parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
                claims = form["assertion"][0].split(".")[1]
                server.issuers.append(json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))["iss"])
                body = json.dumps({"access_token": _TokenServer.TOKEN, "expires_in": 3600, "token_type": "Bearer"})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}/token"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.mark.slow
def test_google_application_credentials_sign_every_gcs_request(gcs_endpoint: str, tmp_path: Path) -> None:
    # a service-account key file named by GOOGLE_APPLICATION_CREDENTIALS, as on a GCP VM or in CI;
    # its token_uri points at a local token endpoint, and a proxy before fake-gcs-server
    # records what each request carried
    tokens = _TokenServer()
    proxy = GcsFinalizeProxy(int(gcs_endpoint.rsplit(":", 1)[1]))
    try:
        email = _service_account(tmp_path / "sa.json", tokens.url)
        code = """
        import json, sys, launchhelm as lh
        options = {"endpoint_url": sys.argv[2]}
        run = lh.init("gcp-creds", store=sys.argv[1], storage_options=options)
        run.log({"x": 2.0})
        run.finish()
        print(lh.Api(sys.argv[1], storage_options=options).run(run.id).history()["x"].tolist())
        """
        done = run_python(
            code,
            f"gs://{BUCKET}/gcp-creds",
            proxy.endpoint,
            GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "sa.json"),
            STORAGE_EMULATOR_HOST="",
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert "[2.0]" in done.stdout
        assert tokens.issuers and set(tokens.issuers) == {email}  # the key file signed the token request
        assert len(proxy.authorizations) >= 5
        assert set(proxy.authorizations) == {f"Bearer {_TokenServer.TOKEN}"}  # and every request carried it
    finally:
        proxy.close()
        tokens.close()
