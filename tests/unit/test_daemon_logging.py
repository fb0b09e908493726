"""The daemon's log lines are written from a thread of their own (service/cli/daemon.py,
``logging_off_the_loop``), and none is lost or changed on the way."""

from __future__ import annotations

import contextlib
import io
import logging
import threading

from uvicorn.logging import AccessFormatter

from service.cli.daemon import logging_off_the_loop


def test_lines_are_written_by_another_thread_and_all_of_them_before_it_returns() -> None:
    out = io.StringIO()
    writers: set[str] = set()

    class Recording(logging.StreamHandler):  # type: ignore[type-arg]
        def emit(self, record: logging.LogRecord) -> None:
            writers.add(threading.current_thread().name)
            super().emit(record)

    handler = Recording(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("vramd.test-off-the-loop")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    with logging_off_the_loop("vramd.test-off-the-loop"):
        for i in range(200):
            logger.info("line %d of %s", i, "many")
    lines = out.getvalue().splitlines()
    assert lines[0] == "INFO vramd.test-off-the-loop: line 0 of many"
    assert len(lines) == 200 and lines[-1].endswith("line 199 of many")
    assert threading.current_thread().name not in writers
    assert logger.handlers == [handler]  # put back as they were


def test_uvicorns_access_lines_keep_their_arguments() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(AccessFormatter('%(client_addr)s "%(request_line)s" %(status_code)s'))
    logger = logging.getLogger("vramd.test-access")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    with logging_off_the_loop("vramd.test-access"):
        logger.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", "/healthz", "1.1", 200)
    assert out.getvalue().strip() == '127.0.0.1:5 "GET /healthz HTTP/1.1" 200 OK'


def test_each_loggers_lines_go_to_its_own_handlers_only_in_the_order_they_were_logged() -> None:
    """``vramd serve`` moves vramd's, uvicorn's and uvicorn.access's lines to one thread:
    a vramd line must never reach the access formatter (it reads five arguments and
    fails on any other line) nor be written twice."""
    ours, access = io.StringIO(), io.StringIO()
    plain = logging.StreamHandler(ours)
    plain.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    lines = logging.StreamHandler(access)
    lines.setFormatter(AccessFormatter('%(client_addr)s "%(request_line)s" %(status_code)s'))
    events = logging.getLogger("vramd.test-two")
    requests = logging.getLogger("vramd.test-two-access")
    for logger, handler in ((events, plain), (requests, lines)):
        logger.handlers[:] = [handler]
        logger.propagate = False
        logger.setLevel(logging.INFO)
    errors = io.StringIO()
    raised = logging.raiseExceptions
    with contextlib.redirect_stderr(errors), logging_off_the_loop(events.name, requests.name):
        logging.raiseExceptions = True
        try:
            events.info("%s%s: %s", "[chat] ", "admit", "chat fits on device 0")
            requests.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", "/healthz", "1.1", 200)
            events.info("second")
        finally:
            logging.raiseExceptions = raised
    assert ours.getvalue().splitlines() == [
        "vramd.test-two: [chat] admit: chat fits on device 0",
        "vramd.test-two: second",
    ]
    assert access.getvalue().strip() == '127.0.0.1:5 "GET /healthz HTTP/1.1" 200 OK'
    assert "Logging error" not in errors.getvalue()
