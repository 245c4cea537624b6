"""``mmpos app`` in a real headless Chromium (the operating system's ``chromium``, driven by Playwright for
Python): upload pictures, draw the transplant box with two clicks, run the edit and see its result and the progress
bar advance; author a camera path, plot its rig and get a video the browser plays. A screenshot of each tab is
saved into ``$MMPOS_APP_SCREENSHOTS`` (``make test-app``: docs/images/), else into the test's temporary folder.
Skipped, saying why, without Playwright or the Chromium executable (``make test-app`` installs both)."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest

from .conftest import gradio  # noqa: F401  (skips the module without the [app] extra)

pytest.importorskip("playwright", reason="the browser test needs Playwright for Python: make test-app")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).is_file():
    pytest.skip(
        "the browser test needs the system Chromium: apt-get install -y chromium (make test-app)",
        allow_module_level=True,
    )

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SEEN = set()
RUN_SECONDS = 300  # a run on the loaded shared 2-core machine (2 steps; the model loads first)


@pytest.fixture(scope="module")
def page(served_app, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),  # a fresh user-data-dir
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1280, "height": 1000},
        )
        page = context.new_page()
        page.goto(served_app[0])
        page.get_by_role("tab", name="Generate").wait_for()
        yield page
        context.close()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("MMPOS_APP_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _set_number(page, element_id: str, value) -> None:
    field = page.locator(f"#{element_id} input")
    field.fill(str(value))
    field.press("Tab")


def _wait_with_progress(page, done_selector: str) -> list[float]:
    """Wait for ``done_selector`` while recording the progress fractions the page shows (tqdm's ``k/N`` in the
    progress text, the bar's percentage); a shown error fails with its text."""
    fractions = []
    deadline = time.monotonic() + RUN_SECONDS
    while time.monotonic() < deadline:
        for text in page.locator(".progress-text, .meta-text, .progress-level").all_inner_texts():
            SEEN.add(text)
            fractions += [int(k) / int(n) for k, n in re.findall(r"(\d+)/(\d+)", text) if int(n)]
            fractions += [float(p) / 100 for p in re.findall(r"([\d.]+)%", text)]
        if page.locator(done_selector).count():
            return fractions
        toast = page.locator(".toast-body")
        if toast.count():
            pytest.fail(f"the page showed an error: {toast.first.inner_text()}")
        time.sleep(0.25)
    pytest.fail(f"{done_selector} did not appear within {RUN_SECONDS} s")


def _shown(page, selector: str) -> dict:
    """The natural size of the image at ``selector`` (0 x 0 while it has not loaded)."""
    image = page.locator(selector).first
    image.wait_for(state="visible")
    page.wait_for_function("(img) => img.complete && img.naturalWidth > 0", arg=image.element_handle())
    return image.evaluate("(img) => ({width: img.naturalWidth, height: img.naturalHeight})")


def test_transplant_edit_with_a_drawn_box(page, pictures, screenshots):
    page.get_by_role("tab", name="Edit").click()
    page.get_by_role("tab", name="PE transplant").click()
    page.locator("#transplant-background input[type=file]").set_input_files(str(pictures["background"]))
    page.locator("#transplant-reference input[type=file]").set_input_files(str(pictures["object"]))
    shown = page.locator("#transplant-background img").first
    shown.wait_for(state="visible")
    box = shown.bounding_box()  # the 48 x 40 picture, scaled on the page: click two corners of the box
    status = page.locator("#box-status")
    for (x, y), said in zip(((8.5, 8.5), (39.5, 31.5)), ("first corner (8, 8)", "8 8 40 32")):
        shown.click(position={"x": x / 48 * box["width"], "y": y / 40 * box["height"]})
        status.get_by_text(said, exact=False).wait_for(timeout=60_000)  # the page took the click
    values = [int(float(page.locator(f"#box-{n} input").input_value())) for n in "LTRB"]
    assert values == [8, 8, 40, 32]  # the clicked pixels, right and bottom exclusive
    _shown(page, "#transplant-box img")  # the box drawn on the background
    _set_number(page, "edit-steps", 8)  # the strength sweep's runs take long enough for the page to show them
    page.locator("#transplant-run").click()
    fractions = _wait_with_progress(page, "#transplant-comparison img")
    assert max(fractions, default=0) > 0, sorted(t for t in SEEN if not t.endswith("s"))
    comparison = _shown(page, "#transplant-comparison img")
    assert comparison["width"] > 3 * 32  # the CLI's strip: inputs, edited, strength sweep
    assert page.locator("#transplant-edited img").count() >= 1
    page.screenshot(path=str(screenshots / "app_edit.png"), full_page=True)


def test_camera_path_gives_a_playable_video(page, screenshots):
    page.get_by_role("tab", name="Camera video").click()
    page.locator("#camera-mode").get_by_text("actions").click()
    page.locator("#camera-actions textarea").fill("forward 0.4; turn 20; strafe -0.2")
    _set_number(page, "camera-steps", 8)
    page.locator("#camera-plot").click()
    rig = _shown(page, "#camera-rig img")
    assert rig["width"] > 100  # the rig, plotted before anything is generated
    page.locator("#camera-run").click()
    fractions = _wait_with_progress(page, "#camera-frames img")
    assert max(fractions, default=0) > 0
    video = page.locator("#camera-video video").first
    page.wait_for_function("(v) => v.readyState >= 2 && v.videoWidth > 0", arg=video.element_handle(), timeout=60_000)
    state = video.evaluate("(v) => ({error: v.error && v.error.code, duration: v.duration, width: v.videoWidth})")
    assert state["error"] is None and state["duration"] > 0 and state["width"] == 32  # decoded by the browser
    page.locator("#camera-numbers").wait_for(state="visible")
    page.screenshot(path=str(screenshots / "app_camera.png"), full_page=True)


def test_generate_and_encodings_tabs(page, screenshots):
    page.get_by_role("tab", name="Generate").click()
    _set_number(page, "generate-steps", 2)
    page.locator("#generate-run").click()
    _wait_with_progress(page, "#generate-plain img")
    assert _shown(page, "#generate-extrapolated img")["width"] == 64
    page.screenshot(path=str(screenshots / "app_generate.png"), full_page=True)
    page.get_by_role("tab", name="Encodings").click()
    page.locator("#encoding-show").click()
    assert _shown(page, "#encoding-figure img")["width"] >= 800
    page.screenshot(path=str(screenshots / "app_encodings.png"), full_page=True)
