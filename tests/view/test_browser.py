"""`t1 view` in a real headless Chromium (Debian's chromium + chromium-driver, driven by selenium).

The viewer runs as its own process (`t1 view RUN_DIR --port 0`) on the session's smoke run; one
browser serves the whole module (Chromium is CPU-heavy). Every page must load without a console
error, every curve must have drawn points, and an episode's token view must show exactly the
record's ids with the loss-mask colouring of the record. Screenshots go to each test's tmp dir.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from browserkit import headless_chromium, load, start_viewer
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait
from smoke_run import SMOKE_TIMEOUT, SmokeRun

from t1.trajectory.serialization import decode_trajectory
from t1.trajectory.types import Trajectory

pytestmark = SMOKE_TIMEOUT  # the first test here may be the one that starts the session's smoke run


@pytest.fixture(scope="module")
def viewer(smoke_run: SmokeRun) -> Iterator[str]:
    """`t1 view` on the smoke run's directory; yields its base URL."""
    assert smoke_run.rc == 0, smoke_run.log[-4000:]
    yield from start_viewer(smoke_run.run_dir)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    yield from headless_chromium()


def follow(driver: WebDriver, click: Callable[[], None]) -> None:
    """Click something that navigates, wait for the new address (a reload of the old one races it), load it."""
    before = driver.current_url
    click()
    WebDriverWait(driver, 30).until(lambda d: d.current_url != before)
    load(driver, driver.current_url)


def buffer_records(smoke_run: SmokeRun) -> dict[str, Trajectory]:
    """The trainer's own records, read with the codec (not through the viewer)."""
    with sqlite3.connect(f"file:{smoke_run.trainer_dir / 'buffer.sqlite'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT id, payload FROM trajectories").fetchall()
    return {tid: decode_trajectory(bytes(p)) for tid, p in rows}


def test_run_page_draws_every_curve(viewer: str, browser: WebDriver, tmp_path: Path) -> None:
    load(browser, viewer + "/")
    charts = browser.find_elements(By.CSS_SELECTOR, ".chart")
    keys = {c.get_attribute("id") for c in charts}
    for key in ("reward", "kl", "logprob_diff", "turns_per_s", "entropy", "clip_fraction", "explained_variance",
                "policy_lag", "infra_failure_rate"):
        assert f"chart-{key}" in keys, keys
    for chart in charts:
        # points plotly actually drew (SVG markers), not the numbers the page was handed
        drawn = chart.find_elements(By.CSS_SELECTOR, ".scatterlayer .point")
        assert drawn, f"{chart.get_attribute('id')} drew no points"
    stages = [s.text for s in browser.find_elements(By.CSS_SELECTOR, "#timeline .stage")]
    assert "training" in stages, stages
    evals = browser.find_elements(By.CSS_SELECTOR, "#evals tr")[1:]
    # the three policies the run evaluates, in order: base, warm start (after SFT), RL (after PPO)
    names = [r.find_elements(By.TAG_NAME, "td")[1].text for r in evals]
    assert names == ["base:heldout", "warm_start:heldout", "rl:heldout"], names
    assert browser.find_element(By.CSS_SELECTOR, "#compare").text.count("resolve") == 3
    browser.save_screenshot(str(tmp_path / "run.png"))


def test_episodes_table_filters_sorts_and_links(viewer: str, browser: WebDriver, smoke_run: SmokeRun,
                                                 tmp_path: Path) -> None:
    load(browser, viewer + "/episodes")
    trained = buffer_records(smoke_run)
    ids = {r.get_attribute("data-id") for r in browser.find_elements(By.CSS_SELECTOR, "#episodes tr.ep")}
    assert set(trained) <= ids, "every trajectory the trainer holds is listed"
    assert any(i.startswith("demo-") for i in ids) and any(i.startswith("eval-") for i in ids)
    browser.save_screenshot(str(tmp_path / "episodes.png"))

    Select(browser.find_element(By.NAME, "source")).select_by_visible_text("train")
    follow(browser, browser.find_element(By.CSS_SELECTOR, ".filters button").click)
    assert "source=train" in browser.current_url
    rows = browser.find_elements(By.CSS_SELECTOR, "#episodes tr.ep")
    assert {r.get_attribute("data-id") for r in rows} == set(trained)

    follow(browser, browser.find_element(By.LINK_TEXT, "reward").click)  # first click: descending
    rewards = [float(r.find_elements(By.TAG_NAME, "td")[6].text) for r in
               browser.find_elements(By.CSS_SELECTOR, "#episodes tr.ep")]
    assert rewards == sorted(rewards, reverse=True) and len(rewards) == len(trained)
    assert sorted(rewards) == sorted(t.reward for t in trained.values())


