"""The console log: what a session's process writes to stdout and stderr, kept in the store.

Capture (one per process, shared by every live session that asked for it):

- **fd level** for a stream that is the process's own file descriptor 1 or
  2 (a script run from a terminal, a file, a pipe, a batch system): the fd is
  pointed at a pipe with ``os.dup2`` and a reader thread copies everything to
  the original fd (the terminal still shows it) and into each session's
  buffer. This keeps what C extensions, ``os.system`` and child processes
  write too, not only Python's ``print``.
- **Python level** otherwise. In a Jupyter kernel ``sys.stdout`` is
  ipykernel's ``OutStream``, which copies every write to its ``echo`` (its
  own, and the fd-level output of C code and child processes it forwards):
  the capture becomes that echo, passing on to any echo it had, and touches
  nothing else (``write`` is IPython's to wrap around each cell). Every other
  stream (replaced by something, with no fd 1 behind it) has its ``write``
  wrapped on the instance, the same object staying ``sys.stdout``; a stream
  that takes no attributes, or one under IPython that is no OutStream, is
  replaced by a forwarding proxy. Every Python-level copy is one append to
  a shared queue (a kernel's stdout echo is ``list.append`` itself, C code),
  which keeps the two streams' order; a drainer thread hands it to the
  buffers every few milliseconds while output flows. In a kernel the queue
  holds at most what ``OutStream``'s own buffer holds between its flushes
  (milliseconds of output); a wrapped ``write`` also drains it itself past
  :data:`_QUEUE_ITEMS` writes.

Both are undone exactly by :func:`detach` (the last session detaching): the
same fd 1 and 2 (``os.dup2`` from the saved copies), the same ``sys.stdout``
and ``sys.stderr`` objects, and no wrapper left on them.

Each session writes into its own :class:`~launchhelm._console._buffer.ConsoleBuffer`.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Protocol, TextIO, cast

from launchhelm._console._buffer import BUFFER_BYTES, LINE_BYTES, ConsoleBuffer
from launchhelm.storage._progress import note_stderr_captured

if TYPE_CHECKING:
    from typing import TypeAlias, TypeGuard

__all__ = [
    "BUFFER_BYTES",
    "LINE_BYTES",
    "ConsoleBuffer",
    "attach",
    "capture_modes",
    "capture_wanted",
    "detach",
    "drain",
]

#: How much the fd reader takes per read: at most one pipe's worth.
_READ_BYTES = 65536
#: A read smaller than this makes the fd reader wait _BATCH_WAIT seconds before the next.
_SMALL_READ = 16384
_BATCH_WAIT = 0.002
#: How long the fd reader holds the start of a line for its rest before passing it on as it is.
_HOLD_WAIT = 0.05
#: Python-level capture: how often the drainer hands queued writes on while output flows, and at most when idle.
_QUEUE_DRAIN = 0.002
_QUEUE_IDLE = 0.025
#: A Python-level writer drains the queue itself past this many writes (a wrapped ``write``; an echo can't).
_QUEUE_ITEMS = 8192
#: Pipe capacity asked for (Linux): a burst this big goes in without the writer waiting for the reader.
_PIPE_BYTES = 2**20

# -- capture -----------------------------------------------------------------------


#: Writes to a pipe up to this size are atomic: no other writer's bytes land inside, and a kill
#: never leaves half of one (POSIX PIPE_BUF; 4096 on Linux).
_ATOMIC_WRITE = 4096


def _forward(out: int, data: bytes) -> None:
    """Pass ``data`` on to ``out`` in writes of at most :data:`_ATOMIC_WRITE` bytes that end at a
    newline where one is within reach: lines reach the terminal whole, even beside other writers
    to the same pipe (DDP ranks) and when the process is killed between two writes."""
    view, start, size = memoryview(data), 0, len(data)
    while start < size:
        end = min(start + _ATOMIC_WRITE, size)
        if end < size:
            newline = data.rfind(b"\n", start, end)
            if newline >= start:
                end = newline + 1
        chunk = view[start:end]
        while chunk:
            chunk = chunk[os.write(out, chunk) :]
        start = end


class _TeeStream:
    """A forwarding stand-in for a stream whose ``write`` cannot be wrapped in place."""

    def __init__(self, stream: TextIO, tee: Callable[[str], object]) -> None:
        self._lh_stream = stream
        self._lh_tee = tee

    def write(self, text: str) -> object:
        return self._lh_tee(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self._lh_stream, name)


#: What the write queue holds: stdout's writes as they are, stderr's as one-item tuples
#: (bytes only if a caller wrote bytes to a stream that took them).
_Queued: TypeAlias = "str | bytes | tuple[str | bytes]"


class _EchoTarget(Protocol):
    """An ipykernel ``OutStream``'s ``echo``: anything with ``write`` and ``flush``."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


