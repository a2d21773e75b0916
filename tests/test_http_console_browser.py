"""The web console in a real browser (Debian's headless chromium under selenium) against a real
`warren serve`: AMQP clients publish, dead-letter and connect with pika, and the page, logged
in through its form, must SHOW that data — queue names and depths, rates on the chart, the
dead letter's decoded x-death, the connection — and close the connection as a user would. The
broker is then SIGKILLed and started again: the page shows the same durable data.
Screenshots go to test-artefacts/ (listed at the end of the run)."""

from __future__ import annotations

import signal

import pika
import pika.exceptions
import pytest
from brokers import WarrenProcess
from browser import chromium, click, screenshot, wait
from http_api import HttpApi, path
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

pytestmark = pytest.mark.slow

VHOST = "/"
ORDERS = "console-orders"
WORK = "console-work"
DEAD = "console-dead"
RATES = "console-rates"
CLIENT_NAME = "console-client"
CLOSE_REASON = "closed from the console test"


@pytest.fixture
def broker(warren_process):
    return warren_process.start()


@pytest.fixture
def driver(tmp_path):
    browser = chromium(tmp_path / "chromium-profile")
    yield browser
    browser.quit()


def put_amqp_data(broker: WarrenProcess) -> None:
    """Three persistent orders, and a job rejected into its dead-letter queue."""
    connection = broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(ORDERS, durable=True)
    channel.queue_declare(DEAD, durable=True)
    channel.queue_declare(
        WORK,
        durable=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": DEAD},
    )
    persistent = pika.BasicProperties(delivery_mode=2)
    for number in range(3):
        channel.basic_publish("", ORDERS, f"order {number}".encode(), persistent)
    channel.basic_publish("", WORK, b"a job that fails", persistent)
    method, _, _ = channel.basic_get(WORK)
    channel.basic_reject(method.delivery_tag, requeue=False)
    connection.close()


def text(driver, css: str) -> str:
    """The rendered text of the first element `css` finds ("" if none), read in one step: the
    page replaces its elements as it refreshes."""
    return driver.execute_script(
        "const found = document.querySelector(arguments[0]);"
        "return found ? found.innerText.trim() : ''",
        css,
    )


def row_cells(driver, key: str) -> list[str] | None:
    """The cells' texts of the table row whose data-key is `key` (None while it is missing)."""
    return driver.execute_script(
        "const row = [...document.querySelectorAll('tr[data-key]')]"
        ".find((candidate) => candidate.dataset.key === arguments[0]);"
        "return row ? [...row.cells].map((cell) => cell.innerText.trim()) : null",
        key,
    )


def log_in(driver, url: str, user: str, password: str) -> None:
    driver.get(url + "/")
    wait(driver, lambda d: d.find_element(By.ID, "login").is_displayed(), "no login form")
    form = driver.find_element(By.ID, "login")
    for name, value in (("username", user), ("password", password)):
        field = form.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def login_error(driver) -> str:
    return wait(driver, lambda d: text(d, "#login-error"), "the login error is not shown")


def go(driver, *segments: str) -> None:
    driver.execute_script("location.hash = arguments[0]", path(*segments).replace("/", "#/", 1))