def test_episode_token_view_is_the_record(viewer: str, browser: WebDriver, smoke_run: SmokeRun,
                                          tmp_path: Path) -> None:
    records = buffer_records(smoke_run)
    tid, traj = max(records.items(), key=lambda kv: kv[1].num_tokens)
    load(browser, f"{viewer}/episodes/{quote(tid)}")
    for i, seg in enumerate(traj.segments):
        cells = browser.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0])).map(e => "
            "[Number(e.dataset.id), e.classList.contains('role-loss'), getComputedStyle(e).backgroundColor])",
            f"#segment-{i} .tokens .tok")
        assert [c[0] for c in cells] == seg.token_ids.tolist(), f"segment {i}: ids differ from the record"
        assert [c[1] for c in cells] == seg.loss_mask.tolist(), f"segment {i}: loss colouring differs from the mask"
        loss_colours = {c[2] for c in cells if c[1]}
        other_colours = {c[2] for c in cells if not c[1]}
        assert len(loss_colours) == 1 and not loss_colours & other_colours, (loss_colours, other_colours)
    # hovering a sampled token shows its id, logprob and version
    tok = browser.find_element(By.CSS_SELECTOR, "#segment-0 .tok.role-loss")
    webdriver.ActionChains(browser).move_to_element(tok).perform()
    info = browser.find_element(By.ID, "tokinfo").text
    pos = int(tok.get_attribute("data-p"))
    seg0 = traj.segments[0]
    want = (f"pos {pos} | id {seg0.token_ids[pos]} |", f"| logprob {seg0.logprobs[pos]:.4f} |",
            f"| version {seg0.policy_versions[pos]} |")
    assert all(w in info for w in want), (info, want)
    turns = browser.find_elements(By.CSS_SELECTOR, "#turns .turn")
    assert len(turns) == sum(len(s.turns) for s in traj.segments)
    tests = browser.find_elements(By.CSS_SELECTOR, "#verifier tr")[1:]
    assert len(tests) == len(traj.verifier.tests)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#verifier tr.fail")) == sum(
        s != "passed" for _, s in traj.verifier.tests)
    browser.save_screenshot(str(tmp_path / "episode.png"))
    browser.execute_script("document.getElementById('segment-0').scrollIntoView()")
    time.sleep(0.2)
    browser.save_screenshot(str(tmp_path / "tokens.png"))


def test_group_page_shows_attempts_side_by_side(viewer: str, browser: WebDriver, smoke_run: SmokeRun,
                                                tmp_path: Path) -> None:
    records = buffer_records(smoke_run)
    group = next(iter(records.values())).group_id
    members = sorted((t for t in records.values() if t.group_id == group), key=lambda t: t.attempt)
    load(browser, f"{viewer}/groups/{quote(group)}")
    cards = browser.find_elements(By.CSS_SELECTOR, "#attempts .attempt")
    assert [c.get_attribute("data-id") for c in cards] == [t.id for t in members]
    rewards = [float(c.find_element(By.CSS_SELECTOR, ".reward").text) for c in cards]
    assert rewards == [t.reward for t in members]
    advantages = [float(c.find_element(By.CSS_SELECTOR, ".advantage").text) for c in cards]
    assert abs(sum(advantages)) < 0.01  # shown to 3 significant digits
    browser.save_screenshot(str(tmp_path / "group.png"))
