"""A real browser against ``tvr serve``: headless Chromium (Debian's ``chromium`` + ``chromium-driver``, driven by
Selenium with both paths given, so nothing is ever downloaded) loads the page served from an index built here, types
a query, and the expected video is ranked first; the thumbnails load and the player starts at the hit's window; the
address follows the search and a deep link ``/?q=...&k=...`` (opened, reloaded, stepped back to) shows its results;
blank and over-long queries get a message, and a long query never widens the page; on a 400 px screen nothing
scrolls sideways, and the page's icon loads from the server. A screenshot is saved under
``$TVR_ARTIFACTS`` (default: the test's tmp folder) and its path printed.

Skips only where Chromium or its driver is not installed (``.ci/run`` installs both)."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest
from search_fixtures import index_args
from typer.testing import CliRunner

from tvr.cli import app as cli
from tvr.search import open_index
from tvr.search.server import create_app

CHROMIUM = os.environ.get("TVR_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("TVR_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1100,900",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def browser(tmp_path: Path):
    if not (Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file()):
        pytest.skip(f"Chromium not installed ({CHROMIUM}, {CHROMEDRIVER}): apt-get install chromium chromium-driver")
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch a driver or a browser
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture
def server(search_setup, tmp_path: Path):
    import uvicorn

    out = tmp_path / "idx"
    assert CliRunner().invoke(cli, index_args(search_setup.videos, out, search_setup.checkpoint)).exit_code == 0
    port = _free_port()
    config = uvicorn.Config(create_app(open_index(out)), host="127.0.0.1", port=port, log_level="warning")
    uvi = uvicorn.Server(config)
    thread = threading.Thread(target=uvi.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uvi.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert uvi.started, "the server did not start"
    yield f"http://127.0.0.1:{port}"
    uvi.should_exit = True
    thread.join(timeout=10)


def test_the_page_finds_the_video_in_a_real_browser(browser, server: str, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server + "/")
    box = browser.find_element(By.ID, "q")
    box.send_keys("a yellow screen")
    browser.find_element(By.ID, "go").click()
    wait = WebDriverWait(browser, 60)
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") in ("done", "error"))
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "done", browser.find_element(
        By.ID, "status"
    ).text
    hits = browser.find_elements(By.CSS_SELECTOR, "li.hit")
    assert len(hits) == 5
    assert hits[0].get_attribute("data-video") == "sub/yellow.mp4"
    assert "sub/yellow.mp4" in hits[0].text and "score" in hits[0].text
    # every thumbnail is a decoded image
    wait.until(
        lambda d: all(
            d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img)
            for img in d.find_elements(By.CSS_SELECTOR, "li.hit img")
        )
    )
    # the inline player opens on the hit's window
    hits[1].find_element(By.CSS_SELECTOR, "button.play").click()
    player = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "li.hit video")))
    assert "#t=" in player.get_attribute("src")
    wait.until(lambda d: d.execute_script("return arguments[0].readyState", player) >= 1)
    folder = Path(os.environ.get("TVR_ARTIFACTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    shot = folder / "search_page.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 1000
    print(f"\nscreenshot: {shot}")


def _settled(browser) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    body = browser.find_element(By.TAG_NAME, "body")
    WebDriverWait(browser, 60).until(lambda d: body.get_attribute("data-state") in ("done", "error"))
    return body.get_attribute("data-state")


def _shown(browser) -> list[str]:
    from selenium.webdriver.common.by import By

    return [hit.get_attribute("data-video") for hit in browser.find_elements(By.CSS_SELECTOR, "li.hit")]


def test_the_address_is_a_deep_link(browser, server: str) -> None:
    from urllib.parse import parse_qs, urlsplit

    from selenium.webdriver.common.by import By

    browser.get(server + "/?q=a%20magenta%20screen&k=2")
    assert _settled(browser) == "done"
    assert _shown(browser)[0] == "sub/magenta.mp4" and len(_shown(browser)) == 2
    assert browser.find_element(By.ID, "q").get_attribute("value") == "a magenta screen"
    assert browser.find_element(By.ID, "k").get_attribute("value") == "2"
    # a search from the box moves the address; a reload shows the same results
    box = browser.find_element(By.ID, "q")
    box.clear()
    box.send_keys("a green screen")
    browser.execute_script("document.body.dataset.state = 'typing'")
    browser.find_element(By.ID, "go").click()
    assert _settled(browser) == "done" and _shown(browser)[0] == "green.mp4"
    assert parse_qs(urlsplit(browser.current_url).query) == {"q": ["a green screen"], "k": ["2"]}
    browser.execute_script("document.body.dataset.state = 'reloading'")
    browser.refresh()
    assert _settled(browser) == "done" and _shown(browser)[0] == "green.mp4"
    # back: the earlier search again
    browser.execute_script("document.body.dataset.state = 'back'")
    browser.back()
    assert _settled(browser) == "done" and _shown(browser)[0] == "sub/magenta.mp4"
    # a blank query and one longer than the API takes get a message, not silence
    browser.get(server + "/?q=%20%20%20")
    assert _settled(browser) == "error" and "type what to search for" in browser.find_element(By.ID, "status").text
    browser.get(server + "/?q=" + "y" * 600)
    assert _settled(browser) == "error" and "at most 500" in browser.find_element(By.ID, "status").text
    long_query = "z" * 480  # accepted; the page must not scroll sideways to show it
    browser.get(server + "/?q=" + long_query + "&k=3")
    assert _settled(browser) == "done"
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")


def test_the_page_fits_a_400_px_screen_and_has_an_icon(browser, server: str) -> None:
    """A phone-sized window (400 CSS px): results, an open player and an over-long query never make the page scroll
    sideways; the page names an icon, and the browser loads it from the server."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    # the viewport itself (a headless window cannot be made narrower than 500 px)
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 400, "height": 800, "deviceScaleFactor": 1, "mobile": False}
    )
    fits = "return [document.documentElement.scrollWidth, window.innerWidth]"
    browser.get(server + "/?q=a%20red%20screen&k=5")
    assert _settled(browser) == "done" and len(_shown(browser)) == 5
    width, inner = browser.execute_script(fits)
    assert inner == 400 and width <= inner
    browser.find_elements(By.CSS_SELECTOR, "button.play")[0].click()
    player = WebDriverWait(browser, 60).until(ec.presence_of_element_located((By.CSS_SELECTOR, "li.hit video")))
    WebDriverWait(browser, 60).until(lambda d: d.execute_script("return arguments[0].readyState", player) >= 1)
    width, inner = browser.execute_script(fits)
    assert width <= inner
    browser.get(server + "/?q=" + "z" * 480 + "&k=3")
    assert _settled(browser) == "done"
    width, inner = browser.execute_script(fits)
    assert width <= inner

    icon = browser.execute_script("return document.querySelector('link[rel~=icon]').href")
    assert icon == server + "/favicon.svg"
    loaded = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "const image = new Image();"
        "image.onload = () => done([image.naturalWidth, image.naturalHeight]);"
        "image.onerror = () => done(null);"
        "image.src = arguments[0];",
        icon,
    )
    assert loaded is not None and loaded[0] > 0 and loaded[1] > 0


