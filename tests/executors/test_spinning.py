"""SpinWait: polling a pipe for a short while before sleeping on it (the process executor's)."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from aenvs._spinning import SpinWait


@pytest.fixture
def pipe() -> Iterator[tuple[socket.socket, select.poll]]:
    """A socket pair: the end to write, and a poller of the other end."""
    writer, reader = socket.socketpair()
    poller = select.poll()
    poller.register(reader.fileno(), select.POLLIN)
    try:
        yield writer, poller
    finally:
        writer.close()
        reader.close()


class CountingPoll:
    def __init__(self, poller: select.poll) -> None:
        self.poller = poller
        self.timeouts: list[float] = []

    def __call__(self, timeout: float) -> list[tuple[int, int]]:
        self.timeouts.append(timeout)
        return self.poller.poll(timeout)


def test_a_message_sent_while_it_polls_ends_the_wait(pipe: tuple[socket.socket, select.poll]) -> None:
    writer, poller = pipe
    polling = CountingPoll(poller)
    spin = SpinWait(30.0)  # a window far longer than the test: only the message can end it
    started = threading.Event()

    def send_once_polled() -> None:
        started.wait(10)
        writer.send(b"x")

    def poll(timeout: float) -> list[tuple[int, int]]:
        started.set()
        return polling(timeout)

    sender = threading.Thread(target=send_once_polled)
    sender.start()
    ready = spin.poll(poll)
    sender.join(10)
    assert len(ready) == 1 and ready[0][1] & select.POLLIN
    assert set(polling.timeouts) == {0}  # never slept in poll


def test_nothing_within_the_window_returns_empty_after_polling(
    pipe: tuple[socket.socket, select.poll],
) -> None:
    _, poller = pipe
    polling = CountingPoll(poller)
    spin = SpinWait(0.002)
    began = time.perf_counter()
    assert spin.poll(polling) == []
    assert time.perf_counter() - began >= 0.002
    assert len(polling.timeouts) > 1 and set(polling.timeouts) == {0}


def test_a_deadline_before_the_window_ends_it_sooner(pipe: tuple[socket.socket, select.poll]) -> None:
    _, poller = pipe
    spin = SpinWait(30.0)
    began = time.perf_counter()
    assert spin.poll(poller.poll, deadline=began + 0.002) == []
    assert time.perf_counter() - began < 30.0


@pytest.mark.parametrize(
    ("window", "waited", "worth"),
    [
        (0.001, 0.0005, True),  # the other side answered within the window
        (0.001, 0.005, True),  # a little longer: spinning still pays
        (0.001, 0.5, False),  # a slow env or policy: sleep at once
        (0.0, 0.0, False),  # spinning turned off
    ],
)
def test_waits_much_longer_than_the_window_stop_the_spinning(
    pipe: tuple[socket.socket, select.poll], window: float, waited: float, worth: bool
) -> None:
    _, poller = pipe
    spin = SpinWait(window)
    spin.record(waited)
    assert spin.worth is worth
    polling = CountingPoll(poller)
    spin.poll(polling)
    assert (len(polling.timeouts) > 1) is worth  # one look only, when not worth it
    spin.record(window / 2)  # a quick answer again: spinning comes back (unless turned off)
    assert spin.worth is (window > 0)


def test_a_negative_window_is_refused() -> None:
    with pytest.raises(ValueError, match="spin_wait must be >= 0"):
        SpinWait(-0.001)
