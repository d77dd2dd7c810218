"""Fixtures shared by every test layer: stores on each backend, for real.

S3 is a real ``moto_server`` process listening on 127.0.0.1, started once per
test session; every test gets its own bucket prefix. Child processes find it
through the standard ``AWS_*`` environment variables set here. GCS
(fake-gcs-server) and Azure (Azurite) emulators come from ``emulators.py``,
found the same way (``STORAGE_EMULATOR_HOST``, ``AZURE_STORAGE_CONNECTION_STRING``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from emulators import azurite_endpoint, gcs_endpoint  # noqa: F401  (fixtures)
from lhtest import BUCKET, make_store_url
from slurm_cluster import slurm_cluster  # noqa: F401  (fixture)

BACKENDS = ["local", "memory", "s3", "gcs", "azure"]

# --dist loadgroup's groups, kept under pytest 9.2 (see the module)
pytest_plugins = ["xdist_groups"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep each module whose own module-scoped fixtures build something (a store of killed runs,
    a torchrun job) on one xdist worker, so it is built once, not once per worker
    (``--dist loadgroup``: scripts/test.sh). Runs before xdist reads the groups."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue  # a group of its own already (the browser tests share one server and browser)
        module = item.nodeid.split("::", 1)[0]
        defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        if any(d.scope == "module" and d.baseid == module for ds in defs.values() for d in ds):
            item.add_marker(pytest.mark.xdist_group(module))

    # xdist hands out groups in collection order: the long ones first (the browser tests take a worker
    # for most of the run), or they start last and become the run's tail
    def rank(item: pytest.Item) -> int:
        group = item.get_closest_marker("xdist_group")
        if group is None:
            return 2
        return 0 if group.args and group.args[0] == "browser" else 1

    items.sort(key=rank)


#: Backends other processes can reach too (memory:// is per process).
SHARED_BACKENDS = ["local", "s3", "gcs", "azure"]


@pytest.fixture(scope="session", autouse=True)
def _spool_in_a_temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every session's metrics spool (and its children's) under the test run's own folder, not ~/.cache."""
    saved = os.environ.get("LAUNCHHELM_SPOOL")
    if saved is None:
        os.environ["LAUNCHHELM_SPOOL"] = str(tmp_path_factory.mktemp("spool"))
    yield
    if saved is None:
        os.environ.pop("LAUNCHHELM_SPOOL", None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real moto S3 server over HTTP on 127.0.0.1 (requests applied one at a time, as S3 is atomic)."""
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    launcher = Path(__file__).with_name("moto_serial.py")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(launcher), "127.0.0.1", str(port)], stdout=out, stderr=subprocess.STDOUT
        )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto_server did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.1)
    saved = {k: os.environ.get(k) for k in _AWS_ENV}
    os.environ.update(
        {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
        }
    )
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
    try:
        yield endpoint
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


_AWS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store on each backend: local directory, memory, moto S3, fake-gcs-server, Azurite."""
    return make_store_url(request.param, tmp_path, request)


@pytest.fixture(params=SHARED_BACKENDS)
def shared_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store other processes can reach too (memory:// is per process)."""
    return make_store_url(request.param, tmp_path, request)
