"""The unit tests' shared helpers, one of each. They live in modules of this folder, put on
sys.path here (the suite runs in importlib mode with the repository root off sys.path):

* ports.py: `free_port`, for the tests that must name a port before they listen;
* protocol.py: `raw_frame` (an AMQP frame by hand), `connected` (a connection machine past its
  handshake) and `feed` (bytes in, events out), all without sockets;
* loop_thread.py: `LoopThread`, an event loop on a thread that blocking clients talk to;
* brokers.py: `ThreadBroker`, Warren in this process on a LoopThread; `WarrenProcess`, `warren
  serve` as a subprocess; `connect`, a pika connection to either;
* doubles.py: `HeldExecutor`, a worker thread that runs its jobs only when told to;
* http_api.py: `HttpApi`, a management API client (compat_tests' own, shared);
* browser.py: `chromium`, a headless Debian chromium under selenium, and `screenshot`.

The fixtures below start brokers and stop them after the test, whatever it left running.
"""

import sys
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))

# Hypothesis fails an example that runs past a deadline (200 ms by default): a speed race on a
# busy machine. A test that hangs is pytest-timeout's to stop.
settings.register_profile("no-deadline", deadline=None)
settings.load_profile("no-deadline")


@pytest.fixture
def start_broker():
    """start_broker(data_dir, **settings): a started ThreadBroker, stopped after the test."""
    # Imported here, not at the top: tests of amqp/, log/ or cluster/ need nothing of server/.
    from brokers import ThreadBroker

    started = []

    def start(data_dir, **settings):
        running = ThreadBroker(data_dir, **settings).start()
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory):
    """A ThreadBroker on default settings that a module's tests share, stopped after them."""
    from brokers import ThreadBroker

    running = ThreadBroker(tmp_path_factory.mktemp("broker")).start()
    yield running
    running.stop()


@pytest.fixture
def topic_client(module_broker):
    """The Spark data source's HTTP client (spark/client.py) to `module_broker`, as guest."""
    from warrenmq.spark.client import Client, nodes_of

    return Client(nodes_of(module_broker.management_url, None, None))


@pytest.fixture
def warren_process(tmp_path):
    """A WarrenProcess on a fresh data dir, not started yet; killed after the test."""
    from brokers import WarrenProcess

    process = WarrenProcess(tmp_path / "data")
    yield process
    process.kill()


def pytest_terminal_summary(terminalreporter):
    """The fault tests' results table (fault_scenarios.py), and where the screenshots of the
    browser tests went (browser.py), if any ran."""
    scenarios = sys.modules.get("fault_scenarios")
    if scenarios is not None and scenarios.RESULTS:
        terminalreporter.write_sep("-", "fault tests")
        for line in scenarios.results_table(scenarios.RESULTS):
            terminalreporter.write_line(line)
    browser = sys.modules.get("browser")
    if browser is not None and browser.saved:
        terminalreporter.write_sep("-", "browser screenshots")
        for path in browser.saved:
            terminalreporter.write_line(str(path))
