"""The web console in a real headless browser (Debian's chromium, driven by selenium
through chromium-driver) against a real ``hqueue server --auth-file --console-port``.

One server and one browser for the module. Screenshots go to the test's
temporary directory, and to ``tests/artifacts/console/`` too when
``HQUEUE_CONSOLE_SCREENSHOTS=1``; each is checked: its size, and in a
chart's screenshot the series' colour drawn over many pixels.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from hqueue import Message
from tests.helpers.console_http import ADMIN, CONSUMER, console_server
from tests.helpers.png import near, pixels
from tests.processes import ROOT, missing, wait_for

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
#: The first two series' strokes (console.js COLORS).
BLUE, RED = (0x1F, 0x77, 0xB4), (0xD6, 0x27, 0x28)
#: Pixels of a series' colour that make a line: a lone point and its legend swatch make about 100.
LINE = 150
#: Sampling is every 5 s: a chart moves within a few samples.
CHART_WAIT = 30

# One server and one browser for the module, its tests a story in order (logged in by the
# first): under pytest-xdist they run on one worker, one after another.
pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("console-browser")]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("console-browser")


@pytest.fixture(scope="module")
def served(workdir):
    server, url, admin = console_server(workdir)
    yield server, url, admin
    admin.close()
    server.terminate()


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        missing("chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000", "--disable-extensions", "--no-first-run"):  # fmt: skip
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def shot(driver, workdir: Path, name: str, element=None) -> bytes:
    """Save a screenshot (the page's, or one element's), check its size, and return the PNG."""
    png = element.screenshot_as_png if element is not None else driver.get_screenshot_as_png()
    path = workdir / f"{name}.png"
    path.write_bytes(png)
    if os.environ.get("HQUEUE_CONSOLE_SCREENSHOTS") == "1":
        artifacts = ROOT / "tests" / "artifacts" / "console"
        artifacts.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, artifacts / path.name)
    width, height, _ = pixels(png)
    assert width >= 300 and height >= 150, (name, width, height)
    return png


def drawn(png: bytes, color: tuple[int, int, int] = BLUE) -> int:
    """Pixels of a series' colour in a chart's screenshot."""
    return sum(1 for p in pixels(png)[2] if near(p, color))


def log_in(driver, url: str, token: str) -> None:
    driver.delete_all_cookies()
    driver.get(url + "/login")
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login button").click()
    wait_for(lambda: "/login" not in driver.current_url, 10, "the log-in to go through")


def chart_values(driver, chart: str) -> list[float]:
    data = driver.execute_script(f"return (window.hqueueCharts['{chart}'] || {{}}).data || null")
    return [v for series in (data or [[]])[1:] for v in series if v is not None]


def no_alert(driver) -> bool:
    try:
        _ = driver.switch_to.alert
    except NoAlertPresentException:
        return True
    return False


def test_log_in_and_see_the_overview(served, browser, workdir):
    _, url, _ = served
    browser.get(url + "/queues")
    assert "/login" in browser.current_url  # no session: the log-in page
    log_in(browser, url, ADMIN)
    browser.get(url + "/")
    assert browser.find_element(By.ID, "queue-count").text == "1"
    assert "ops" in browser.find_element(By.CSS_SELECTOR, "header .who").text
    shot(browser, workdir, "overview")


def test_a_queues_rate_chart_moves_after_puts(served, browser, workdir):
    _, url, admin = served
    browser.get(url + "/queues/orders")
    with admin.queue("orders") as orders:
        # When messages are put for a few samples
        def moved() -> bool:
            orders.put([Message("paid", b"order")] * 200, 0)
            values = chart_values(browser, "chart-queue-put")
            return len(values) >= 2 and any(v > 0 for v in values)

        wait_for(moved, CHART_WAIT, "the put-rate chart to move", interval=1)
    # Then the chart's data and its drawing show the rate
    figure = browser.find_element(By.ID, "chart-queue-put")
    wait_for(lambda: drawn(figure.screenshot_as_png) > LINE, 10, "the rate line to be drawn", interval=0.5)
    png = shot(browser, workdir, "queue-rate-chart", figure)
    assert drawn(png) > LINE
    shot(browser, workdir, "queue")


def test_a_groups_lag_falls_after_acks(served, browser, workdir):
    _, url, admin = served
    with admin.queue("orders") as orders:
        orders.put([Message("invoice", b"invoice %d" % i) for i in range(30)], 1)
        with orders.consumer("billing", ["invoice"]) as billing:
            browser.get(url + "/queues/orders/groups/billing")
            assert int(browser.find_element(By.ID, "lag-total").text) == 30
            wait_for(lambda: 30 in chart_values(browser, "chart-lag"), CHART_WAIT, "the lag chart to show 30")
            # When the group acks everything
            acked = 0
            while acked < 30:
                deliveries = billing.receive(30, wait=2)
                acked += billing.ack(deliveries)
    # Then the page's live refresh shows no lag, and the chart falls to 0
    wait_for(lambda: browser.find_element(By.ID, "lag-total").text == "0", CHART_WAIT, "the lag to fall", interval=1)
    wait_for(lambda: chart_values(browser, "chart-lag")[-1:] == [0], CHART_WAIT, "the lag chart to reach 0")
    assert max(chart_values(browser, "chart-lag")) == 30
    # Partition 1's series, from 30 down to 0 (looked at until drawn: a CI run's one look found
    # 115 of its pixels, where every other run had more than LINE; each 5 s sample at 0 adds some)
    wait_for(lambda: drawn(shot(browser, workdir, "group-lag-chart", browser.find_element(By.ID, "chart-lag")), RED)
             > LINE, CHART_WAIT, "the lag chart's line")  # fmt: skip
    shot(browser, workdir, "group")


def test_browsing_messages_shows_hostile_values_as_text(served, browser, workdir):
    _, url, admin = served
    with admin.queue("orders") as orders:
        orders.put(Message("<b>topic</b>", b"<script>alert(1)</script><img src=x onerror=alert(2)>"), 1)
    browser.get(url + "/messages?queue=orders&partition=1&topic=%3Cb%3Etopic%3C%2Fb%3E")
    cells = browser.find_elements(By.CSS_SELECTOR, "#messages td.value")
    assert [c.text for c in cells] == ["<script>alert(1)</script><img src=x onerror=alert(2)>"]
    assert no_alert(browser) and not browser.find_elements(By.CSS_SELECTOR, "#messages img, #messages b")
    browser.get(url + "/messages?queue=orders&partition=0&format=hex")
    assert "6f 72 64 65 72" in browser.find_element(By.ID, "messages").text  # "order"
    assert browser.find_element(By.ID, "next-page")  # 200+ messages: paged
    shot(browser, workdir, "messages")


def test_replaying_the_dead_letters_dry_run_then_for_real(served, browser, workdir):
    _, url, admin = served
    with admin.queue("orders") as orders:
        orders.put(Message("refund", b"refund 1"), 0)
        with orders.consumer("refunds", ["refund"], max_retries=0) as refunds:
            refunds.dead_letter(refunds.receive(1, wait=5))
    browser.get(url + "/queues/orders/dlq")
    browser.find_element(By.CSS_SELECTOR, "#replay button").click()
    (count,) = wait_for(lambda: browser.find_elements(By.ID, "dry-count"), 10, "the dry run's page")
    assert count.text == "1"
    dry_run = browser.find_element(By.ID, "dry-run").text
    assert "refund 1" in dry_run and "group refunds" in dry_run
    shot(browser, workdir, "dlq-dry-run")
    browser.find_element(By.CSS_SELECTOR, "#confirm-replay button").click()
    wait_for(lambda: browser.find_elements(By.ID, "dead-letters"), 10, "the replay to be started")

    def audited() -> bool:
        browser.get(url + "/audit")
        return "done: 1 replayed" in browser.find_element(By.ID, "audit").text

    wait_for(audited, 20, "the replay to finish", interval=0.5)
    assert "ops" in browser.find_element(By.ID, "audit").text
    shot(browser, workdir, "audit")
    with admin.queue("orders") as orders:
        assert sum(1 for m in orders.scan(topics=["refund"])) == 2


def test_refused_without_a_token_and_for_a_consumer_on_admin_actions(served, browser, workdir):
    _, url, _ = served
    browser.delete_all_cookies()
    browser.get(url + "/queues/orders/groups/billing")
    assert "/login" in browser.current_url
    log_in(browser, url, CONSUMER)
    browser.get(url + "/queues/orders/groups/billing")
    assert not browser.find_elements(By.ID, "reset")  # no admin form for a consumer
    status = browser.execute_async_script(
        """const done = arguments[arguments.length - 1];
        const csrf = document.querySelector('input[name=csrf]').value;
        fetch('/queues/orders/groups/billing/reset', {method: 'POST', credentials: 'same-origin',
              body: new URLSearchParams({csrf: csrf, time: '0', confirm: 'yes'})}).then(r => done(r.status));"""
    )
    assert status == 403
    browser.get(url + "/queues/orders/dlq")
    assert not browser.find_elements(By.ID, "replay")
    shot(browser, workdir, "consumer-view")