def test_the_console_shows_what_amqp_clients_did(broker, driver):
    api = HttpApi(broker.management_url)
    assert api.put(path("api", "users", "no-tags"), {"password": "pw", "tags": ""}).status == 201
    put_amqp_data(broker)
    url = broker.management_url

    # A wrong password, and a user without a management tag, are refused as RabbitMQ's UI is.
    log_in(driver, url, "guest", "wrong")
    assert login_error(driver) == "Login failed"
    log_in(driver, url, "no-tags", "pw")
    assert login_error(driver) == "Not management user"
    log_in(driver, url, "guest", "guest")
    wait(driver, lambda d: "guest (administrator)" in text(d, "#user"), "not logged in")
    Select(driver.find_element(By.ID, "refresh")).select_by_value("2")

    # Overview: totals, queued messages, and the publish rate of a client still publishing.
    client = broker.connect(client_properties={"connection_name": CLIENT_NAME})
    channel = client.channel()
    channel.queue_declare(RATES)

    def publishing_shows_a_rate(d) -> bool:
        for _ in range(50):
            channel.basic_publish("", RATES, b"rate")
        client.process_data_events(0)
        published = text(d, 'figure[data-chart="Message rates"] li[data-series="publish"] .value')
        return published not in ("", "—", "0/s")

    wait(driver, publishing_shows_a_rate, "the chart shows no publish rate")
    points = driver.find_element(
        By.CSS_SELECTOR, 'figure[data-chart="Message rates"] polyline[data-series="publish"]'
    ).get_attribute("points")
    assert len(points.split()) >= 2, "the rate chart has no line"
    wait(driver, lambda d: text(d, '[data-total="queues"] .count') == "4", "4 queues not shown")
    wait(driver, lambda d: text(d, '[data-total="connections"] .count') == "1", "no connection")
    assert text(driver, "[data-alarms]") == "No alarms"
    screenshot(driver, "console-overview")

    # Queues: each with its depth; the filter narrows the page to one.
    driver.find_element(By.CSS_SELECTOR, 'nav a[data-view="queues"]').click()
    orders = wait(driver, lambda d: row_cells(d, f"{VHOST}/{ORDERS}"), "orders not listed")
    assert orders[:8] == [VHOST, ORDERS, "classic", "running", "3", "0", "3", "0"]
    assert wait(driver, lambda d: row_cells(d, f"{VHOST}/{DEAD}"), "no dead")[4] == "1"
    driver.find_element(By.CSS_SELECTOR, "input[type=search]").send_keys(ORDERS)
    wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr[data-key]")) == 1, "filter")
    screenshot(driver, "console-queues")

    # A queue's details.
    click(driver, By.LINK_TEXT, ORDERS, "no link to the queue")
    wait(driver, lambda d: ORDERS in text(d, "#view h1"), "the queue's page did not open")
    facts = wait(driver, lambda d: text(d, "dl.facts"), "no details")
    assert "Ready\n3" in facts and "Durable\nyes" in facts

    # The dead letter, its x-death decoded.
    go(driver, "queues", VHOST, DEAD)
    wait(driver, lambda d: DEAD in text(d, "#view h1"), "the dead-letter queue's page did not open")
    click(driver, By.PARTIAL_LINK_TEXT, "dead letters", "no link to the messages")
    dead = wait(driver, lambda d: row_cells(d, "0"), "the dead letter is not shown")
    assert dead[1:5] == ["ready", "rejected", WORK, "1"]
    assert dead[7] == "a job that fails"
    click(driver, By.CSS_SELECTOR, 'tr[data-key="0"] button', "no button to open the message")
    death = wait(driver, lambda d: text(d, 'tr[data-details="0"] tbody tr'), "no x-death details")
    assert death.split("\t")[:5] == ["rejected", WORK, "(default exchange)", WORK, "1"]
    screenshot(driver, "console-dead-letters")

    # Connections: the client is there, and closed from the page with a reason.
    driver.find_element(By.CSS_SELECTOR, 'nav a[data-view="connections"]').click()
    row = wait(
        driver,
        lambda d: next(
            (
                r.text
                for r in d.find_elements(By.CSS_SELECTOR, "tr[data-key]")
                if CLIENT_NAME in r.text
            ),
            None,
        ),
        "the client's connection is not listed",
    )
    assert "guest" in row
    click(driver, By.XPATH, "//tr[@data-key]//button[text()='Close…']", "no close button")
    reason = wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "tr.form input"), "no form")
    reason.clear()
    reason.send_keys(CLOSE_REASON)
    screenshot(driver, "console-connections")
    click(driver, By.CSS_SELECTOR, "tr.form button.danger", "no force-close button")
    wait(driver, lambda d: "Closed " in text(d, "[role=status]"), "no confirmation")
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        for _ in range(100):
            client.process_data_events(0.1)
    assert closed.value.args[:2] == (320, f"CONNECTION_FORCED - {CLOSE_REASON}")
    wait(driver, lambda d: "No connections." in text(d, "table"), "the connection is still listed")

    # A SIGKILL and a restart (new ports): the page, logged in again, shows the same data.
    broker.stop(signal.SIGKILL)
    broker.start()
    log_in(driver, broker.management_url, "guest", "guest")
    wait(driver, lambda d: "guest (administrator)" in text(d, "#user"), "not logged in again")
    go(driver, "queues")
    orders = wait(driver, lambda d: row_cells(d, f"{VHOST}/{ORDERS}"), "orders lost")
    assert orders[4] == "3"
    go(driver, "dlq", VHOST, DEAD)
    dead = wait(driver, lambda d: row_cells(d, "0"), "the dead letter is lost")
    assert dead[2:4] == ["rejected", WORK]
    screenshot(driver, "console-after-sigkill")


