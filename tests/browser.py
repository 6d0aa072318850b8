"""Headless Chromium for the browser tests: Debian's chromium and chromium-driver, driven by
Selenium.

Nothing is downloaded at run time. Where Chromium is missing the tests are skipped with the
command that installs it (``.ci/run`` runs it before ``make test``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

INSTALL = "apt-get update && apt-get install -y chromium chromium-driver"
ROLES = ("{glue", "{cite", "{doc}", "{ref}")


def chromium(width: int = 1280, height: int = 1000):
    """A headless Chromium session that records console messages and network requests."""
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium is not installed: pip install selenium"
    )
    binary = next(
        (shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None
    )
    driver_path = shutil.which("chromedriver")
    if binary is None or driver_path is None:
        pytest.skip(f"Chromium or chromedriver not found; install them with: {INSTALL}")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--allow-file-access-from-files",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_window_size(width, height)
    return driver


def toc_pages(root: Path) -> list[str]:
    """Every page of ``_toc.yml``, as paths without suffix (``notebooks/01_decode_loop``)."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    pages = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                pages.append(entry["file"])
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return [
        str(Path(p).with_suffix("")) if Path(p).suffix in (".md", ".ipynb") else p for p in pages
    ]


def requested_urls(driver) -> list[str]:
    """Every URL the page asked for since the last call (Chrome's performance log)."""
    import json

    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
