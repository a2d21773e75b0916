"""Debian's chromium, headless, driven by selenium through Debian's chromium-driver (never a
browser or driver downloaded at test time), and the screenshots tests keep as artefacts.

`make test` installs both packages when it runs as root (as it installs RabbitMQ); elsewhere a
test that needs them is skipped with the reason, except under CI=true, where it fails.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parent.parent
ARTEFACTS_DIR = Path(os.environ.get("WARREN_TEST_ARTEFACTS", ROOT / "test-artefacts"))
CHROMIUM_PATHS = ("/usr/bin/chromium",)
CHROMEDRIVER_PATHS = ("/usr/bin/chromedriver",)
WINDOW = "1400,1000"
WAIT_S_MAX = 30.0

saved: list[Path] = []
"""Screenshots saved by this run, listed at the end of the run (conftest.py)."""


def _find(command: str, paths: tuple[str, ...]) -> str | None:
    return shutil.which(command) or next((p for p in paths if Path(p).exists()), None)


def chromium(profile_dir: Path) -> WebDriver:
    """A headless chromium with a fresh profile in `profile_dir`."""
    binary = _find("chromium", CHROMIUM_PATHS)
    driver = _find("chromedriver", CHROMEDRIVER_PATHS)
    if binary is None or driver is None:
        reason = (
            "chromium and chromium-driver (apt-get install chromium chromium-driver;"
            " `make test` installs them as root)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true needs " + reason)
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in (
        "--headless=new",
        "--no-sandbox",  # tests run as root in CI containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={WINDOW}",
        f"--user-data-dir={profile_dir}",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(driver), options=options)


# A page that refreshes replaces its elements: one found a moment ago may be gone.
REPLACED = (NoSuchElementException, StaleElementReferenceException)


def wait(driver: WebDriver, condition, message: str, timeout_s: float = WAIT_S_MAX):
    """`condition(driver)` until it is truthy (its value), or fail with `message`; an element
    replaced while the condition read it is read again."""
    return WebDriverWait(driver, timeout_s, poll_frequency=0.2, ignored_exceptions=REPLACED).until(
        condition, message
    )


def click(driver: WebDriver, by: str, value: str, message: str) -> None:
    """Click the element found by (`by`, `value`), found again if a refresh replaced it."""

    def clicked(d) -> bool:
        d.find_element(by, value).click()
        return True

    wait(driver, clicked, message)


def screenshot(driver: WebDriver, name: str) -> Path:
    ARTEFACTS_DIR.mkdir(parents=True, exist_ok=True)
    path = ARTEFACTS_DIR / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"chromium saved no screenshot to {path}"
    saved.append(path)
    return path