class _Echo:
    """What an ipykernel ``OutStream`` echoes every write to: a copy for the log, then any echo it had.

    Twice per ``print()`` in a notebook, so the copy is as cheap as Python
    allows: stdout's ``write`` is the shared write queue's own
    ``list.append`` (C code: no Python frame, no lock), stderr's appends a
    one-item tuple to the same queue, so the queue keeps the exact order of
    the two streams and :meth:`_WriteQueue.drain` tells them apart.
    ``OutStream`` ignores what its echo's ``write`` returns.
    """

    def __init__(self, previous: _EchoTarget | None, capture: _StreamCapture, queue: _WriteQueue) -> None:
        self._previous = previous
        # set on the instance so ``echo.write`` finds it first (no bound method made per call)
        self.write = self._writer(queue.items.append, capture.name == "stdout")

    def _writer(self, append: Callable[[_Queued], None], plain: bool) -> Callable[[str], object]:
        previous = self._previous
        if previous is None:
            if plain:
                return append  # the C-level append itself

            def write_err(text: str) -> None:
                append((text,))

            return write_err
        hand_on = previous.write

        def write_on(text: str) -> object:
            append(text if plain else (text,))
            return hand_on(text)

        return write_on

    def flush(self) -> None:
        if self._previous is not None:
            self._previous.flush()


class _WriteQueue:
    """The Python-level captures' writes (both streams, in order) until a drain hands them on.

    Every Python-level capture (a kernel's ``OutStream`` echo, a wrapped
    ``write``, a proxy) appends here: stdout's writes as they are, stderr's as
    one-item tuples, so one queue keeps the exact order of the two streams.

    Appends come from any thread without a lock (``list.append`` is atomic).
    A drainer thread empties the queue every :data:`_QUEUE_DRAIN` seconds
    while output flows (backing off to :data:`_QUEUE_IDLE` when there is
    none), so a printing loop pays only the append, and what waits in memory
    is at most a few milliseconds of output; the session's flush drains it
    too, before each take.
    """

    def __init__(self, owner: _Capture) -> None:
        self.items: list[_Queued] = []
        self._owner = owner
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="launchhelm-console-queue", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        wait = _QUEUE_DRAIN
        while not self._stop.wait(wait):
            wait = _QUEUE_DRAIN if self.drain() else min(_QUEUE_IDLE, wait * 2)

    def drain(self) -> bool:
        """Hand everything queued so far to the buffers, each run of one stream as one feed.

        No Python-level loop over the writes in the usual case: the queue is
        a list (``list.append`` is atomic), taken with a slice and a ``del``
        of that many items (appends in between stay), and joined at once
        unless stderr wrote too.
        """
        with self._lock:
            items = self.items
            n = len(items)
            if not n:
                return False
            batch = items[:n]
            del items[:n]
            try:
                text = "".join(cast("list[str]", batch))  # stdout alone: the usual case
            except TypeError:  # stderr's tuples among them (or something that is no str)
                self._feed_mixed(batch)
            else:
                self._feed_text(text, "stdout")
            return True

    def _feed_mixed(self, batch: list[_Queued]) -> None:
        run: list[str | bytes] = []
        stream = "stdout"
        for item in batch:
            name = "stderr" if type(item) is tuple else "stdout"
            if name != stream:
                if run:
                    self._feed(run, stream)
                    run = []
                stream = name
            run.append(item[0] if isinstance(item, tuple) else item)
        if run:
            self._feed(run, stream)

    def _feed(self, batch: list[str | bytes], stream: str) -> None:
        try:
            text = "".join(x if isinstance(x, str) else bytes(x).decode("utf-8", "replace") for x in batch)
        except Exception:  # never let the copy break the program's output
            return
        self._feed_text(text, stream)

    def _feed_text(self, text: str, stream: str) -> None:
        try:
            data = text.encode("utf-8", "replace")
        except Exception:
            return
        for sink in self._owner.sinks:
            sink.feed(data, stream)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(1.0)
        self.drain()


class _OutStream(Protocol):
    """What is used of an ipykernel ``OutStream`` beyond a text stream: its ``echo``."""

    echo: _EchoTarget | None

    def flush(self) -> None: ...


