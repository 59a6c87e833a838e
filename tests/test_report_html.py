"""report.html: its clip files decode to the pixels they show (checked here against the PNG
frames and an independent colour scale), and the page works in a real headless Chromium:
no console errors, every video plays, the sync control moves every clip, and the layout puts
a prompt's clips in one row, each difference clip beside its clip, the scores under both."""

from __future__ import annotations

import io
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from cli_runs import SMALL, prompts_file, run_vcbench
from matplotlib import colormaps
from test_report import make_generate_run, read_png

from vcbench.report import build_report, html
from vcbench.report.tables import REFERENCE

BROWSER_MISSING = ("needs Chromium, chromedriver and selenium (make browser installs the first "
                   "two as root on Debian: apt-get install chromium chromium-driver; selenium "
                   "is in the dev extras)")


def decode(path: Path) -> np.ndarray:
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])


def frames_of(run: Path, method: str, prompt: str, seed: int) -> np.ndarray:
    folder = run / "clips" / method / prompt / f"s{seed}" / "frames"
    return np.stack([read_png(p) for p in sorted(folder.glob("*.png"))])


def heat(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """The documented scale, computed here pixel by pixel: inferno(sqrt(d / 255))."""
    d = np.abs(cand.astype(int) - ref.astype(int)).max(axis=-1)
    return np.round(colormaps["inferno"](np.sqrt(d / 255.0))[..., :3] * 255).astype(np.uint8)


@pytest.fixture
def webm():
    if not html.can_encode_webm():
        pytest.skip("needs PyAV with the libvpx-vp9 encoder (the page then uses PNG strips)")


def test_clip_and_difference_videos_hold_the_exact_pixels(tmp_path, webm):
    gen = make_generate_run(tmp_path / "gen")
    report = build_report([gen], tmp_path / "out")
    folder = tmp_path / "out" / "clips" / "tiny-wan" / "p001_s1"
    ref, cand = frames_of(gen, "bf16", "p001", 1), frames_of(gen, "fp8-fa4", "p001", 1)
    np.testing.assert_array_equal(decode(folder / "bf16.webm"), ref)
    np.testing.assert_array_equal(decode(folder / "fp8-fa4.webm"), cand)
    np.testing.assert_array_equal(decode(folder / "fp8-fa4.diff.webm"), heat(ref, cand))
    assert not (folder / "bf16.diff.webm").exists()  # the reference has no difference clip
    # 3 methods x 2 prompts x 2 seeds clips, and a difference clip for each low-bit one.
    assert len(report.clips) == 12 + 8 and all(p.is_file() for p in report.clips)
    # The scale's ends: black-ish for no error, inferno's yellow-white for the largest.
    lut = html.diff_lut()
    assert tuple(lut[0]) == (0, 0, 4) and tuple(lut[255]) == (252, 255, 164)


def test_without_a_video_encoder_clips_are_png_strips(tmp_path, monkeypatch):
    monkeypatch.setattr(html, "can_encode_webm", lambda: False)
    gen = make_generate_run(tmp_path / "gen")
    build_report([gen], tmp_path / "out")
    folder = tmp_path / "out" / "clips" / "tiny-wan" / "p000_s0"
    cand = frames_of(gen, "vc-8bit", "p000", 0)
    strip = read_png(folder / "vc-8bit.png")
    np.testing.assert_array_equal(strip, np.concatenate(list(cand), axis=1))
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<video" not in page and "PNG frames stepped by the page" in page


def test_report_md_tables_and_figures_are_on_the_page():
    md = ("# title\n\n## Fidelity\n\n- **note**: a `cmd`\n\n| method | psnr |\n|---|---|\n"
          "| vc-8bit | **30.0 ± 1.0** |\n| a \\| b | <u>x</u> |\n\n![psnr](psnr.png)\n\nText <b>\n")
    page = html.markdown_to_html(md, skip_title=True)
    assert "title" not in page and "<h3>Fidelity</h3>" in page
    assert "<li><b>note</b>: a <code>cmd</code></li>" in page
    assert "<td><b>30.0 ± 1.0</b></td>" in page and "<td>a | b</td><td><u>x</u></td>" in page
    assert '<img src="psnr.png" alt="psnr">' in page and "<p>Text &lt;b&gt;</p>" in page


# --- in a browser ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        webdriver = None
    if not (chromium and driver_path and webdriver):
        pytest.skip(BROWSER_MISSING)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000",
                "--autoplay-policy=no-user-gesture-required"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The Debian driver by path: selenium's own manager would go looking on the network.
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    """generate (tiny-wan-random, two methods, one prompt and seed), score, report: the CLI."""
    root = tmp_path_factory.mktemp("html")
    prompts = prompts_file(root, {"p0": "a red ball rolls to the right"})
    gen = root / "gen"
    steps = [["generate", "--model", "tiny-wan-random", "--methods", f"{REFERENCE},vc-8bit",
              "--prompts", prompts, "--seeds", "0", *SMALL, "--out", gen],
             ["score", gen, "--metrics", "psnr,ssim", "--json", gen / "score.json"],
             ["report", gen, "--out", root / "report"]]
    for args in steps:
        done = run_vcbench(*args)
        assert done.returncode == 0, done.stderr
    return root / "report" / "report.html"


def errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def wait_for(driver, script: str, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = driver.execute_script(script)
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for: {script}")


def box(element) -> dict:
    r = element.rect
    return {**r, "right": r["x"] + r["width"], "bottom": r["y"] + r["height"]}


def test_page_plays_in_sync_in_a_browser(browser, webm, tiny_report, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(tiny_report.as_uri())
    assert browser.title == "vcbench report"
    videos = browser.find_elements(By.TAG_NAME, "video")
    assert len(videos) == 3  # bf16, vc-8bit and vc-8bit's difference clip
    wait_for(browser, "return [...document.querySelectorAll('video')]"
                      ".every(v => v.readyState >= 2)")
    assert errors(browser) == []
    # The frame slider moves every clip to the middle of that frame (5 frames at 16 fps).
    fps = float(browser.find_element(By.TAG_NAME, "body").get_attribute("data-fps"))
    slider = browser.find_element(By.ID, "frame")
    assert slider.get_attribute("max") == "4"
    for frame in (3, 1):
        browser.execute_script("const s = document.getElementById('frame'); s.value = arguments[0];"
                               "s.dispatchEvent(new Event('input'));", frame)
        times = browser.execute_script("return [...document.querySelectorAll('video')]"
                                       ".map(v => v.currentTime)")
        assert all(math.floor(t * fps) == frame for t in times), times
        assert browser.find_element(By.ID, "frame-label").text == f"{frame} / 4"
    # Play all: every video plays and advances; Pause all stops them together.
    browser.find_element(By.ID, "play").click()
    start = browser.execute_script("return [...document.querySelectorAll('video')]"
                                   ".map(v => v.currentTime)")
    wait_for(browser, "return [...document.querySelectorAll('video')].every((v, i) => "
                      "!v.paused && v.currentTime !== arguments[0][i])".replace(
                          "arguments[0]", json.dumps(start)))
    browser.find_element(By.ID, "play").click()
    assert browser.execute_script("return [...document.querySelectorAll('video')]"
                                  ".every(v => v.paused)")
    assert errors(browser) == []

    # Layout: one row per prompt and seed, reference first; each difference clip to the right
    # of its clip at the same height; the scores below both.
    browser.save_screenshot(str(tmp_path / "page.png"))
    shot = read_png(tmp_path / "page.png")
    assert shot.shape[0] > 500 and len(np.unique(shot.reshape(-1, 3), axis=0)) > 50
    cards = browser.find_elements(By.CSS_SELECTOR, ".group .card")
    assert [c.get_attribute("data-method") for c in cards] == [REFERENCE, "vc-8bit"]
    assert "reference" in cards[0].text
    first, second = box(cards[0]), box(cards[1])
    assert first["y"] == second["y"] and second["x"] >= first["right"]
    clip = box(cards[1].find_element(By.CSS_SELECTOR, ".clip .player"))
    diff = box(cards[1].find_element(By.CSS_SELECTOR, ".diff .player"))
    metrics = box(cards[1].find_element(By.CSS_SELECTOR, ".metrics"))
    assert diff["x"] >= clip["right"] and abs(diff["y"] - clip["y"]) < 1
    assert metrics["y"] >= max(clip["bottom"], diff["bottom"])
    # Upscaled from the clip's own 128 px, pixel for pixel (the zoom is a whole number here).
    assert clip["width"] >= 128 and clip["width"] == diff["width"]
    # The scores are score.json's, and a metric it does not hold says so.
    score = json.loads((tiny_report.parents[1] / "gen" / "score.json").read_text())["rows"][0]
    cells = {r.get_attribute("data-metric"): r.find_element(By.TAG_NAME, "td").text
             for r in cards[1].find_elements(By.CSS_SELECTOR, ".metrics tr")}
    assert cells["psnr"] == f"{float(score['psnr']):.2f} dB"
    assert cells["lpips"] == "not scored"
    # report.md's tables and figures follow; every image on the page loaded.
    assert browser.find_elements(By.CSS_SELECTOR, "#tables table")
    assert browser.execute_script("return [...document.images].every(i => i.naturalWidth > 0)")


def test_png_strips_follow_the_sync_control_in_a_browser(browser, tmp_path, monkeypatch):
    from selenium.webdriver.common.by import By

    monkeypatch.setattr(html, "can_encode_webm", lambda: False)
    build_report([make_generate_run(tmp_path / "gen")], tmp_path / "out")
    browser.get((tmp_path / "out" / "report.html").as_uri())
    strips = browser.find_elements(By.CSS_SELECTOR, ".strip")
    assert len(strips) == 20
    browser.execute_script("window.vcbenchSync.seekFrame(2)")
    assert {s.get_attribute("data-frame") for s in strips} == {"2"}
    assert errors(browser) == []


def test_a_run_scored_against_another_runs_bf16_gets_its_difference_clips(tmp_path, webm):
    from vcbench.scoring import ScoreOptions, score, write_outputs

    ref = make_generate_run(tmp_path / "ref", methods=(REFERENCE,), with_score=False)
    cand = make_generate_run(tmp_path / "u", methods=("vc-8bit",), with_score=False,
                             schedule={"schedule_placement": "uniform"})
    write_outputs(score(ref, cand, ScoreOptions(["psnr"])), cand / "score.json", None)
    build_report([ref, cand], tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text()
    folder = tmp_path / "out" / "clips" / "tiny-wan" / "p000_s1"
    assert (folder / f"{REFERENCE}.webm").is_file()
    assert (folder / "vc-8bit_schedule_placement_uniform.diff.webm").is_file()
    assert 'data-name="vc-8bit [schedule_placement=uniform]"' in page
    assert page.count('<tr data-metric="psnr"><th title="higher is better">PSNR ↑</th><td>') == 4
    # The links to a clip's own files are relative to the report folder.
    assert 'href="../u/clips/vc-8bit/p000/s1/frames"' in page


def test_a_large_clip_is_encoded_lossy_and_says_so(monkeypatch, webm):
    from score_fixtures import smooth_clip

    monkeypatch.setattr(html, "LOSSLESS_MAX_PIXELS", 100)
    frames = smooth_clip(3, frames=4, height=33, width=31)  # odd sides: 4:2:0 pads them
    data, how = html.encode_webm(frames)
    assert how.startswith("lossy")
    import av

    with av.open(io.BytesIO(data)) as container:
        decoded = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    assert decoded.shape == (4, 34, 32, 3)
    error = np.abs(decoded[:, :33, :31].astype(int) - frames.astype(int))
    assert 0 < error.mean() < 8  # lossy, but the same picture
