"""app.export.common.stop_kaleido: kaleido's stop, bounded. A stop that never returns (kaleido's
server thread waiting on a browser already gone, as once in CI) gives up after the timeout, marks
kaleido's server object stopped (its exit hook then returns at once) and puts a fresh one in its
place; a stop that returns is passed through."""

import threading
import time

import kaleido

from app.export import common


class FakeServer:
    """kaleido's singleton's shape: a class-level _instance and an _initialized flag."""
    _instance = None

    def __init__(self):
        self._initialized = True


def test_a_stop_that_never_returns_is_given_up_and_the_server_replaced(monkeypatch):
    release = threading.Event()
    calls = []

    def stuck_stop(**kw):
        calls.append(kw)
        release.wait(30)                               # the hang, let go at the end of the test

    old = FakeServer()
    monkeypatch.setattr(kaleido, "stop_sync_server", stuck_stop)
    monkeypatch.setattr(kaleido, "_global_server", old, raising=False)
    t0 = time.monotonic()
    try:
        assert common.stop_kaleido(timeout_s=0.3) is False
        waited = time.monotonic() - t0
        assert 0.3 <= waited < 5, waited
        assert calls == [{"silence_warnings": True}]
        assert old._initialized is False               # its exit hook's close returns at once
        assert kaleido._global_server is not old and isinstance(kaleido._global_server, FakeServer)
    finally:
        release.set()


def test_a_stop_that_returns_is_passed_through(monkeypatch):
    old = FakeServer()
    monkeypatch.setattr(kaleido, "stop_sync_server", lambda **kw: None)
    monkeypatch.setattr(kaleido, "_global_server", old, raising=False)
    assert common.stop_kaleido(timeout_s=5) is True
    assert kaleido._global_server is old and old._initialized is True
