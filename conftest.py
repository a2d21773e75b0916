"""Suite-wide guards: soak, Docker and long fault tests run only when asked for, and a run in
which no test passed is a failure, never a green run."""

import pytest

OPT_IN = {
    "soak": "soak test: run with `make soak` (pytest -m soak) or --soak",
    "docker": "needs a Docker engine and minutes: run with `make test-docker` (pytest -m docker)"
    " or --docker",
    "faults": "minutes of faults per scenario: run with `make test-faults` (pytest -m faults)"
    " or --faults",
}
"""Markers whose tests run only when asked for, and why the others skip them."""


def pytest_addoption(parser):
    parser.addoption("--soak", action="store_true", help="also run the soak tests (`make soak`)")
    parser.addoption(
        "--docker", action="store_true", help="also run the Docker tests (`make test-docker`)"
    )
    parser.addoption(
        "--faults", action="store_true", help="also run the long fault tests (`make test-faults`)"
    )


def pytest_collection_modifyitems(config, items):
    """Skip the soak, Docker and long fault tests unless the run asks for them with --soak
    (--docker, --faults) or a -m naming "soak" ("docker", "faults").

    Not `addopts = -m "not soak"`: a later -m (`make test-fast`'s -m "not slow") replaces
    that expression instead of adding to it, and the soak tests would run.
    """
    markexpr = config.getoption("markexpr", "")
    for marker, reason in OPT_IN.items():
        if config.getoption(marker) or marker in markexpr:
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if item.get_closest_marker(marker) is not None:
                item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or exitstatus != 0:
        return
    if not reporter.stats.get("passed"):
        session.exitstatus = 5