SOURCE = "console-jobs"
EXPIRING = "console-expiring"
DLQ = "console-jobs-dlq"
REJECTED = 30
REDRIVE_RATE = 5


def fill_dead_letter_queue(broker: WarrenProcess) -> None:
    """REJECTED jobs rejected into the DLQ, and one that expired there from another queue."""
    connection = broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    to_dlq = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": DLQ}
    channel.queue_declare(DLQ, durable=True)
    channel.queue_declare(SOURCE, durable=True, arguments=to_dlq)
    channel.queue_declare(EXPIRING, durable=True, arguments={**to_dlq, "x-message-ttl": 0})
    persistent = pika.BasicProperties(delivery_mode=2)
    for number in range(REJECTED):
        channel.basic_publish("", SOURCE, f"job {number}".encode(), persistent)
    for _ in range(REJECTED):
        method, _, _ = channel.basic_get(SOURCE)
        channel.basic_reject(method.delivery_tag, requeue=False)
    channel.basic_publish("", EXPIRING, b"too late", persistent)
    connection.close()


def depth(broker: WarrenProcess, queue: str) -> int:
    connection = broker.connect()
    try:
        return connection.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        connection.close()


def test_the_console_lists_dead_letters_and_redrives_them_while_you_watch(broker, driver):
    fill_dead_letter_queue(broker)
    url = broker.management_url
    log_in(driver, url, "guest", "guest")
    wait(driver, lambda d: "guest (administrator)" in text(d, "#user"), "not logged in")
    Select(driver.find_element(By.ID, "refresh")).select_by_value("2")

    # The queues dead letters reach, with why and where from their messages died.
    driver.find_element(By.CSS_SELECTOR, 'nav a[data-view="dlq"]').click()
    expected = [
        VHOST,
        DLQ,
        str(REJECTED + 1),
        f"rejected {REJECTED}, expired 1",
        f"{SOURCE} {REJECTED}, {EXPIRING} 1",
    ]
    wait(
        driver,
        lambda d: (row_cells(d, f"{VHOST}/{DLQ}") or [])[:5] == expected,
        f"the DLQ is not listed as {expected}",
    )
    screenshot(driver, "console-dlq-list")

    # A redrive of the rejected ones only, back where they died, at a rate slow enough to watch.
    click(driver, By.PARTIAL_LINK_TEXT, "Redrive", "no link to redrive")
    form = wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "form.redrive"), "no form")
    wait(driver, lambda d: SOURCE in text(d, "select[name=source]"), "no source choices")
    Select(form.find_element(By.NAME, "reason")).select_by_value("rejected")
    form.find_element(By.NAME, "rate").send_keys(str(REDRIVE_RATE))
    screenshot(driver, "console-redrive-form")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(driver, lambda d: "#/redrives/" in d.current_url, "the task's page did not open")
    state = "[data-state]"
    wait(driver, lambda d: text(d, state) == "running", "the task is not shown running")
    screenshot(driver, "console-redrive-running")

    # Cancelled part way, then resumed to the end: the page follows each state.
    click(driver, By.CSS_SELECTOR, "button.danger", "no cancel button")
    wait(driver, lambda d: text(d, state) == "cancelled", "the cancel is not shown")
    moved_when_cancelled = depth(broker, SOURCE)
    assert 0 < moved_when_cancelled < REJECTED
    click(driver, By.XPATH, "//button[text()='Resume']", "no resume button")
    wait(driver, lambda d: text(d, state) == "done", "the task never shows done", 60)
    bar = wait(
        driver,
        lambda d: d.execute_script(
            "const bar = document.querySelector('.progress progress');"
            "return [bar.value, bar.max, bar.parentElement.textContent]"
        ),
        "no progress bar",
    )
    assert bar[0] == bar[1] == REJECTED + 1
    assert f"moved {REJECTED}" in bar[2]
    screenshot(driver, "console-redrive-done")
    assert depth(broker, SOURCE) == REJECTED
    assert depth(broker, DLQ) == 1

    # The list shows what is left, and the task with its outcome.
    driver.find_element(By.CSS_SELECTOR, 'nav a[data-view="dlq"]').click()
    wait(
        driver,
        lambda d: (row_cells(d, f"{VHOST}/{DLQ}") or [])[2:4] == ["1", "expired 1"],
        "the DLQ's counts did not follow the redrive",
    )
    wait(
        driver,
        lambda d: (
            "done" in [c.text for c in d.find_elements(By.CSS_SELECTOR, "tr td:nth-child(4)")]
        ),
        "the task is not listed as done",
    )


