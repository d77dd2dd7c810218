"""What differs between S3, GCS and Azure: large uploads, leftovers, endpoints.

Each cloud has its own way to upload an object in parts that stays invisible
until committed, and its own put-if-absent on the commit:

=======  ==========================================  ==============================================
backend  parts                                       commit (put-if-absent)
=======  ==========================================  ==============================================
S3       multipart upload, parts in parallel         CompleteMultipartUpload with ``If-None-Match: *``
GCS      resumable upload, chunks in order           the last chunk; ``ifGenerationMatch=0`` is set
                                                     when the session starts and checked at the end
Azure    staged blocks, in parallel                  Put Block List with ``If-None-Match: *``
=======  ==========================================  ==============================================

A failed or lost upload is aborted: S3's multipart upload is aborted (an
upload left open is billed and invisible, and s3fs's ``open("xb")`` leaks
one on a lost race), GCS's session is cancelled, Azure's uncommitted blocks
are dropped. What a killed process leaves behind is found by
:func:`incomplete_uploads` for ``launchhelm gc``.

Timeouts and retries (:func:`client_options`, :func:`tune_client`): a store
that stops answering must fail a request in bounded time, not hang the
flusher, a checkpoint save or an evaluation worker. Each request waits at
most ``LAUNCHHELM_CONNECT_TIMEOUT`` for a connection and
``LAUNCHHELM_READ_TIMEOUT`` for the next bytes of an answer, and is tried at
most :data:`CLIENT_ATTEMPTS` times by the client library. Retry layers do
not multiply: s3fs's own retry loop (5 tries of each client call, each with
the client's 3) is turned off, and LaunchHelm's retries do not try again a
request that got no answer at all (``_errors.no_answer``). A blackholed S3
endpoint then fails a request after about ``3 x LAUNCHHELM_READ_TIMEOUT``
(measured before: over ten minutes, as the layers multiplied).

This module imports no backend library at import time; each function runs
only once the matching file system exists.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol, TypedDict, TypeVar, cast

from launchhelm.storage._errors import EXISTS, classify
from launchhelm.storage._transfer import PART_SIZE

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from launchhelm.storage._transfer import PartUpload

T = TypeVar("T")

#: Chunk of a GCS resumable upload (google-cloud-storage sends 100 MiB, gcsfs 50 MiB).
GCS_CHUNK = 32 * 2**20

__all__ = [
    "CLIENT_ATTEMPTS",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_READ_TIMEOUT",
    "IncompleteUpload",
    "abort_incomplete",
    "bucket_exists",
    "client_options",
    "connect_timeout",
    "endpoint_of",
    "incomplete_uploads",
    "kind_of",
    "part_upload_for",
    "read_timeout",
    "request_budget",
    "tune_client",
]

#: Seconds to wait for a TCP connection to a store's endpoint (``LAUNCHHELM_CONNECT_TIMEOUT``).
DEFAULT_CONNECT_TIMEOUT = 5.0
#: Seconds to wait for the next bytes of an answer once a request is sent (``LAUNCHHELM_READ_TIMEOUT``).
#: Not the whole transfer's time: a large download or upload that keeps moving never times out.
DEFAULT_READ_TIMEOUT = 20.0
#: Tries of one request by the client library, the first included (botocore's "standard" retries:
#: resets, throttling, 5xx). botocore's ``max_attempts`` counts the retries only: s3fs made 3 of it 4 tries.
CLIENT_ATTEMPTS = 3
#: Requests a batched read keeps in flight on an object store (the HTTP client's connection pool).
_READ_CONCURRENCY = int(os.environ.get("LAUNCHHELM_READ_CONCURRENCY") or 64)

S3, GCS, AZURE = "s3", "gcs", "azure"
_KINDS = {"s3": S3, "s3a": S3, "gs": GCS, "gcs": GCS, "az": AZURE, "abfs": AZURE, "abfss": AZURE}


def kind_of(protocol: str) -> str | None:
    """``"s3"``, ``"gcs"``, ``"azure"``, or None for any other protocol."""
    return _KINDS.get(protocol)


def _seconds(variable: str, default: float) -> float:
    try:
        value = float(os.environ.get(variable) or default)
    except ValueError:
        return default
    return value if value > 0 else default


def connect_timeout() -> float:
    """Seconds to wait for a connection: ``$LAUNCHHELM_CONNECT_TIMEOUT``, else 5."""
    return _seconds("LAUNCHHELM_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT)


def read_timeout() -> float:
    """Seconds to wait for the next bytes of an answer: ``$LAUNCHHELM_READ_TIMEOUT``, else 20."""
    return _seconds("LAUNCHHELM_READ_TIMEOUT", DEFAULT_READ_TIMEOUT)


def request_budget() -> float:
    """Longest a request can take before the client library gives up on it (every attempt timing out).

    A failure within this long after a store answered again may be a request
    an outage swallowed before it ended, not a new outage.
    """
    return (connect_timeout() + read_timeout()) * CLIENT_ATTEMPTS


def client_options(kind: str | None, options: dict[str, object]) -> dict[str, object]:
    """Bounded timeouts and retries for each cloud's file system, unless the caller chose their own."""
    connect, read = connect_timeout(), read_timeout()
    if kind is not None:
        # listing caches hide objects other processes just wrote
        options.setdefault("use_listings_cache", False)
    if kind == S3:
        config = dict(cast("Mapping[str, object]", options.get("config_kwargs") or {}))
        config.setdefault("connect_timeout", connect)
        config.setdefault("read_timeout", read)
        config.setdefault("retries", {"total_max_attempts": CLIENT_ATTEMPTS, "mode": "standard"})
        # botocore keeps 10 connections by default: read_many's concurrency needs as many
        config.setdefault("max_pool_connections", _READ_CONCURRENCY)
        options["config_kwargs"] = config
    elif kind == GCS:
        if os.environ.get("STORAGE_EMULATOR_HOST") and "token" not in options:
            options["token"] = "anon"  # an emulator takes no credentials (as google-cloud-storage does)
        if "requests_timeout" not in options:
            import aiohttp

            options["requests_timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)
    elif kind == AZURE:
        options.setdefault("connection_timeout", int(connect) or 1)
        options.setdefault("read_timeout", int(read) or 1)
    return options


def tune_client(fs: AbstractFileSystem, protocol: str) -> None:
    """Settings a file system takes only as attributes, set once it exists.

    S3:

    - s3fs retries each client call 5 times on timeouts and resets, and the
      client (botocore) has already tried it :data:`CLIENT_ATTEMPTS` times:
      a blackholed endpoint held one request for 15 read timeouts (and
      LaunchHelm's own retries multiplied that again). The client's retries
      cover what s3fs's did (resets, throttling, 5xx), and LaunchHelm retries
      a body cut off mid-read.
    - botocore asks for ``Expect: 100-continue`` on every upload with a
      file-like body (every ``PutObject`` and ``UploadPart`` s3fs sends), and
      aiohttp then waits for the ``100 Continue`` with no timeout at all: an
      endpoint that takes the connection and never answers held a write
      forever (measured). The header is dropped; an upload S3 refuses costs
      its body's bytes once, as any other request does.
    """
    if kind_of(protocol) != S3:
        return
    if getattr(fs, "retries", 1) != 1:
        fs.retries = 1
    client = getattr(fs, "_s3", None)
    if client is not None:
        _drop_expect(client.meta.events)
    elif getattr(fs, "session", None) is None:
        from aiobotocore.session import AioSession  # type: ignore[import-untyped]

        session = AioSession(**getattr(fs, "kwargs", {}))
        _drop_expect(session.get_component("event_emitter"))
        fs.session = session  # s3fs makes its client from this session; a refresh keeps it


class _EventEmitter(Protocol):
    """What is used of botocore's event emitter (botocore ships no type hints)."""

    def register_last(self, event_name: str, handler: Callable[..., None], unique_id: str | None = None) -> None: ...


def _drop_expect(events: _EventEmitter) -> None:
    # registered after botocore's own handler that adds the header, so it runs after it
    events.register_last("before-call.s3", _no_expect_header, unique_id="launchhelm-no-expect")


def _no_expect_header(params: object = None, **_: object) -> None:
    headers = params.get("headers") if isinstance(params, dict) else None
    if isinstance(headers, dict):
        headers.pop("Expect", None)


def _sync(fs: AbstractFileSystem, coro_fn: Callable[..., Awaitable[T]], *args: object, **kwargs: object) -> T:
    from fsspec.asyn import sync

    result: T = sync(fs.loop, coro_fn, *args, **kwargs)
    return result


def to_epoch(value: object) -> float | None:
    """A listing's modification time (datetime, ISO text or number) as seconds since the epoch."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


# -- S3 ------------------------------------------------------------------------
class _S3Part(TypedDict):
    """One uploaded part, as CompleteMultipartUpload takes it."""

    PartNumber: int
    ETag: str
    ChecksumCRC64NVME: str


class S3PartUpload:
    """S3 multipart upload committed with ``If-None-Match: *``, every request checksummed.

    Each part goes with its CRC64NVME (``x-amz-checksum-crc64nvme``) and the
    commit with the whole object's, combined from the parts' CRCs
    (``ChecksumType=FULL_OBJECT``): S3 refuses a part whose bytes do not
    match, and a commit whose parts do not add up to the whole, so a
    corrupted upload never becomes an object. The stored object then carries
    the same full-object CRC64NVME the checkpoint records.
    """

    concurrency = 4
    part_bytes = PART_SIZE
    #: s3fs's own multipart threshold: an object known to be smaller goes as one PUT with its CRC64NVME
    whole_bytes = 50 * 2**20
    #: Sent with every upload request; S3's own default, and its only full-object family besides CRC32(C).
    checksum_algorithm = "CRC64NVME"

    def __init__(self, fs: AbstractFileSystem, path: str) -> None:
        self.fs = fs
        self.path = path
        self.bucket, self.key, _ = fs.split_path(path)
        self.upload_id: str | None = None
        self._crcs: dict[int, tuple[int, int]] = {}  # part number -> (CRC64NVME, length)

    def create_small(self, data: bytes | bytearray) -> None:
        from launchhelm.storage._checksum import CRC64NVME, crc64nvme, header_value

        self.fs.pipe_file(
            self.path,
            data,
            mode="create",
            ChecksumAlgorithm=self.checksum_algorithm,
            ChecksumCRC64NVME=header_value(CRC64NVME, crc64nvme(data)),
        )

    def begin(self) -> None:
        out = self.fs.call_s3(
            "create_multipart_upload",
            Bucket=self.bucket,
            Key=self.key,
            ChecksumAlgorithm=self.checksum_algorithm,
            ChecksumType="FULL_OBJECT",
        )
        self.upload_id = str(out["UploadId"])

    def put_part(self, number: int, offset: int, data: bytes | bytearray) -> _S3Part:
        from launchhelm.storage._checksum import CRC64NVME, crc64nvme, header_value
        from launchhelm.storage._transfer import BufferReader

        crc = crc64nvme(data)
        self._crcs[number] = (crc, len(data))
        value = header_value(CRC64NVME, crc)
        out = self.fs.call_s3(
            "upload_part",
            Bucket=self.bucket,
            Key=self.key,
            UploadId=self.upload_id,
            PartNumber=number,
            Body=BufferReader(data),  # streamed, not copied twice more by aiohttp
            ChecksumAlgorithm=self.checksum_algorithm,
            ChecksumCRC64NVME=value,
        )
        part: _S3Part = {"PartNumber": number, "ETag": out["ETag"], "ChecksumCRC64NVME": value}
        return part

    def whole_crc64nvme(self) -> int:
        """The object's CRC64NVME, combined from its parts' CRCs in order."""
        from launchhelm.storage._checksum import combine_crc64nvme

        total = 0
        for number in sorted(self._crcs):
            crc, length = self._crcs[number]
            total = combine_crc64nvme(total, crc, length) if number > 1 else crc
        return total

    def _expected_etag(self, tokens: list[object]) -> str:
        import hashlib

        parts = cast("list[_S3Part]", tokens)  # what put_part returned
        digests = b"".join(bytes.fromhex(str(t["ETag"]).strip('"')) for t in parts)
        return f"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(tokens)}"

    def finish(self, tokens: list[object], number: int, offset: int, data: bytes | bytearray, size: int) -> None:
        from launchhelm.storage._checksum import CRC64NVME, header_value
        from launchhelm.storage._transfer import with_retries

        tokens = [*tokens, with_retries(lambda: self.put_part(number, offset, data))]
        whole = header_value(CRC64NVME, self.whole_crc64nvme())
        attempts = [0]

        def complete() -> None:
            attempts[0] += 1
            try:
                self.fs.call_s3(
                    "complete_multipart_upload",
                    Bucket=self.bucket,
                    Key=self.key,
                    UploadId=self.upload_id,
                    MultipartUpload={"Parts": tokens},
                    IfNoneMatch="*",
                    ChecksumCRC64NVME=whole,
                    ChecksumType="FULL_OBJECT",
                )
            except Exception as exc:
                if classify(exc).kind != EXISTS:
                    raise
                # a retried complete finds its own object: the first try landed
                if attempts[0] > 1 and self._stored_etag() == self._expected_etag(tokens):
                    return
                raise FileExistsError(f"{self.path} already exists") from exc

        with_retries(complete)
        self.upload_id = None

    def _stored_etag(self) -> str | None:
        try:
            out = self.fs.call_s3("head_object", Bucket=self.bucket, Key=self.key)
        except Exception:
            return None
        return str(out.get("ETag", "")).strip('"')

    def abort(self) -> None:
        if self.upload_id is None:
            return
        try:
            self.fs.call_s3("abort_multipart_upload", Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)
        except Exception:
            pass  # gc finds it (``launchhelm gc`` aborts stale uploads)
        self.upload_id = None


# -- GCS -----------------------------------------------------------------------
class GCSPartUpload:
    """GCS resumable upload started with ``ifGenerationMatch=0``, its CRC32C sent at the end.

    The object appears when the last chunk arrives, and GCS checks the
    precondition then, and the whole object's CRC32C sent with that chunk
    (``X-Goog-Hash: crc32c=...``): a corrupted upload is refused rather than
    stored. Small objects go in one multipart upload request with
    ``ifGenerationMatch=0`` and their CRC32C in the object's metadata, which
    GCS checks the same way (:meth:`create_small`).
    """

    concurrency = 1  # a resumable session takes its chunks in order
    whole_bytes = 0  # objects under a chunk go in one request already (create_small)
    # One request per chunk, one at a time: small chunks pay a round trip each,
    # so chunks are large. GCS wants multiples of 256 KiB.
    part_bytes = GCS_CHUNK

    def __init__(self, fs: AbstractFileSystem, path: str) -> None:
        self.fs = fs
        self.path = path
        self.bucket, self.key, _ = fs.split_path(path)
        self.location: str | None = None
        self.exposed_generation: str | None = None
        self._crc32c = 0  # of every byte sent so far: chunks go in order, one at a time
        self._counted = 0  # bytes the CRC covers (a chunk sent again is not counted twice)

    def _count(self, offset: int, data: bytes | bytearray) -> None:
        from launchhelm.storage._checksum import crc32c

        if offset + len(data) > self._counted:
            self._crc32c = crc32c(memoryview(data)[self._counted - offset :], self._crc32c)
            self._counted = offset + len(data)

    def create_small(self, data: bytes | bytearray) -> None:
        from launchhelm.storage._checksum import CRC32C, crc32c, header_value

        gcs_create(self.fs, self.path, bytes(data), crc32c=header_value(CRC32C, crc32c(data)))

    def begin(self) -> None:
        from gcsfs.core import initiate_upload

        self.location = str(
            _sync(
                self.fs,
                initiate_upload,
                self.fs,
                self.bucket,
                self.key,
                "application/octet-stream",
                None,
                None,
                "create",
            )
        )

    def _put(
        self, offset: int, data: bytes | bytearray, total: str, extra: dict[str, str] | None = None
    ) -> tuple[object, bytes]:
        from launchhelm.storage._transfer import BufferReader

        end = offset + len(data) - 1
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Range": f"bytes {offset}-{end}/{total}",
            # a file body has no length aiohttp can find: said here, or it would go chunked
            "Content-Length": str(len(data)),
        }
        headers.update(extra or {})
        # streamed as a file, not copied twice more by aiohttp (BufferReader); gcsfs rewinds it to retry
        out: tuple[object, bytes] = self.fs.call("PUT", self.location, headers=headers, data=BufferReader(data))
        return out

    def put_part(self, number: int, offset: int, data: bytes | bytearray) -> None:
        self._count(offset, data)
        headers, body = self._put(offset, data, "*")
        if body:
            # Real GCS answers 308 with no body until the last chunk. An
            # emulator that answers with an object has made the partial
            # upload visible: remember it, so abort() can take it back.
            try:
                self.exposed_generation = str(json.loads(body)["generation"])
            except (ValueError, KeyError, TypeError):
                pass
        persisted = headers.get("Range") if hasattr(headers, "get") else None
        if persisted:
            end = int(str(persisted).rsplit("-", 1)[1])
            missing = offset + len(data) - 1 - end
            if missing > 0:  # GCS kept less than was sent: send the rest
                self.put_part(number, end + 1, data[-missing:])
        return None

    def finish(self, tokens: list[object], number: int, offset: int, data: bytes | bytearray, size: int) -> None:
        from launchhelm.storage._checksum import CRC32C, header_value
        from launchhelm.storage._transfer import with_retries

        self._count(offset, data)
        # the whole object's CRC32C, checked by GCS when the upload completes
        whole = {"X-Goog-Hash": f"crc32c={header_value(CRC32C, self._crc32c)}"}
        try:
            if data:
                with_retries(lambda: self._put(offset, data, str(size), whole))
            else:
                with_retries(
                    lambda: self.fs.call(
                        "PUT", self.location, headers={"Content-Range": f"bytes */{size}", **whole}, data=b""
                    )
                )
        except FileExistsError:
            raise
        except FileNotFoundError:
            # the session is gone: a last chunk sent again after its answer was lost finds the upload
            # done. It is ours if the object has our size and CRC32C (the session made a fresh key)
            if not self._landed(size):
                raise
        except Exception as exc:
            if classify(exc).kind == EXISTS:
                raise FileExistsError(f"{self.path} already exists") from exc
            raise
        self.location = None

    def _landed(self, size: int) -> bool:
        """Whether the object now at the key is this upload's: its size and CRC32C are what was sent."""
        from launchhelm.storage._checksum import CRC32C, header_value

        self.fs.invalidate_cache(self.path)
        try:
            info = self.fs.info(self.path)
        except FileNotFoundError:
            return False
        return int(info.get("size", -1)) == size and info.get("crc32c") == header_value(CRC32C, self._crc32c)

    def abort(self) -> None:
        if self.location is None:
            return
        try:
            self.fs.call("DELETE", self.location)  # answers 499: cancelled
        except Exception:
            pass  # an abandoned session expires after a week and is never an object
        self.location = None
        if self.exposed_generation is not None:
            try:  # only the generation this session exposed, never another writer's object
                self.fs.call("DELETE", "b/{}/o/{}", self.bucket, self.key, ifGenerationMatch=self.exposed_generation)
            except Exception:
                pass
            self.exposed_generation = None


def gcs_create(fs: AbstractFileSystem, path: str, data: bytes, crc32c: str | None = None) -> None:
    """Put-if-absent on GCS: one multipart upload with ``ifGenerationMatch=0``, whatever the size.

    gcsfs would switch to a resumable upload above 50 MB; a single request
    keeps the precondition checked on every GCS implementation (the
    fake-gcs-server emulator honours it on multipart uploads only). With
    ``crc32c`` (base64), the object's metadata carries it and GCS refuses the
    upload if the bytes it received do not match.
    """
    if crc32c is None:
        fs.pipe_file(path, data, mode="create", chunksize=len(data) + 1)
        return
    from urllib.parse import quote

    bucket, key, _ = fs.split_path(path)
    metadata = json.dumps({"name": key, "crc32c": crc32c})
    head = f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{metadata}\n--==0==\n"
    body = head.encode() + b"Content-Type: application/octet-stream\n\n" + data + b"\n--==0==--"
    fs.call(
        "POST",
        f"{fs._location}/upload/storage/v1/b/{quote(bucket)}/o",
        uploadType="multipart",
        headers={"Content-Type": 'multipart/related; boundary="==0=="'},
        data=body,
        json_out=True,
        ifGenerationMatch="0",
    )


# -- Azure ---------------------------------------------------------------------
class AzurePartUpload:
    """Azure block blob: blocks staged in parallel, committed with ``If-None-Match: *``.

    Azure keeps no full-object CRC for a block blob; what its API offers is a
    checksum per request. Every block and every one-request blob goes with
    its MD5 (``validate_content=True``: ``Content-MD5``), so Azure refuses one
    whose bytes were damaged in transit; the checkpoint's own CRC64NVME
    covers the whole object.
    """

    concurrency = 4
    part_bytes = PART_SIZE
    whole_bytes = 0  # blocks in parallel stay the fastest way here

    def __init__(self, fs: AbstractFileSystem, path: str) -> None:
        self.fs = fs
        self.path = path
        self.container, self.blob, _ = fs.split_path(path)
        self._prefix = uuid.uuid4().hex[:16]
        self.staged = False

    def create_small(self, data: bytes | bytearray) -> None:
        self.fs.pipe_file(self.path, data, mode="create", validate_content=True)

    def begin(self) -> None:
        pass  # blocks need no session

    def _block_id(self, number: int) -> str:
        # ids of one blob must all have the same length; random per upload, so
        # two writers of one key never overwrite each other's blocks
        return base64.b64encode(f"{self._prefix}-{number:08d}".encode()).decode()

    def _stage(self, number: int, data: bytes | bytearray) -> str:
        block_id = self._block_id(number)

        async def stage() -> None:
            from launchhelm.storage._transfer import BufferReader

            async with self.fs.service_client.get_blob_client(self.container, self.blob) as client:
                # a file, not bytes: the SDK's MD5 reads it in small pieces and rewinds it, and aiohttp
                # streams it; bytes(bytearray) and aiohttp's join with the headers each copied the block
                body = BufferReader(data)
                await client.stage_block(block_id=block_id, data=body, length=len(data), validate_content=True)

        _sync(self.fs, stage)
        self.staged = True
        return block_id

    def put_part(self, number: int, offset: int, data: bytes | bytearray) -> str:
        return self._stage(number, data)

    def _committed_ids(self) -> list[str] | None:
        async def committed() -> list[str]:
            async with self.fs.service_client.get_blob_client(self.container, self.blob) as client:
                found = await client.get_block_list("committed")
                blocks = found[0] if isinstance(found, tuple) else getattr(found, "committed_blocks", [])
                return [str(b.id) for b in blocks]

        try:
            ids: list[str] = _sync(self.fs, committed)
            return ids
        except Exception:
            return None

    def finish(self, tokens: list[object], number: int, offset: int, data: bytes | bytearray, size: int) -> None:
        from azure.storage.blob import BlobBlock

        from launchhelm.storage._transfer import with_retries

        ids = [*cast("list[str]", tokens), with_retries(lambda: self._stage(number, data))]  # put_part's block ids
        attempts = [0]

        async def commit() -> None:
            async with self.fs.service_client.get_blob_client(self.container, self.blob) as client:
                await client.commit_block_list([BlobBlock(block_id=i) for i in ids], headers={"If-None-Match": "*"})

        def attempt() -> None:
            attempts[0] += 1
            try:
                _sync(self.fs, commit)
            except Exception as exc:
                if classify(exc).kind != EXISTS:
                    raise
                if attempts[0] > 1 and self._committed_ids() == ids:
                    return  # our earlier, ambiguous commit landed
                raise FileExistsError(f"{self.path} already exists") from exc

        with_retries(attempt)
        self.staged = False

    def abort(self) -> None:
        # Uncommitted blocks are never part of a blob, but they hold the name:
        # a later put-if-absent of this key is refused while they exist
        # (Azurite; Azure drops them after a week). Drop them now, unless
        # another writer committed the blob meanwhile.
        if not self.staged:
            return
        self.staged = False
        try:
            abort_incomplete(self.fs, "az", self.container, IncompleteUpload(self.blob, None, self.blob))
        except Exception:
            pass  # ``launchhelm gc`` removes it later


def part_upload_for(fs: AbstractFileSystem, protocol: str, path: str) -> PartUpload | None:
    """The :class:`~launchhelm.storage._transfer.PartUpload` for ``path``, or None for other protocols."""
    kind = kind_of(protocol)
    if kind == S3:
        return S3PartUpload(fs, path)
    if kind == GCS:
        return GCSPartUpload(fs, path)
    if kind == AZURE:
        return AzurePartUpload(fs, path)
    return None


# -- leftovers of killed uploads -------------------------------------------------
@dataclass(frozen=True)
class IncompleteUpload:
    """An upload that was started and never committed nor aborted.

    Attributes
    ----------
    key:
        The object key it was meant for, relative to the store's root.
    started:
        When it started (seconds since the epoch), if the backend says.
    upload_id:
        The backend's id of it (S3 upload id, Azure blob name, a local staging file).
    """

    key: str
    started: float | None
    upload_id: str


def _relative(root: str, path: str) -> str | None:
    root = root.strip("/")
    path = path.strip("/")
    if not root:
        return path
    if path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return None


def incomplete_uploads(fs: AbstractFileSystem, protocol: str, root: str) -> list[IncompleteUpload]:
    """S3 multipart uploads and Azure uncommitted blobs under ``root``.

    GCS resumable sessions cannot be listed; they expire a week after they
    start and are never objects.
    """
    kind = kind_of(protocol)
    found: list[IncompleteUpload] = []
    if kind == S3:
        bucket, prefix, _ = fs.split_path(root)
        args: dict[str, object] = {"Bucket": bucket, "Prefix": f"{prefix}/" if prefix else ""}
        while True:
            out = fs.call_s3("list_multipart_uploads", **args)
            for upload in out.get("Uploads", []):
                key = str(upload["Key"])
                rel = key[len(prefix) + 1 :] if prefix else key
                found.append(IncompleteUpload(rel, to_epoch(upload.get("Initiated")), str(upload["UploadId"])))
            if not out.get("IsTruncated"):
                break
            args["KeyMarker"] = out.get("NextKeyMarker")
            args["UploadIdMarker"] = out.get("NextUploadIdMarker")
    elif kind == AZURE:
        container, prefix, _ = fs.split_path(root)

        async def listing() -> tuple[dict[str, object], set[str]]:
            client = fs.service_client.get_container_client(container)
            start = f"{prefix}/" if prefix else None
            every: dict[str, object] = {}
            committed: set[str] = set()
            async for blob in client.list_blobs(name_starts_with=start, include=["uncommittedblobs"]):
                every[blob.name] = blob
            async for blob in client.list_blobs(name_starts_with=start):
                committed.add(blob.name)
            return every, committed

        every, committed = _sync(fs, listing)
        for name, blob in every.items():
            if name in committed:
                continue
            rel = name[len(prefix) + 1 :] if prefix else name
            started = to_epoch(getattr(blob, "creation_time", None) or getattr(blob, "last_modified", None))
            found.append(IncompleteUpload(rel, started, name))
    return found


def abort_incomplete(fs: AbstractFileSystem, protocol: str, root: str, upload: IncompleteUpload) -> None:
    """Abort one :class:`IncompleteUpload` (absent is fine)."""
    kind = kind_of(protocol)
    if kind == S3:
        bucket, prefix, _ = fs.split_path(root)
        key = f"{prefix}/{upload.key}" if prefix else upload.key
        try:
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload.upload_id)
        except FileNotFoundError:
            pass
    elif kind == AZURE:
        container, _, _ = fs.split_path(root)

        async def delete() -> None:
            async with fs.service_client.get_blob_client(container, upload.upload_id) as client:
                # only if still uncommitted: a blob committed meanwhile has properties
                try:
                    await client.get_blob_properties()
                    return
                except Exception as exc:
                    if classify(exc).kind != "missing":
                        raise
                await client.delete_blob()

        try:
            _sync(fs, delete)
        except Exception as exc:
            if classify(exc).kind != "missing":
                raise


# -- endpoints and buckets ----------------------------------------------------------
def endpoint_of(fs: AbstractFileSystem, protocol: str) -> str | None:
    """The base URL the file system sends requests to, when it can be told."""
    kind = kind_of(protocol)
    try:
        if kind == S3:
            return (
                getattr(fs, "endpoint_url", None)
                or (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url")
                or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL")
            )
        if kind == GCS:
            return str(fs._location)
        if kind == AZURE:
            return str(fs.service_client.url)
    except Exception:
        return None
    return None


def bucket_exists(fs: AbstractFileSystem, protocol: str, root: str) -> bool | None:
    """Whether the bucket / container of ``root`` exists; None when it cannot be told (e.g. denied)."""
    bucket = root.strip("/").split("/", 1)[0]
    if not bucket or kind_of(protocol) is None:
        return None
    try:
        return bool(fs.exists(bucket))
    except Exception:
        return None
