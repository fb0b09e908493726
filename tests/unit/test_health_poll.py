"""A health poll that the HTTP stack fails in an unexpected way is a failed poll."""

import httpx

from service.clock import SystemClock
from service.supervisor import LogRing, SubprocessLauncher, runtime_environment
from service.supervisor.run import LaunchSpec, ProcessRun


def run_polling(transport: httpx.AsyncBaseTransport) -> ProcessRun:
    spec = LaunchSpec(
        argv=("true",),
        env=runtime_environment({}),
        cwd=None,
        port=1,
        health_url="http://127.0.0.1:1/health",
        startup_timeout_s=1.0,
    )
    return ProcessRun(
        spec,
        launcher=SubprocessLauncher(),
        clock=SystemClock(),
        http=httpx.AsyncClient(transport=transport),
        log=LogRing(),
        on_ready=lambda: None,
        kill_timeout_s=1.0,
    )


async def test_a_socket_lost_as_it_connects_is_a_failed_poll_not_an_internal_error() -> None:
    def lost(request: httpx.Request) -> httpx.Response:
        # What anyio raises when the runtime closed the socket as it connected.
        raise AttributeError("'NoneType' object has no attribute 'getpeername'")

    run = run_polling(httpx.MockTransport(lost))
    assert await run._health_says_ready() is False
    assert run.health_polls == 1


async def test_a_ready_answer_is_ready() -> None:
    run = run_polling(httpx.MockTransport(lambda request: httpx.Response(200)))
    assert await run._health_says_ready() is True