def test_a_management_user_sees_only_the_vhosts_it_may_use(broker, driver):
    api = HttpApi(broker.management_url)
    assert api.put(path("api", "vhosts", "team")).status == 201
    assert (
        api.put(path("api", "users", "viewer"), {"password": "pw", "tags": "management"}).status
        == 201
    )
    granted = {"configure": ".*", "write": ".*", "read": ".*"}
    assert api.put(path("api", "permissions", "team", "viewer"), granted).status == 201
    assert api.put(path("api", "queues", "team", "team-queue"), {"durable": True}).status == 201
    assert api.put(path("api", "queues", VHOST, ORDERS), {"durable": True}).status == 201

    log_in(driver, broker.management_url, "viewer", "pw")
    wait(driver, lambda d: "viewer (management)" in text(d, "#user"), "not logged in")
    wait(driver, lambda d: text(d, '[data-total="queues"] .count') == "1", "not one queue")
    assert "Node" not in text(driver, "#view"), "a management user sees the node"
    go(driver, "queues")
    wait(driver, lambda d: row_cells(d, "team/team-queue"), "the user's queue is not listed")
    assert row_cells(driver, f"{VHOST}/{ORDERS}") is None


def test_an_address_that_is_not_percent_encoded_utf8_shows_the_overview(broker, driver):
    log_in(driver, broker.management_url, "guest", "guest")
    wait(driver, lambda d: "guest (administrator)" in text(d, "#user"), "not logged in")
    go(driver, "queues")
    wait(driver, lambda d: text(d, "#view h1") == "Queues", "no queues")
    driver.execute_script("location.hash = '#/queues/%E0%A4'")
    wait(driver, lambda d: text(d, "#view h1") == "Overview", "no overview for a bad address")


PAYMENTS = "console-payments"
SETTLERS = "console-settlers"
SETTLER = "console-settler"
# Messages published to each partition of PAYMENTS; the group acks only each one's first.
PER_PARTITION = (4, 5, 6)


