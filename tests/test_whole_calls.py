"""A Ctrl-C during a device layer's call waits for the call to end (pgmo.device.whole_calls)."""

from __future__ import annotations

import signal
import threading

import pytest

from pgmo.device.whole_calls import whole


@pytest.fixture
def sigint():
    """Puts back the SIGINT handler the test found."""
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


def make_call(done):
    @whole
    def call(value):
        signal.raise_signal(signal.SIGINT)  # a Ctrl-C in the middle of the call
        done.append(value)
        return value

    return call


def test_a_ctrl_c_in_a_call_is_a_keyboard_interrupt_once_the_call_ended(sigint):
    signal.signal(signal.SIGINT, signal.default_int_handler)
    done: list = []
    with pytest.raises(KeyboardInterrupt):
        make_call(done)(7)
    assert done == [7]  # the call ran to its end first
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_users_own_handler_hears_the_ctrl_c_once_after_the_call(sigint):
    heard: list = []
    done: list = []

    def handler(signum, frame):
        heard.append((signum, list(done)))

    signal.signal(signal.SIGINT, handler)
    assert make_call(done)(3) == 3
    assert heard == [(signal.SIGINT, [3])]  # once, and after the call's work
    assert signal.getsignal(signal.SIGINT) is handler


def test_an_ignored_ctrl_c_stays_ignored(sigint):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    done: list = []
    assert make_call(done)(1) == 1 and done == [1]
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_call_that_fails_puts_the_handler_back(sigint):
    signal.signal(signal.SIGINT, signal.default_int_handler)

    @whole
    def refused():
        raise MemoryError("out of device memory")

    with pytest.raises(MemoryError):
        refused()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_another_threads_call_leaves_the_handlers_alone(sigint):
    """Python runs signal handlers in the main thread only (and lets no other thread set
    them): a call from a loader thread runs as it is."""
    seen: list = []

    @whole
    def call():
        seen.append(signal.getsignal(signal.SIGINT))
        return 5

    results: list = []
    thread = threading.Thread(target=lambda: results.append(call()))
    thread.start()
    thread.join()
    assert results == [5] and seen == [signal.getsignal(signal.SIGINT)]
