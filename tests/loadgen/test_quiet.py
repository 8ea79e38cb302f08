"""loadgen.quiet: background profiles read from /metrics, waited out, and told apart in time."""

from __future__ import annotations

import http.server
import threading

import httpx
import pytest

from loadgen import quiet
from loadgen.overhead import Sample, _clear_of_profiles, _profiled_during
from loadgen.quiet import Profiling, parse, until_quiet, wait_quiet

METRICS = """# HELP slicegate_estimator_reprofiling 1 while a background profile runs
# TYPE slicegate_estimator_reprofiling gauge
slicegate_estimator_reprofiling {running}
# TYPE slicegate_estimator_reprofiles counter
slicegate_estimator_reprofiles_total{{target="cpu"}} {cpu}
slicegate_estimator_reprofiles_created{{target="cpu"}} 1.7e9
slicegate_estimator_reprofiles_total{{target="cpu:0->cpu:1"}} 1.0
"""


def test_parse_reads_the_gauge_and_sums_the_counters_not_their_creation_times() -> None:
    assert parse(METRICS.format(running="1.0", cpu="2.0")) == Profiling(True, 3.0)
    assert parse(METRICS.format(running="0.0", cpu="0.0")) == Profiling(False, 1.0)
    assert parse("") == Profiling(False, 0.0)  # a server without a profiler


def test_a_pair_is_timed_again_when_a_profile_started_or_ended_during_it() -> None:
    quiet_before = Profiling(False, 2.0)
    assert not _profiled_during(quiet_before, Profiling(False, 2.0))
    assert _profiled_during(quiet_before, Profiling(True, 2.0))  # started
    assert _profiled_during(quiet_before, Profiling(False, 3.0))  # started and ended


async def test_a_pair_a_profile_ran_beside_is_timed_again_once_it_is_over(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # after the 1st timing a profile runs; waited out (it ends: 2 done); the 2nd is clear
    answers = iter([("1.0", "1.0"), ("1.0", "1.0"), ("0.0", "2.0"), ("0.0", "2.0")])
    timed: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        running, cpu = next(answers)
        return httpx.Response(200, text=METRICS.format(running=running, cpu=cpu))

    async def pair() -> Sample:
        timed.append(len(timed))
        return Sample((16, 1), "json", float(len(timed)), None, 2.0)

    monkeypatch.setattr(quiet, "QUIET_POLL_S", 0.001)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler),
                                 base_url="http://server") as client:
        sample, state, again = await _clear_of_profiles(client, pair, Profiling(False, 2.0), 5)
    assert (timed, sample.send_s, again) == ([0, 1], 2.0, 1)
    assert state == Profiling(False, 3.0)
    # with no redo left, the first timing is kept
    answers = iter([("1.0", "1.0")])
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler),
                                 base_url="http://server") as client:
        sample, _, again = await _clear_of_profiles(client, pair, Profiling(False, 2.0), 0)
    assert (sample.send_s, again) == (3.0, 0)


async def test_until_quiet_polls_until_no_profile_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter(["1.0", "1.0", "0.0"])
    polls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        polls.append(request.url.path)
        return httpx.Response(200, text=METRICS.format(running=next(answers), cpu="4.0"))

    monkeypatch.setattr(quiet, "QUIET_POLL_S", 0.001)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler),
                                 base_url="http://server") as client:
        assert await until_quiet(client) == Profiling(False, 5.0)
    assert polls == ["/metrics"] * 3


def test_the_probe_waits_while_the_server_reprofiles(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter(["slicegate_estimator_reprofiling 1.0\n"] * 3
                   + ["slicegate_estimator_reprofiling 0.0\n"])
    polls: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            polls.append(self.path)
            body = next(answers).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    monkeypatch.setattr(quiet, "QUIET_POLL_S", 0.01)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        waited = wait_quiet(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert polls == ["/metrics"] * 4 and waited >= 0.03