def put_super_stream_and_group(broker: WarrenProcess):
    """A super stream with a message count of its own on each partition, and a consumer group
    member that acks the first message of each partition and holds the rest: the group's
    committed offset is 1 everywhere, its lag the rest. The member's connection is returned
    open (closing it would keep the lag but drop the member)."""
    connection = broker.connect()
    channel = connection.channel()
    channel.exchange_declare(
        PAYMENTS,
        "x-super-stream",
        durable=True,
        arguments={"x-super-stream-partitions": len(PER_PARTITION)},
    )
    channel.confirm_delivery()
    for partition, messages in enumerate(PER_PARTITION):
        pinned = pika.BasicProperties(headers={"x-stream-partition": partition})
        for _ in range(messages):
            channel.basic_publish(PAYMENTS, "any", b"payment", pinned)

    def ack_the_first(member, method, properties, body) -> None:
        if properties.headers["x-stream-offset"] == 0:
            member.basic_ack(method.delivery_tag)

    member = connection.channel()
    member.basic_qos(prefetch_count=100)
    member.basic_consume(
        PAYMENTS,
        ack_the_first,
        consumer_tag=SETTLER,
        arguments={"x-consumer-group": SETTLERS, "x-stream-offset": "first"},
    )
    connection.process_data_events(time_limit=0.5)
    return connection


def test_the_streams_and_groups_views_show_partitions_and_lag(broker, driver):
    connection = put_super_stream_and_group(broker)
    partitions = [f"{PAYMENTS}-{index}" for index in range(len(PER_PARTITION))]
    log_in(driver, broker.management_url, "guest", "guest")
    wait(driver, lambda d: "guest (administrator)" in text(d, "#user"), "not logged in")
    Select(driver.find_element(By.ID, "refresh")).select_by_value("2")

    # Streams: the super stream with its partitions and their sum, each partition's offsets.
    driver.find_element(By.CSS_SELECTOR, 'nav a[data-view="streams"]').click()
    row = wait(driver, lambda d: row_cells(d, f"super/{VHOST}/{PAYMENTS}"), "no super stream")
    assert row[:4] == [VHOST, PAYMENTS, ", ".join(partitions), str(sum(PER_PARTITION))]
    for name, messages in zip(partitions, PER_PARTITION, strict=True):
        cells = wait(driver, lambda d, name=name: row_cells(d, f"{VHOST}/{name}"), f"no {name}")
        # Messages, segments, first and last offset, consumers (the group's member).
        assert [cells[2], *cells[4:8]] == [str(messages), "1", "0", str(messages - 1), "1"]
    assert driver.find_elements(By.CSS_SELECTOR, 'figure[data-chart="Published to streams"] svg')
    screenshot(driver, "console-streams")

    # A partition's page: its retention, and the group's tracked offset with its lag.
    click(driver, By.LINK_TEXT, partitions[2], "no link to the partition")
    wait(driver, lambda d: partitions[2] in text(d, "#view h1"), "the stream's page did not open")
    facts = wait(driver, lambda d: text(d, "dl.facts"), "no details")
    assert "Last offset\n5" in facts and "Max age\nnone" in facts
    tracked = wait(driver, lambda d: row_cells(d, f"group:{SETTLERS}"), "no tracked offset")
    assert tracked == [f"group:{SETTLERS}", "1", str(PER_PARTITION[2] - 1)]
    screenshot(driver, "console-stream")

    # Consumer groups: the member, who owns which partition, committed offsets, lag.
    driver.find_element(By.CSS_SELECTOR, 'nav a[data-view="groups"]').click()
    group = f"{VHOST}/{PAYMENTS}/{SETTLERS}"
    for name, messages in zip(partitions, PER_PARTITION, strict=True):
        cells = wait(driver, lambda d, name=name: row_cells(d, f"{group}/{name}"), f"no {name}")
        assert cells == [name, SETTLER, "1", str(messages - 1)]
    assert text(driver, f'section[data-group="{group}"] [data-members]') == SETTLER
    lagging = driver.find_elements(By.CSS_SELECTOR, f'section[data-group="{group}"] td .lagging')
    assert len(lagging) == len(PER_PARTITION), "the lag is not highlighted"
    screenshot(driver, "console-groups")
    connection.close()


