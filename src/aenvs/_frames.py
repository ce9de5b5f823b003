"""Messages over a stream socket: each one a frame, its length (8 bytes) then its bytes.

The process executor's two ends speak this on their socket pair. The pool's end is
non-blocking: it reads whatever has arrived and keeps a frame that is still arriving
(:class:`FrameReader`), so its event loop never waits for the rest of a message; a
worker's end blocks, and reads frames whole (:meth:`FrameReader.read`).
"""

from __future__ import annotations

import socket
import struct

__all__ = ["HEADER", "FrameReader", "frame"]

HEADER = struct.Struct("<Q")
"""A frame's header: the length of what follows."""

_CHUNK = 1 << 16  # the buffer a reader starts with (and returns to after a large frame)


def frame(payload: bytes) -> bytes:
    """``payload`` as one frame, ready to write.

    Example:
        >>> frame(b"hi")
        b'\\x02\\x00\\x00\\x00\\x00\\x00\\x00\\x00hi'
    """
    return HEADER.pack(len(payload)) + payload


class FrameReader:
    """The frames arriving on ``sock``: each :meth:`receive` reads what the socket holds
    (once, up to the buffer's room), each :meth:`next` hands over a frame that arrived whole.

    The buffer grows to hold a frame larger than it, so a large frame is read straight
    into place, once, whatever the socket's buffer size.

    Example:
        >>> a, b = socket.socketpair()
        >>> b.setblocking(False)
        >>> reader = FrameReader(b)
        >>> data = frame(b"one") + frame(b"two")
        >>> _ = a.send(data[:5])
        >>> reader.receive(), reader.next()  # part of a header: no frame yet
        (5, None)
        >>> _ = a.send(data[5:])
        >>> reader.receive(), bytes(reader.next()), bytes(reader.next()), reader.next()
        (17, b'one', b'two', None)
        >>> a.close(); reader.receive()  # the other end closed
        0
        >>> b.close()
    """

    __slots__ = ("_buffer", "_end", "_sock", "_start")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = bytearray(_CHUNK)
        self._start = 0  # where the first frame not handed over begins
        self._end = 0  # where what was read ends

    def receive(self) -> int:
        """Read once what the socket holds, into the buffer; how many bytes (0: the other
        end closed). Raises ``BlockingIOError`` when a non-blocking socket holds nothing."""
        buffer, start, end = self._buffer, self._start, self._end
        if start == end and start:
            start = end = self._start = self._end = 0
            if len(buffer) > _CHUNK:  # a large frame went through: give its memory back
                buffer = self._buffer = bytearray(_CHUNK)
        # room from the frame's start for all of it once its header is in, and for more
        want = max(_CHUNK, end - start + 1)
        if end - start >= HEADER.size:
            want = max(want, HEADER.size + HEADER.unpack_from(buffer, start)[0])
        if len(buffer) - start < want:
            if start:  # move what arrived of the frame to the front
                buffer[: end - start] = buffer[start:end]
                end -= start
                self._start, self._end = 0, end
            if len(buffer) < want:
                buffer.extend(bytes(want - len(buffer)))
        read = self._sock.recv_into(memoryview(buffer)[end:])
        self._end = end + read
        return read

    def next(self) -> bytearray | None:
        """The next frame that arrived whole (its bytes, without the header), or None."""
        buffer, start, end = self._buffer, self._start, self._end
        if end - start < HEADER.size:
            return None
        stop = start + HEADER.size + HEADER.unpack_from(buffer, start)[0]
        if stop > end:
            return None
        self._start = stop
        return buffer[start + HEADER.size : stop]

    def read(self) -> bytearray:
        """The next frame, waiting for it (a blocking socket); EOFError if the other end closed."""
        while (data := self.next()) is None:
            if not self.receive():
                raise EOFError("the other end closed the socket")
        return data

    @property
    def has_frame(self) -> bool:
        """Whether a frame that arrived whole waits in the buffer (:meth:`next` returns it)."""
        start, end = self._start, self._end
        if end - start < HEADER.size:
            return False
        return start + HEADER.size + HEADER.unpack_from(self._buffer, start)[0] <= end