def test_the_page_filters_by_folder_and_time(browser, server: str) -> None:
    """The folder and time boxes: a deep link with ``under`` fills its box and shows only that folder's videos; a
    span typed in the box restricts the next search, and the address carries it."""
    from urllib.parse import parse_qs, urlsplit

    from selenium.webdriver.common.by import By

    browser.get(server + "/?q=a%20red%20screen&k=5&under=sub")
    assert _settled(browser) == "done"
    assert sorted(_shown(browser)) == ["sub/magenta.mp4", "sub/yellow.mp4"]
    assert browser.find_element(By.ID, "under").get_attribute("value") == "sub"
    browser.find_element(By.ID, "under").clear()
    browser.find_element(By.ID, "between").send_keys("4.5,20")  # only the 9-second video has windows past 4.5 s
    browser.execute_script("document.body.dataset.state = 'typing'")
    browser.find_element(By.ID, "go").click()
    assert _settled(browser) == "done" and _shown(browser) == ["sub/yellow.mp4"]
    assert parse_qs(urlsplit(browser.current_url).query) == {"q": ["a red screen"], "k": ["5"], "between": ["4.5,20"]}
    browser.execute_script("document.body.dataset.state = 'typing'")
    browser.find_element(By.ID, "between").send_keys("x")
    browser.find_element(By.ID, "go").click()
    assert _settled(browser) == "error" and "between" in browser.find_element(By.ID, "status").text
