"""The Private rehearsal tab's ladder (`envace private-ladder`) in headless Chromium: a ladder the real default model
wrote, drawn as its paired table and its per-turn diagnosis; and a store without ladder rows, which says so and
names the command that fills it."""

import os
from pathlib import Path

import pytest
from ports import free_port

from apps.app import serve
from apps.screenshots import follow_link, open_tab, toasts, waiting

pytestmark = pytest.mark.heavy  # a browser, and the default model playing a small ladder

LADDER_CONFIG = """
# The smallest ladder the default model writes: one BFCL test task's 1-call turns, compact prompts, short attempts.
[rollout]
model = "default"
mode = "real+shadow"
unit = "turn"
max_turn_calls = 1
limit = 1
caller_demo = true
tool_docs = "compact"
max_new_tokens = 32
max_steps_per_turn = "auto"
embedding = false

[rollout.rehearser]
max_examples = 2
max_new_tokens = 32

[rollout.private]
max_steps = 1
memory = "transcript"
memory_tokens = 48
"""


@pytest.fixture(scope="module")
def ladder_store(tmp_path_factory):
    """A store holding a ladder the default model played (N = 0, the reference and the rehearsed memory: the view
    draws every rung alike, so the empty block's and the real-world rung's plays are left to their own tests,
    `test_private_ladder.py`), and nothing else."""
    from envace.cli import main

    reuse = os.environ.get("ENVACE_LADDER_STORE")  # a store this fixture wrote before: saves ~2 min when iterating
    if reuse:
        return Path(reuse)
    root = tmp_path_factory.mktemp("ladder")
    config = root.parent / "ladder.toml"
    config.write_text(LADDER_CONFIG)
    assert main(["private-ladder", "--name", "ladder", "--models", "base=default", "--rungs",
                 "reference,rehearsed", "--config", str(config), "--root", str(root)]) == 0
    return root


def _served(root):
    port = free_port()
    return serve(root, port=port, block=False), f"http://127.0.0.1:{port}/"


def test_the_private_rehearsal_tab_draws_the_ladder_the_default_model_wrote(ladder_store, browser):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By

    app, url = _served(ladder_store)
    try:
        follow_link(browser, url, "ladder", "rehearsal")  # a ladder's own tab: Private rehearsal
        wait = waiting(browser, 90)
        table = (By.CSS_SELECTOR, "#ladder-table [data-testid='cell-0-0']")
        try:
            wait.until(lambda d: d.find_elements(*table))
        except TimeoutException:  # what the page shows instead
            picker = browser.find_element(By.CSS_SELECTOR, "#ladder-run input").get_attribute("value")
            pytest.fail(f"the ladder's table was not drawn: note {browser.find_element(By.ID, 'ladder-note').text!r}"
                        f", picker {picker!r}, toasts {toasts(browser)}")
        text = browser.find_element(By.ID, "ladder-table").text
        for rung in ("reference", "rehearsed"):
            assert rung in text
        assert "N = 0" in text and "MDE 80%" in text and "Holm McNemar p" in text
        diagnosis = browser.find_element(By.ID, "ladder-diagnosis").text
        assert "changed" in diagnosis and "copied" in diagnosis and "fidelity" in diagnosis and "reference" in diagnosis
        assert browser.find_element(By.ID, "ladder-note").text.strip() == ""
        assert toasts(browser) == []
    finally:
        app.close()


def test_a_store_without_a_ladder_says_so_and_names_the_command(tmp_path, browser):
    from selenium.webdriver.common.by import By

    from envace.cli import main

    root = tmp_path / "store"
    assert main(["eval", "tiny", "--limit", "1", "--max-new-tokens", "4", "--max-steps-per-turn", "1",
                 "--root", str(root), "--run-name", "plain"]) == 0  # a run, but no ladder row
    app, url = _served(root)
    try:
        browser.get(url)
        wait = open_tab(browser, "Private rehearsal")
        note = (By.ID, "ladder-note")
        wait.until(lambda d: "No private-rehearsal ladder yet" in d.find_element(*note).text)
        assert "envace private-ladder" in browser.find_element(*note).text
        assert not [e for e in browser.find_elements(By.ID, "ladder-table") if e.is_displayed()]  # nothing empty drawn
        assert toasts(browser) == []
    finally:
        app.close()
