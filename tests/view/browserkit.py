"""A real headless Chromium (Debian's chromium + chromium-driver, driven by selenium) and `t1 view` as its own
process, shared by the browser tests."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def start_viewer(run_dir: Path, *extra: str) -> Iterator[str]:
    """`t1 view RUN_DIR --port 0` as a process; yields its base URL, then stops it."""
    proc = subprocess.Popen([sys.executable, "-m", "t1.cli.main", "view", str(run_dir), "--port", "0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:\d+/", line)
    assert match, f"t1 view did not say where it serves: {line!r}"
    try:
        yield match.group(0).rstrip("/")
    finally:
        proc.terminate()
        proc.wait(10)


def headless_chromium() -> Iterator[WebDriver]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            pytest.fail(f"{path} is missing: scripts/setup.sh installs Debian's chromium and chromium-driver")
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--disable-extensions"):
        opts.add_argument(arg)
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def load(driver: WebDriver, url: str) -> None:
    """Open a page; fail on any console error it logged (script errors, failed loads, CSP refusals)."""
    driver.get_log("browser")  # drop what earlier pages left
    driver.get(url)
    driver.execute_async_script("const done = arguments[arguments.length - 1];"
                                "(window.t1Ready || Promise.resolve()).then(() => done(true));")
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, f"{url}: console errors {errors}"