def _is_outstream(stream: object) -> TypeGuard[_OutStream]:
    iostream = sys.modules.get("ipykernel.iostream")
    return iostream is not None and isinstance(stream, iostream.OutStream) and hasattr(stream, "echo")


class _StreamCapture:
    """One of stdout / stderr, captured at fd or Python level until :meth:`stop`."""

    def __init__(self, name: str, fd: int, owner: _Capture) -> None:
        self.name = name
        self.fd = fd
        self._owner = owner
        self.mode = "off"
        self._saved_fd: int | None = None
        self._reader: threading.Thread | None = None
        self._recording = True
        self._stream: TextIO | None = None
        self._had_write: Callable[[str], object] | None = None  # the instance's own ``write`` before ours (None: none)
        self._our_write: Callable[[str], object] | None = None
        self._proxy: _TeeStream | None = None
        self._echo: _Echo | None = None
        self._had_echo: _EchoTarget | None = None

    # -- start ---------------------------------------------------------------------
    def start(self, join: _StreamCapture | None = None) -> None:
        """Start capturing; ``join``: a stream already captured at fd level whose pipe this one shares."""
        stream = getattr(sys, self.name, None)
        if stream is None:
            return
        self._stream = stream
        if _is_fd_stream(stream, self.fd):
            if join is not None and join.mode == "fd":
                self._start_joined(stream, join)
            else:
                self._start_fd(stream)
        else:
            self._start_python(stream)

    def _start_joined(self, stream: TextIO, join: _StreamCapture) -> None:
        """Write into ``join``'s pipe: stdout and stderr to one terminal or file keep their exact order."""
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
        saved = os.dup(self.fd)
        try:
            os.dup2(join.fd, self.fd)
        except OSError:
            os.close(saved)
            raise
        self._saved_fd = saved
        self.mode = "fd"
        self._note_terminal(saved)

    def _start_fd(self, stream: TextIO) -> None:
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
        saved = os.dup(self.fd)
        try:
            read_end, write_end = os.pipe()
        except OSError:
            os.close(saved)
            raise
        try:
            os.dup2(write_end, self.fd)
        except OSError:
            os.close(saved)
            os.close(read_end)
            raise
        finally:
            os.close(write_end)  # fd 1 (or 2) holds the pipe's write end now
        import fcntl  # fd capture is POSIX only (see _is_fd_stream)

        if hasattr(fcntl, "F_SETPIPE_SZ"):
            try:  # room for a burst while the reader waits (Linux; 64 KiB otherwise)
                fcntl.fcntl(read_end, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
            except OSError:
                pass
        self._saved_fd = saved
        self.mode = "fd"
        self._note_terminal(saved)
        self._reader = threading.Thread(
            target=self._pump, args=(read_end, saved), name=f"launchhelm-console-{self.name}", daemon=True
        )
        self._reader.start()

    def _note_terminal(self, saved: int | None) -> None:
        """Tell the progress bars whether stderr still reaches a terminal now that fd 2 is our pipe."""
        if self.fd == 2:
            note_stderr_captured(None if saved is None else os.isatty(saved))

    def _pump(self, read_end: int, out: int) -> None:
        """Reader thread: the pipe to the original fd and to every sink, until the pipe's writers are gone.

        A read that ends mid-line (an unbuffered ``print("saving", 12)`` is four writes) passes on
        what ends at its last newline and keeps the rest for the next read, waiting at most
        :data:`_HOLD_WAIT` for it (a progress bar that never ends its line still shows): the
        terminal gets whole lines, also when the process is SIGKILLed between two of its writes
        and the rest of the line sits unread in the pipe.
        """
        forward = True
        held = b""  # the start of a line, not yet passed on to the terminal
        # one buffer for every read: os.read allocates the most and shrinks it to what came, and a
        # flood's thousands of those a second leave holes in the heap that RSS keeps
        chunk = bytearray(_READ_BYTES)
        view = memoryview(chunk)
        try:
            while True:
                if held and not select.select([read_end], [], [], _HOLD_WAIT)[0]:
                    forward = self._pass_on(out, held, forward)
                    held = b""
                try:
                    got = os.readv(read_end, [chunk])
                except OSError:
                    break
                if not got:
                    break
                data = bytes(view[:got])
                if self._recording:
                    for sink in self._owner.sinks:
                        sink.feed(data, self.name)
                whole = held + data if held else data
                cut = whole.rfind(b"\n") + 1
                if cut < len(whole) and len(whole) - cut <= _ATOMIC_WRITE:
                    whole, held = whole[:cut], whole[cut:]
                else:
                    held = b""
                if whole:
                    forward = self._pass_on(out, whole, forward)
                if len(data) < _SMALL_READ and not held:
                    # an unbuffered writer (PYTHONUNBUFFERED, a C printf) writes line by line: let a
                    # few lines gather in the pipe rather than wake up (and take the GIL) for each
                    time.sleep(_BATCH_WAIT)
            if held:
                self._pass_on(out, held, forward)
        finally:
            os.close(read_end)
            os.close(out)

    @staticmethod
    def _pass_on(out: int, data: bytes, forward: bool) -> bool:
        """Forward ``data`` to the terminal; False once it went away (then keep recording only)."""
        if not forward:
            return False
        try:
            _forward(out, data)
        except OSError:
            return False  # the terminal went away (a closed pipe)
        return True

    def _start_python(self, stream: TextIO) -> None:
        original = stream.write
        queue = self._owner.write_queue()
        items, drain, most, plain = queue.items, queue.drain, _QUEUE_ITEMS, self.name == "stdout"

        def write(text: str) -> object:
            # twice per print(): the write, one append to the shared queue (its drainer hands it on),
            # and a length check (a loop whose writes release the GIL for a moment, as a file's do,
            # can keep the drainer from it: then the writer drains)
            written = original(text)
            items.append(text if plain else (text,))
            if len(items) > most:
                drain()
            return written

        if _is_outstream(stream):
            # ipykernel's stream copies every write, its own and the fd-level output it forwards (C
            # code, child processes), to its ``echo``: be that echo (passing on to any it had)
            self._had_echo = stream.echo
            self._echo = _Echo(stream.echo, self, self._owner.write_queue())
            stream.echo = self._echo
            self.mode = "kernel"
            return
        if not _in_ipython():
            self._had_write = getattr(stream, "__dict__", {}).get("write")
            try:
                setattr(stream, "write", write)  # noqa: B010 (mypy refuses assigning to a method)
                self.mode = "python"
                self._our_write = write
                return
            except (AttributeError, TypeError):  # a C stream (io.StringIO...): a proxy instead
                pass
        # IPython wraps ``write`` on the stream object around each cell and puts back what was there
        # before the cell, which would undo a wrapper set during it: stand a proxy in the stream's place
        self._proxy = _TeeStream(stream, write)
        setattr(sys, self.name, self._proxy)
        self.mode = "proxy"

    # -- stop ----------------------------------------------------------------------
    def stop(self, drain_timeout: float = 2.0) -> None:
        """Put everything back as it was; what was written before this is recorded."""
        mode, self.mode = self.mode, "off"
        if mode == "fd":
            self._stop_fd(drain_timeout)
        elif mode == "python":
            stream = self._stream
            if getattr(stream, "__dict__", {}).get("write") is self._our_write:
                if self._had_write is None:
                    delattr(stream, "write")
                else:
                    setattr(stream, "write", self._had_write)  # noqa: B010 (as in _start_python)
        elif mode == "kernel":
            if getattr(self._stream, "echo", None) is self._echo:
                setattr(self._stream, "echo", self._had_echo)  # noqa: B010 (echo: an OutStream's, not TextIO's)
        elif mode == "proxy" and getattr(sys, self.name, None) is self._proxy:
            setattr(sys, self.name, self._stream)
        self._stream = self._proxy = self._our_write = self._had_write = self._echo = self._had_echo = None

    def _stop_fd(self, drain_timeout: float) -> None:
        saved, reader = self._saved_fd, self._reader
        self._saved_fd = self._reader = None
        assert saved is not None
        self._note_terminal(None)
        try:
            current = getattr(sys, self.name, None)
            if current is not None:
                current.flush()  # Python's buffered text goes into the pipe, and so into the log
        except (OSError, ValueError):
            pass
        finally:
            # fd back to the original; the pipe ends once no child process holds it
            os.dup2(saved, self.fd)
        if reader is None:  # it wrote into the other stream's pipe: that one's reader drains it
            os.close(saved)
            return
        reader.join(drain_timeout)
        if reader.is_alive():
            # a child process still writes to the pipe: keep forwarding it to the terminal, no longer recording
            self._recording = False


def _in_ipython() -> bool:
    ipython = sys.modules.get("IPython")
    try:
        return ipython is not None and ipython.get_ipython() is not None
    except Exception:  # a half-imported IPython
        return False


def _is_fd_stream(stream: TextIO, fd: int) -> bool:
    """Whether ``stream`` writes straight to fd ``fd`` (so capturing the fd keeps all it writes)."""
    if os.name != "posix" or type(stream).__name__ == "OutStream":
        return False
    try:
        return bool(stream.fileno() == fd) and os.fstat(fd) is not None
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both of the first two
        return False


def _same_file(a: int, b: int) -> bool:
    try:
        return os.path.samestat(os.fstat(a), os.fstat(b))
    except OSError:
        return False


class _Capture:
    """The process's one capture of stdout and stderr, fanned out to every attached buffer."""

    def __init__(self) -> None:
        self.sinks: tuple[ConsoleBuffer, ...] = ()
        self.streams: list[_StreamCapture] = []
        self.lock = threading.Lock()
        self._queue: _WriteQueue | None = None  # the Python-level writes, when a stream is captured so

    def write_queue(self) -> _WriteQueue:
        """The queue every Python-level capture writes into (started with the first)."""
        if self._queue is None:
            self._queue = _WriteQueue(self)
        return self._queue

    def drain(self) -> None:
        """Hand every Python-level write so far to the buffers (before a flush takes them)."""
        if self._queue is not None:
            self._queue.drain()

    def attach(self, sink: ConsoleBuffer) -> None:
        with self.lock:
            if not self.sinks:
                started: list[_StreamCapture] = []
                shared = _same_file(1, 2)  # a terminal, or `> log 2>&1`: one pipe keeps the order exact
                try:
                    for name, fd in (("stdout", 1), ("stderr", 2)):
                        stream = _StreamCapture(name, fd, self)
                        stream.start(join=started[0] if started and shared else None)
                        started.append(stream)
                except BaseException:
                    for stream in reversed(started):
                        stream.stop()
                    raise
                self.streams = started
            self.sinks = (*self.sinks, sink)

    def detach(self, sink: ConsoleBuffer) -> None:
        with self.lock:
            if sink not in self.sinks:
                return
            if len(self.sinks) == 1:
                streams, self.streams = self.streams, []
                try:
                    for stream in reversed(streams):
                        try:
                            stream.stop()
                        except Exception as exc:  # the other stream must still be put back
                            print(f"launchhelm: could not restore sys.{stream.name}: {exc}", file=sys.__stderr__)
                    if self._queue is not None:
                        self._queue.stop()  # the last of it reaches the sink
                finally:
                    self._queue = None
                    self.sinks = ()
            else:
                self.drain()  # what was written so far reaches this sink too
                self.sinks = tuple(s for s in self.sinks if s is not sink)

    def modes(self) -> dict[str, str]:
        return {s.name: s.mode for s in self.streams}


_capture = _Capture()


def attach(limit: int = BUFFER_BYTES, line_limit: int = LINE_BYTES) -> ConsoleBuffer:
    """Start keeping this process's stdout and stderr in a new buffer (the capture starts with the first)."""
    sink = ConsoleBuffer(limit, line_limit)
    _capture.attach(sink)
    return sink


def drain() -> None:
    """Hand what Python-level captures gathered to the buffers (the flush calls it before a take)."""
    _capture.drain()


def detach(sink: ConsoleBuffer) -> None:
    """Stop filling ``sink``; the last one detached puts fds and ``sys`` streams back exactly."""
    _capture.detach(sink)


@contextlib.contextmanager
def terminal_fds() -> Iterator[dict[int, int]]:
    """While held: ``{1: fd, 2: fd}`` for each of fd 1 and 2 captured through a pipe, the copy of what it was
    before (the terminal, a file). A child process started now with these as its stdout and stderr writes
    where this process wrote before; one that inherits fd 1 and 2 holds the capture's pipes open, and the
    capture's end then waits out its drain timeout for that child to exit. The capture cannot stop (and
    close these copies) until the block ends."""
    with _capture.lock:
        yield {s.fd: s._saved_fd for s in _capture.streams if s._saved_fd is not None and s._reader is not None}


def capture_modes() -> dict[str, str]:
    """How each stream is captured now: ``{"stdout": "fd" | "python" | "proxy", ...}`` (empty: not at all)."""
    return _capture.modes()


def capture_wanted(requested: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process captures its console: asked for, and rank 0 of a distributed job.

    The rank is ``torch.distributed``'s when it is initialised, else the
    ``RANK`` variable torchrun sets (absent: rank 0). Other ranks' output is
    the launcher's to keep.
    """
    if not requested:
        return False
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return bool(dist.get_rank() == 0)
        except Exception:  # a half-imported torch: fall back to the environment
            pass
    text = (os.environ if environ is None else environ).get("RANK", "").strip()
    return not text.isdigit() or int(text) == 0