# More streams than the console's page of 100 holds: the first page, then the second.
PAGED = [f"console-paged-{index:03}" for index in range(101)]
# Sorts after PAGED: the second page holds it.
LONE = "console-single"


def stream_keys(driver) -> list[str]:
    """The data-keys of the streams table's rows (the super streams' are "super/..."), in
    order."""
    return driver.execute_script(
        "return [...document.querySelectorAll('tr[data-key]')]"
        ".map((row) => row.dataset.key).filter((key) => !key.startsWith('super/'))"
    )


def pager(driver) -> str:
    """The pager's text on one line (its buttons and counts are laid out apart)."""
    return " ".join(text(driver, ".pager").split())


def test_the_streams_view_filters_by_name_and_pages(broker, driver):
    api = HttpApi(broker.management_url)
    stream = {"durable": True, "arguments": {"x-queue-type": "stream"}}
    for name in (*PAGED, LONE):
        assert api.put(path("api", "queues", VHOST, name), stream).status == 201
    log_in(driver, broker.management_url, "guest", "guest")
    wait(driver, lambda d: "guest (administrator)" in text(d, "#user"), "not logged in")
    Select(driver.find_element(By.ID, "refresh")).select_by_value("2")
    go(driver, "streams")
    first_page = [f"{VHOST}/{name}" for name in PAGED[:100]]
    wait(driver, lambda d: stream_keys(d) == first_page, "not the first 100 streams")
    assert pager(driver) == "Previous Page 1 of 2 · 102 of 102 streams Next"

    click(driver, By.XPATH, "//p[@class='pager']/button[text()='Next']", "no next page")
    second_page = [f"{VHOST}/{PAGED[100]}", f"{VHOST}/{LONE}"]
    wait(driver, lambda d: stream_keys(d) == second_page, "the pager did not move")
    assert pager(driver) == "Previous Page 2 of 2 · 102 of 102 streams Next"
    screenshot(driver, "console-streams-second-page")

    # The filter narrows the list to its matches, from the first page.
    driver.find_element(By.CSS_SELECTOR, "input[type=search]").send_keys("SINGLE")
    wait(driver, lambda d: stream_keys(d) == [f"{VHOST}/{LONE}"], "the filter did not narrow")
    assert pager(driver) == "Previous Page 1 of 1 · 1 of 102 streams Next"
    driver.find_element(By.CSS_SELECTOR, "input[type=search]").send_keys("-none")
    wait(driver, lambda d: "No streams." in text(d, "#view"), "a filter with no match")

    # Streams deleted under the second page, so many that the API refuses the page (not
    # one that is merely empty): the view falls back to a page that exists. The slowest
    # refresh keeps the page from reading the list between the deletions.
    go(driver, "overview")
    go(driver, "streams")
    Select(driver.find_element(By.ID, "refresh")).select_by_value("30")
    click(driver, By.XPATH, "//p[@class='pager']/button[text()='Next']", "no next page")
    wait(driver, lambda d: stream_keys(d) == second_page, "the pager did not move")
    for name in PAGED[:3]:
        assert api.delete(path("api", "queues", VHOST, name)).status == 204
    assert api.get(path("api", "streams") + "?page=2").json["error"] == "page_out_of_range"
    Select(driver.find_element(By.ID, "refresh")).select_by_value("2")
    remaining = [f"{VHOST}/{name}" for name in (*PAGED[3:], LONE)]
    wait(driver, lambda d: stream_keys(d) == remaining, "no page after the deletions")
    assert pager(driver) == "Previous Page 1 of 1 · 99 of 99 streams Next"
    assert text(driver, "#error") == ""
