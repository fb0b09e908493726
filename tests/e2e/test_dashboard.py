"""The dashboard in a real headless Chromium against a real ``vramd serve``.

The daemon runs a copy of ``config/demo.yaml`` shrunk to a small budget (four demo
services, one pinned, one preloaded); Chromium loads ``GET /`` and the test reads the
DOM over the DevTools protocol: every service and its state, the memory bar, the events,
a working "unload" button, values from the server shown as text and never as markup,
and no script error or CSP violation. A screenshot lands in ``artifacts/dashboard.png``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from support.browser import Page, chromium, find_or_install_chromium
from support.daemon import REPO_ROOT, Daemon, demo_command, policy_yaml, running_daemon

pytestmark = pytest.mark.timeout(300)

ARTIFACTS = REPO_ROOT / "artifacts"
# Model names may hold markup characters; the page must show them as text.
HOSTILE_MODEL = "<img/src=x/onerror=window.__pwned=1>"
CHAT_MODEL = "demo-chat"


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path, why = find_or_install_chromium()
    if path is None:
        pytest.skip(why)
    return path


def demo_policy(*, admin_key: str | None = None) -> str:
    """``config/demo.yaml`` with a small budget, small runtimes and quick loads."""
    policy: dict[str, Any] = yaml.safe_load((REPO_ROOT / "config" / "demo.yaml").read_text())
    policy.pop("server", None)  # the test picks the port and the database
    policy["device"].update(budget="640MiB", headroom="32MiB", sample_interval="0.25s")
    sizes = {"chat": 120, "embed": 40, "image": 160, "speech": 60}
    for name, service in policy["services"].items():
        mib = sizes[name]
        command = service["command"]
        command[command.index("--memory") + 1] = f"{mib}MiB"
        command[command.index("--load-seconds") + 1] = "0.2"
        service["memory"] = {"estimate": f"{mib + 30}MiB", "cap": f"{mib * 2}MiB"}
    policy["services"]["embed"]["models"].append(HOSTILE_MODEL)
    if admin_key:
        policy["server"] = {"admin_keys": [admin_key]}
    return yaml.safe_dump(policy, sort_keys=False)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with running_daemon(demo_policy(), tmp_path, in_thread=True) as daemon:
        daemon.wait_for(
            lambda: all(daemon.service(n)["state"] == "ready" for n in ("chat", "embed"))
        )
        yield daemon


def table(page: Page) -> dict[str, dict[str, Any]]:
    rows = page.evaluate(
        """JSON.stringify([...document.querySelectorAll('#services tbody tr')].map(r => ({
            name: r.dataset.service,
            state: r.querySelector('[data-field=state] .badge').textContent,
            models: r.querySelector('.models').textContent,
            buttons: [...r.querySelectorAll('button')].map(b => b.getAttribute('aria-label')),
        })))"""
    )
    return {row["name"]: row for row in json.loads(rows)}


def test_dashboard_shows_services_and_unloads_one(
    daemon: Daemon, chromium_path: str, tmp_path: Path
) -> None:
    asked = daemon.post(
        "/v1/chat/completions",
        json={"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}]},
        headers={"X-Vramd-Client": "family-laptop"},
    )
    assert asked.status_code == 200, asked.text
    with chromium(chromium_path, tmp_path) as page:
        page.set_viewport(1280, 800)
        page.navigate(daemon.url + "/")
        page.wait_for("document.querySelectorAll('#services tbody tr').length === 4")
        page.wait_for(
            "document.querySelector('tr[data-service=embed] .badge')?.textContent === 'ready'"
        )

        rows = table(page)
        assert list(rows) == ["chat", "embed", "image", "speech"]
        api = {s["name"]: s["state"] for s in daemon.get("/api/services").json()}
        assert {name: row["state"] for name, row in rows.items()} == api
        assert rows["chat"]["buttons"] == ["Load chat", "Unload chat", "Restart chat"]

        # Server strings are text: the hostile model name is shown, not run or parsed.
        assert HOSTILE_MODEL in rows["embed"]["models"]
        assert page.evaluate("window.__pwned === undefined")
        assert page.evaluate("document.querySelectorAll('main img').length") == 0

        # The memory bar: one segment per loaded service, and the budget line.
        page.wait_for("document.querySelector('.bar [data-segment=chat]') !== null")
        assert page.evaluate("document.querySelector('.bar [data-segment=embed]') !== null")
        assert page.evaluate("document.querySelector('.bar .budget-line') !== null")
        assert "chat" in page.evaluate("document.querySelector('.bar').getAttribute('aria-label')")

        # Events from the first page and the live stream; a chart drawn from samples.
        page.wait_for("document.querySelectorAll('#events li.ev').length > 0")
        page.wait_for("document.getElementById('conn').dataset.state === 'live'")
        page.wait_for("document.querySelector('.chart[data-service=chat] path.line') !== null")
        assert page.evaluate("document.querySelector('#incidents').textContent").strip()
        # Usage by client: the request above, under the name its client gave.
        page.wait_for("document.querySelector('#usage table.usage') !== null")
        usage = page.evaluate("document.querySelector('#usage tbody tr').textContent")
        assert usage.startswith("family-laptopchat1"), usage

        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(ARTIFACTS / "dashboard.png")
        page.screenshot(ARTIFACTS / "dashboard-full.png", full_page=True)

        page.evaluate(
            "document.querySelector('tr[data-service=embed] [data-action=unload]').click()"
        )
        daemon.wait_for(lambda: daemon.service("embed")["state"] == "stopped")
        page.wait_for(
            "document.querySelector('tr[data-service=embed] .badge').textContent === 'stopped'"
        )
        page.wait_for("document.querySelector('.bar [data-segment=embed]') === null")
        # The stream delivered the unload's events to the list.
        page.wait_for(
            "[...document.querySelectorAll('#events .ev-message')]"
            ".some(m => m.textContent.includes('unload embed requested'))"
        )
        assert (
            page.evaluate(
                "document.querySelector('tr[data-service=embed] [data-action=load]').disabled"
            )
            is False
        )
        assert page.problems() == []


def test_dashboard_shows_what_a_waiting_service_waits_for(
    chromium_path: str, tmp_path: Path
) -> None:
    hi = {
        "kind": "chat",
        "models": ["hi"],
        "command": demo_command("200MiB"),
        "memory": {"estimate": "260MiB"},
        "residency": "warm",
        "preload": True,
        "priority": 300,
        "protect": "10m",
    }
    lo = {**hi, "models": ["lo"], "residency": "on-demand", "priority": 100}
    lo.pop("preload")
    lo["queue"] = {"max": 4, "timeout": "60s"}  # hi yields only near its deadline
    policy = policy_yaml({"hi": hi, "lo": lo}, budget="450MiB")
    with running_daemon(policy, tmp_path, in_thread=True) as daemon:
        daemon.wait_for(lambda: daemon.service("hi")["state"] == "ready")
        answers: list[int] = []
        request = threading.Thread(
            target=lambda: answers.append(
                httpx.post(
                    f"{daemon.url}/v1/chat/completions",
                    json={"model": "lo", "messages": [{"role": "user", "content": "x"}]},
                    timeout=90,
                ).status_code
            ),
            daemon=True,
        )
        request.start()
        daemon.wait_for(lambda: daemon.service("lo")["waiting_for"] is not None)
        with chromium(chromium_path, tmp_path) as page:
            page.navigate(daemon.url + "/")
            page.wait_for(
                "document.querySelector('tr[data-service=lo] .waiting')?.textContent"
                ".includes('hi (warm, priority 300)')"
            )
            text = page.evaluate(
                "document.querySelector('tr[data-service=lo] .waiting').textContent"
            )
            assert "yields by" in text and "at the latest" in text
            assert page.problems() == []
    # Not waiting out hi's protection (tests/e2e/test_scheduling_e2e.py does): stopping
    # the daemon answers the waiting request at once.
    request.join(30)
    assert answers == [503]


def test_dashboard_asks_for_the_admin_key(chromium_path: str, tmp_path: Path) -> None:
    with running_daemon(demo_policy(admin_key="sesame-0123"), tmp_path, in_thread=True) as daemon:
        assert daemon.get("/api/status").status_code == 401
        assert daemon.get("/").status_code == 200  # the page itself holds no data
        assert daemon.get("/metrics").status_code == 200  # scrapers cannot send keys
        with chromium(chromium_path, tmp_path) as page:
            page.navigate(daemon.url + "/")
            page.wait_for("!document.getElementById('keygate').hidden")
            assert page.evaluate("document.getElementById('app').hidden") is True

            page.evaluate(
                "document.getElementById('key-input').value = 'wrong';"
                "document.getElementById('key-form').requestSubmit()"
            )
            page.wait_for("!document.getElementById('key-error').hidden")

            page.evaluate(
                "document.getElementById('key-input').value = 'sesame-0123';"
                "document.getElementById('key-form').requestSubmit()"
            )
            page.wait_for("document.querySelectorAll('#services tbody tr').length === 4")
            assert page.evaluate("sessionStorage.getItem('vramd.adminKey')") == "sesame-0123"
            # No EventSource with a key (it cannot send headers): events are polled.
            page.wait_for("document.getElementById('conn').dataset.state === 'polling'")
            page.wait_for("document.querySelectorAll('#events li.ev').length > 0")

            # A reload keeps the key for the tab.
            page.navigate(daemon.url + "/")
            page.wait_for("document.querySelectorAll('#services tbody tr').length === 4")
            assert page.evaluate("document.getElementById('keygate').hidden") is True
            # 401s for the wrong key are expected above; nothing else may go wrong.
            assert [p for p in page.problems() if "401" not in p] == []


def test_assets_are_served_from_the_package(daemon: Daemon) -> None:
    page = daemon.get("/")
    assert page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert '<script src="/ui/app.js"' in page.text
    assert "{{version}}" not in page.text
    script = daemon.get("/ui/app.js")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    assert daemon.get("/ui/style.css").headers["content-type"].startswith("text/css")
    # Only the listed files: no path reaches the file system.
    assert daemon.get("/ui/__init__.py").status_code == 404
    assert daemon.get("/ui/..%2F..%2Fpyproject.toml").status_code == 404
    # Everything is local: no CDN, no external font.
    for text in (page.text, script.text, daemon.get("/ui/style.css").text):
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in text
