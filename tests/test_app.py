"""The real app on a free localhost port, over a real store: driven through its API and in headless Chromium."""

import json
import socket
from pathlib import Path

import pytest
from gradio_client import Client
from ports import free_port

from apps.app import KIND_COLUMNS, serve
from apps.screenshots import TABS, follow_link, landings, open_tab, shoot, toasts, waiting


@pytest.fixture(scope="module")
def app_url(store):
    port = free_port()
    app = serve(store, port=port, block=False)
    yield f"http://127.0.0.1:{port}/"
    app.close()


def test_the_api_lists_runs_and_renders_a_pair_with_its_diff(app_url, store):
    from workbench import Workbench

    client = Client(app_url, verbose=False)
    empty, warnings, runs, _ = client.predict("", [], "all", api_name="/refresh")
    assert empty == "" and warnings == ""
    assert {"scripted", "shadow", "trained", "sw"} <= {row[0] for row in runs["data"]}
    trained = next(r for r in runs["data"] if r[0] == "trained")  # a training run: its stored episodes counted
    assert int(trained[runs["headers"].index("episodes")]) == len(Workbench(store).episodes("trained"))
    _, _, trains, _ = client.predict("", [], "train", api_name="/refresh")  # a kind's view: its rows, its columns
    assert trains["headers"] == KIND_COLUMNS["train"] and {r[1] for r in trains["data"]} == {"train"}
    assert "trained" in {r[0] for r in trains["data"]} and len(trains["data"]) < len(runs["data"])
    _, _, found, _ = client.predict("TRAIN", [], "all", api_name="/refresh")  # search: any case, name/kind/model
    assert {r[0] for r in found["data"]} == {r[0] for r in runs["data"] if "train" in " ".join(map(str, r[:4]))}
    assert 0 < len(found["data"]) < len(runs["data"])
    diff = client.predict(["scripted", "trained"], api_name="/config_diff")  # only the fields that differ
    assert diff["visible"] and diff["value"]["headers"] == ["field", "scripted", "trained"]
    assert diff["value"]["data"] and all(r[1] != r[2] for r in diff["value"]["data"])
    assert not client.predict(["scripted"], api_name="/config_diff").get("visible", True)  # one run: no diff
    filters = ("any", 0, 1, "", "any", "any", "any")  # success, checklist range, tool, ended by, fidelity, error
    table, episode = client.predict("scripted", *filters, "best first", "any", None, None, api_name="/list_episodes")
    assert len(table["data"]) == 2 and episode["value"] == table["data"][0][0]
    worst, worst_episode = client.predict("scripted", *filters, "worst first", "any", None, None,
                                          api_name="/list_episodes")
    assert [r[0] for r in worst["data"]] == [r[0] for r in table["data"]][::-1]
    # a phase and a step: one GRPO step's episodes; the open episode stays open while it is listed
    everything = Workbench(store).episodes("trained")
    step = everything[everything["phase"] == "grpo"]
    listed = step.loc[step["step"] == 1, "episode_id"]
    one, kept = client.predict("trained", *filters, "best first", "grpo", 1, listed.iloc[-1],
                               api_name="/list_episodes")
    assert sorted(r[0] for r in one["data"]) == sorted(listed) and 0 < len(listed) < len(everything)
    assert kept["value"] == listed.iloc[-1]
    _, first = client.predict("trained", *filters, "best first", "grpo", 1, "not-listed", api_name="/list_episodes")
    assert first["value"] == one["data"][0][0]
    html, group = client.predict("scripted", worst_episode["value"], ["caller", "rehearser"], "off",
                                 api_name="/show")
    assert "<b>real</b>" in html and "<b>rehearsed</b>" in html
    assert not group["value"]["data"] and not group.get("visible", True)  # a rollout has no GRPO group
    assert 'class="diff-added"' in html and "invented_by_rehearser" in html  # the drift is marked in place
    nothing, _ = client.predict("scripted", None, ["caller", "rehearser"], "off", api_name="/show")
    assert "No episode of <code>scripted</code> matches these filters" in nothing  # not "pick a run"
    best, _ = client.predict("scripted", episode["value"], ["caller", "rehearser"], "log-prob", api_name="/show")
    assert "no structural difference" in best and 'class="diff-added"' not in best
    assert 'class="gen rehearser"' in best  # the token view colours each generation by its role
    with pytest.raises(Exception, match="invalid run name"):
        client.predict("../etc", *filters, "best first", "any", None, None, api_name="/list_episodes")


def test_the_dashboards_draw_from_the_real_store(app_url, store):
    from workbench import Workbench

    client = Client(app_url, verbose=False)
    note, table, bars, calibration, over, measured = client.predict("scripted", api_name="/fidelity")
    assert {r[0] for r in table["data"]} >= {"cd", "mkdir", "all"} and bars and calibration and note == ""
    assert not measured.get("visible") and not (measured.get("value") or {}).get("data")  # not the benchmark
    *_, measured = client.predict("measured", api_name="/fidelity")  # a world-model run: its interval table
    table = measured["value"]
    assert measured["visible"] and table["data"][-1][0] == "all"
    assert table["data"][-1][table["headers"].index("exact")] == "1.00 (1.00–1.00)"
    note, *_ = client.predict("shadow", api_name="/fidelity")  # the tiny model's shadow run: no pair at all
    assert "No pairs" in note and "real+shadow" in note
    note, curves, cells = (_shown(v) for v in client.predict("sw", "checklist", api_name="/budget_curves"))
    budget = cells["headers"].index("budget")
    assert curves and sorted(r[budget] for r in cells["data"]) == [0, 1]
    note, curves, spans, bars, last, picked, steps = client.predict(["trained"], "grpo", 0.5, [], "step",
                                                                    api_name="/training")
    curves, spans, bars, last, steps = _shown(curves), _shown(spans), _shown(bars), _shown(last), _shown(steps)
    episodes = Workbench(store).episode_spans("trained")  # one bar per GRPO episode, in the steps' colours
    bar_traces = [t for t in json.loads(bars["plot"])["data"] if t.get("orientation") == "h"]
    assert sum(len(t["x"]) for t in bar_traces) == len(episodes) > 0
    assert [t["name"] for t in bar_traces] == [f"step {s + 1}" for s in sorted(set(episodes["step"]))]
    counts = Workbench(store).episodes_by_step("trained")  # the episodes per GRPO step a click opens
    assert [r[:2] for r in steps["data"]] == [[s, n] for s, n in zip(counts["step"], counts["episodes"], strict=True)]
    assert len(steps["data"]) == 2
    assert curves and "reward_mean" in {r[0] for r in last["data"]} and note == ""
    assert spans and not any(r[0].endswith("_t") for r in last["data"])  # the timeline, and no clock in the table
    names = [c[0] for c in picked["choices"]]
    assert "loss" in names and not any(n.endswith("_t") or n == "epoch" for n in names)
    _, curves, *_ = client.predict(["trained"], "grpo", 0, ["loss"], "tokens", api_name="/training")
    figure = json.loads(_shown(curves)["plot"])
    assert [a["text"] for a in figure["layout"]["annotations"]] == ["policy loss"]  # the one metric picked
    assert figure["layout"]["xaxis"]["title"]["text"] == "tokens trained on"
    _, curves, *_ = client.predict(["trained"], "sft", 0, [], "step", api_name="/training")
    figure = json.loads(_shown(curves)["plot"])
    titles = {v.get("title", {}).get("text") for k, v in figure["layout"].items() if k.startswith("xaxis")}
    assert "SFT step" in titles and not any("GRPO" in str(t) for t in titles)  # its own axis, not GRPO's
    assert "epoch" not in [a["text"] for a in figure["layout"]["annotations"]]
    note, curves, spans, bars, last, _, steps = client.predict([], "grpo", 0, [], "step", api_name="/training")
    assert "envace train" in note  # one empty-state rule: what is missing, what makes it, and nothing empty drawn
    assert all(part.get("visible") is False for part in (curves, spans, bars, last, steps))
    note, curves, cells = client.predict(None, "checklist", api_name="/budget_curves")
    assert "envace sweep" in note and curves.get("visible") is False and cells.get("visible") is False
    turns = client.predict("sw-tiny-parallel-1", api_name="/rehearsed_turns")
    budget = turns["headers"].index("budget")
    assert turns["data"] and all(r[budget] == 1 for r in turns["data"])


def test_a_run_stored_before_episodes_kept_their_times_says_so_in_training(tmp_path):
    """The Training tab on the golden store (a training run written by an earlier release, whose episodes have no
    start or end): its curves as ever, no episode timeline, and a note that says why."""
    import shutil

    from workbench import Workbench

    root = tmp_path / "store"
    shutil.copytree(Path(__file__).parent / "fixtures" / "golden" / "store", root)
    assert Workbench(root).episode_spans("cut").empty and not Workbench(root).episodes_by_step("cut").empty
    port = free_port()
    app = serve(root, port=port, block=False)
    try:
        note, curves, _, bars, *_ = Client(f"http://127.0.0.1:{port}/", verbose=False).predict(
            ["cut"], "grpo", 0, [], "step", api_name="/training")
    finally:
        app.close()
    assert "stored no start and end times" in note and "cut" in note
    assert _shown(curves) and bars.get("visible") is False


def _shown(value):
    """A component's value, whether the app returned it bare or as an update that also sets its visibility."""
    if isinstance(value, dict) and value.get("__type__") == "update":
        assert value.get("visible", True), value
        return value.get("value")
    return value


def test_the_app_binds_localhost_only(app_url):
    import psutil  # accelerate's own dependency

    port = int(app_url.rsplit(":", 1)[1].strip("/"))
    outside = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
               if a.family == socket.AF_INET and not a.address.startswith("127.")]
    if not outside:
        pytest.skip("this machine has no network interface besides loopback to probe")
    for address in outside:  # nothing answers on the machine's other interfaces
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex((address, port)) != 0, address


@pytest.mark.heavy
def test_the_inspector_in_a_real_browser(app_url, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    browser.get(app_url + "?run=scripted")
    wait = open_tab(browser, "Inspector")
    # the deep link opened the run: its episodes are listed, best first; the first is open already
    view = (By.ID, "inspector-view")
    wait.until(lambda d: "no structural difference" in d.find_element(*view).text)
    assert "invented_by_rehearser" not in browser.find_element(*view).text
    # click the second (worse) episode: its rehearsals invent a key
    second = (By.CSS_SELECTOR, "#inspector-episodes [data-testid='cell-1-0']")
    wait.until(ec.element_to_be_clickable(second)).click()
    wait.until(lambda d: "invented_by_rehearser" in d.find_element(*view).text)
    text = browser.find_element(*view).text
    assert "real" in text and "rehearsed" in text
    marks = browser.find_elements(By.CSS_SELECTOR, "#inspector-view mark.diff-added")
    assert marks and all(m.is_displayed() for m in marks[:3])
    assert browser.find_elements(By.CSS_SELECTOR, "#inspector-view table.diff")
    # previous / next walk the listed episodes in their order
    browser.find_element(By.ID, "inspector-previous").click()
    wait.until(lambda d: "invented_by_rehearser" not in d.find_element(*view).text)
    browser.find_element(By.ID, "inspector-next").click()
    wait.until(lambda d: "invented_by_rehearser" in d.find_element(*view).text)
    shot = tmp_path / "inspector.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000


@pytest.mark.heavy
def test_links_open_the_tab_of_the_runs_kind_and_name_an_unknown_run(app_url, browser, store):
    """`?run=` opens the tab that shows the run (a training run: Training), `&episode=` that episode in the
    Inspector, and a name the store does not hold says so instead of falling back to another run."""
    from urllib.parse import quote

    from selenium.webdriver.common.by import By

    from workbench import Workbench

    wait = waiting(browser, 60)
    selected = (By.XPATH, "//button[@role='tab' and @aria-selected='true']")
    browser.get(app_url + "?run=trained")
    wait.until(lambda d: "Training" in d.find_element(*selected).text)
    wait.until(lambda d: "trained" in d.find_element(By.ID, "training-runs").text)
    browser.get(app_url + "?run=no-such-run")
    note = (By.ID, "link-note")  # words joined: the run's name is set as code
    wait.until(lambda d: "No run named no-such-run in" in " ".join(d.find_element(*note).text.split()))
    worst = Workbench(store).episodes("scripted", worst_first=True)["episode_id"].iloc[0]
    browser.get(app_url + f"?run=scripted&episode={quote(worst)}")  # quoted: an episode id holds #
    wait.until(lambda d: "Inspector" in d.find_element(*selected).text)
    wait.until(lambda d: "invented_by_rehearser" in d.find_element(By.ID, "inspector-view").text)  # that episode


def edit_launch_form(browser, url: str):
    """The Launch tab on smoke.toml's train job: one folded group per TOML table (the job's own open), widgets by
    type, a value the file sets marked, start disabled while a field is invalid (grpo.lr = -1) and enabled again once
    it checks out (grpo.lr = 0.0005, listed as edited). Returns the start button's locator."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(url)
    open_tab(browser, "Launch")  # smoke.toml, train
    wait = waiting(browser, 60)
    start = (By.ID, "launch-start")
    wait.until(lambda d: d.find_element(*start).is_enabled())  # the file's config checks out
    # one folded group per TOML table, the job's own open; widgets by type, a changed value marked
    groups = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".launch-table button.label-wrap")]
    assert any(g.startswith("[train] ·") for g in groups) and any(g.startswith("[train.rollout] ·") for g in groups)
    for table in ("[train.policy] ·", "[train.grpo] ·"):  # folded: opened as a user opens them
        next(e for e in browser.find_elements(By.CSS_SELECTOR, ".launch-table button.label-wrap")
             if e.text.startswith(table)).click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#launch-train-grpo-lr input"))
    assert browser.find_elements(By.CSS_SELECTOR, "#launch-train-policy-lora input[type=checkbox]")
    assert browser.find_elements(By.CSS_SELECTOR, "#launch-train-grpo-algorithm input")  # a dropdown of its choices
    assert "● steps" in browser.find_element(By.ID, "launch-train-grpo-steps").text  # the file sets 2
    lr = browser.find_element(By.CSS_SELECTOR, "#launch-train-grpo-lr input")
    lr.send_keys(Keys.CONTROL, "a")
    lr.send_keys("-1", Keys.TAB)
    check = (By.ID, "launch-check")
    wait.until(lambda d: "not launchable" in d.find_element(*check).text and "lr" in d.find_element(*check).text)
    assert not browser.find_element(*start).is_enabled()  # no start while the config is invalid
    lr.send_keys(Keys.CONTROL, "a")
    lr.send_keys("0.0005", Keys.TAB)
    wait.until(lambda d: d.find_element(*start).is_enabled())
    changes = " ".join(browser.find_element(By.ID, "launch-changes").text.split())
    assert "grpo.lr = 0.0005 (default 1e-05, edited here)" in changes and "grpo.steps = 2 (default 4)" in changes
    return start


@pytest.mark.heavy
def test_a_run_launched_in_the_browser_fills_the_other_tabs(app_url, browser, store):
    """Launch: fields grouped by table, typed widgets, changed values marked, start disabled while the config does
    not check out; the job it starts writes a run the Runs tab lists."""
    from selenium.webdriver.common.by import By

    from envace.store import get_run

    start = edit_launch_form(browser, app_url)
    browser.find_element(*start).click()
    log = (By.CSS_SELECTOR, "#launch-log textarea")
    waiting(browser, 300).until(lambda d: "saved " in (d.find_element(*log).get_attribute("value") or ""))
    assert "GRPO step 2/2" in browser.find_element(*log).get_attribute("value")
    launched = [p.name for p in store.iterdir() if p.name.startswith("train-")]
    assert len(launched) == 1
    assert get_run(store, launched[0])["config"]["grpo"]["lr"] == 0.0005  # the edit is what the job ran
    # the Runs tab lists it after its next refresh
    open_tab(browser, "Runs")
    waiting(browser, 30).until(lambda d: launched[0] in d.find_element(By.ID, "runs-table").text)


@pytest.mark.heavy
def test_a_suite_run_opens_as_the_papers_table(app_url, browser, store):
    from selenium.webdriver.common.by import By

    from workbench import Workbench

    browser.get(app_url)
    open_tab(browser, "Runs")
    row = list(Workbench(store).runs()["run_id"]).index("paper")  # the table lists runs newest first, as runs()
    cell = (By.CSS_SELECTOR, f"#runs-table [data-testid='cell-{row}-0']")
    waiting(browser, 60).until(lambda d: d.find_elements(*cell) and "paper" in d.find_element(*cell).text)
    browser.find_element(*cell).click()
    table = (By.ID, "suite-table")
    waiting(browser, 60).until(lambda d: d.find_elements(*table) and "EnvACE-8B (published)" in
                                     d.find_element(*table).text)
    text = browser.find_element(*table).text
    assert "this run: paper" in text and "BFCL-v4 (offline overall)" in text and toasts(browser) == []


@pytest.fixture(scope="module")
def real_app_url(real_store):
    port = free_port()
    app = serve(real_store, port=port, block=False)
    yield f"http://127.0.0.1:{port}/"
    app.close()


@pytest.mark.heavy
def test_every_episode_and_every_tab_open_on_the_real_model_store(real_app_url, real_store, browser, tmp_path):
    """The real default model's store in headless Chromium: every kind of episode of every run opens in the
    Inspector (per run, picked in its run menu: the first episode, the first of each phase, the first privately
    rehearsed and the first of a GRPO group: each view the Inspector draws once; every episode's HTML is rendered,
    whole, by test_real_store's test_every_episode_of_every_run_renders; a link to each kind of run lands on its
    tab in test_links_open_the_tab_of_the_runs_kind…) and every tab draws, with no error toast; a screenshot of
    each tab is saved (ENVACE_SCREENSHOTS names the folder, e.g. docs/screenshots)."""
    import os

    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from workbench import Workbench

    shots = Path(os.environ.get("ENVACE_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    wb = Workbench(real_store)
    opened = 0
    rehearsed = {r: set(wb.rehearsed_turns(r)["episode_id"]) for r in wb.runs_with("memories")}
    grpo = {r: set(e.loc[e["phase"] == "grpo", "episode_id"]) for r in wb.runs_with("episodes")
            if len(e := wb.episodes(r))}
    assert rehearsed and grpo.get("train")
    runs = sorted(wb.runs_with("episodes"))
    follow_link(browser, real_app_url, runs[0], landings(real_store)[runs[0]])  # one page load, then the menu
    open_tab(browser, "Inspector")
    menu = (By.CSS_SELECTOR, "#inspector-run input")
    kinds = set()
    for run in runs:
        listed = wb.episodes(run)
        expected = list(listed["episode_id"])
        first_of_phase = {phase: i for i, phase in reversed(list(enumerate(listed["phase"])))}
        rehearsed_rows = [i for i, e in enumerate(expected) if e in rehearsed.get(run, ())]
        grpo_rows = [i for i, e in enumerate(expected) if e in grpo.get(run, ())]
        picked = sorted({0, *first_of_phase.values(), *rehearsed_rows[:1], *grpo_rows[:1]})
        if browser.find_element(*menu).get_attribute("value") != run:  # the run picked as a user picks it
            field = browser.find_element(*menu)
            field.send_keys(Keys.CONTROL, "a")
            field.send_keys(run, Keys.ENTER)
        for i in picked:
            episode = expected[i]
            cell = (By.CSS_SELECTOR, f"#inspector-episodes [data-testid='cell-{i}-0']")

            def listed_row(d, c=cell, want=episode):  # this run's row, not the previous run's still on screen
                found = d.find_elements(*c)
                return found[0] if found and found[0].text == want else None

            # the first run's first row waits for the page's load (its episodes listed from the store) as well
            waiting(browser, 150 if run == runs[0] else 60,
                          ignored_exceptions=[StaleElementReferenceException]).until(
                listed_row, message=f"{run}: row {i} of {len(expected)} is not {episode}; menu "
                f"{browser.find_element(*menu).get_attribute('value')!r}, toasts {toasts(browser)}").click()
            shown = (By.CSS_SELECTOR, f"#inspector-view [data-run='{run}'] [data-episode='{episode}']")
            waiting(browser, 60).until(lambda d, s=shown: d.find_elements(*s), message=f"{run}: {episode} not shown; "
                                       f"toasts {toasts(browser)}")
            assert toasts(browser) == [], (run, episode)
            if episode in rehearsed.get(run, ()):  # what private rehearsal imagined, in its turn
                assert browser.find_elements(By.CSS_SELECTOR, "#inspector-view details.private"), (run, episode)
                kinds.add("rehearsed")
            if episode in grpo.get(run, ()):  # its GRPO group beside it: G = 2 episodes, each with its advantage
                row = (By.CSS_SELECTOR, "#inspector-group [data-testid='cell-1-0']")
                waiting(browser, 60).until(lambda d, r=row: d.find_elements(*r))
                kinds.add("grpo")
            kinds.add(listed["phase"].iloc[i])
            opened += 1
    assert opened >= len(wb.runs_with("episodes")) and {"rehearsed", "grpo"} <= kinds, (opened, kinds)
    shot = shoot(browser, real_app_url, real_store, {"inspector": "demo", "runs": "train", "fidelity": "train",
                                         "private-rehearsal": "sw", "training": "train", "launch": "train"}, shots)
    assert [p.name for p in shot] == [f"{name}.png" for _, name in TABS] and all(p.stat().st_size > 10_000
                                                                               for p in shot)


@pytest.mark.heavy
def test_runs_overlay_and_a_tool_a_step_and_a_rehearsed_turn_open_their_episodes(real_app_url, real_store, browser):
    """Linked views on the real default model's store: Runs shows a kind with its own columns and overlays the
    runs picked in Training; a tool in Fidelity's table, a step in Training's table and a privately rehearsed
    turn each open the Inspector on their episodes, filtered (or on that episode)."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    from workbench import Workbench

    wb = Workbench(real_store)
    wait = waiting(browser, 120, ignored_exceptions=[StaleElementReferenceException])  # tables redraw

    def listed(run: str, expected) -> None:
        """The Inspector is open on `run` and lists exactly the `expected` episodes."""
        want = sorted(expected)
        cells = (By.CSS_SELECTOR, "#inspector-episodes [data-testid^='cell-'][data-testid$='-0']")

        def shown(d):
            return (d.find_element(By.CSS_SELECTOR, "#inspector-run input").get_attribute("value"),
                    sorted(c.text for c in d.find_elements(*cells) if c.text))

        try:
            wait.until(lambda d: shown(d) == (run, want))
        except TimeoutException:
            pytest.fail(f"the Inspector shows {shown(browser)}, not {(run, want)}")

    def click(table: str, row: int, column: int = 0) -> None:
        cell = (By.CSS_SELECTOR, f"#{table} [data-testid='cell-{row}-{column}']")
        wait.until(lambda d: d.find_elements(*cell), message=f"no row {row} in #{table}").__getitem__(0).click()

    browser.get(real_app_url)  # Runs: search, a kind's own columns, a config diff; runs picked → overlaid
    first = (By.CSS_SELECTOR, "#runs-table [data-testid^='cell-'][data-testid$='-0']")
    wait.until(lambda d: len(d.find_elements(*first)) == len(wb.runs()))
    browser.find_element(By.CSS_SELECTOR, "#runs-search input, #runs-search textarea").send_keys("WORLD")
    wait.until(lambda d: [c.text for c in d.find_elements(*first)] == ["world-model"])
    browser.find_element(By.CSS_SELECTOR, "#runs-search input, #runs-search textarea").clear()
    kind = (By.XPATH, "//*[@id='runs-kind']//label[normalize-space()='train']")
    wait.until(lambda d: d.find_elements(*kind)).__getitem__(0).click()
    header = (By.CSS_SELECTOR, "#runs-table [data-testid^='header-']")
    wait.until(lambda d: [h.text for h in d.find_elements(*header)] == KIND_COLUMNS["train"])
    picker = browser.find_element(By.CSS_SELECTOR, "#runs-compare input")
    for run in ("demo", "train"):
        picker.send_keys(run)
        picker.send_keys(Keys.ENTER)
    differ = (By.CSS_SELECTOR, "#runs-config-diff [data-testid^='header-']")
    wait.until(lambda d: [h.text for h in d.find_elements(*differ)] == ["field", "demo", "train"])
    browser.find_element(By.ID, "runs-overlay").click()  # the training runs among them, in Training
    wait.until(lambda d: "Training" in d.find_element(By.CSS_SELECTOR, "button[role='tab'][aria-selected='true']")
               .text and "train" in d.find_element(By.ID, "training-runs").text)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#training-steps [data-testid='cell-0-0']"))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#training-episodes .js-plotly-plot"),
               message="no episode timeline in Training")  # the default model's episodes on the wall clock
    browser.find_element(By.XPATH, "//*[@id='training-x']//label[normalize-space()='tokens']").click()
    wait.until(lambda d: "tokens trained on" in d.find_element(By.ID, "training-curves").text)
    def only_loss(d) -> bool:
        """The metric picker: only the one picked is drawn (picked again if a redraw swallowed the keys)."""
        curves = d.find_element(By.ID, "training-curves").text
        if "policy loss" in curves and "entropy" not in curves:
            return True
        if "loss" not in d.find_element(By.ID, "training-metrics").text:
            picker = d.find_element(By.CSS_SELECTOR, "#training-metrics input")
            picker.send_keys("loss")
            picker.send_keys(Keys.ENTER)
        return False

    WebDriverWait(browser, 120, poll_frequency=2, ignored_exceptions=[StaleElementReferenceException]).until(only_loss)

    edit_launch_form(browser, real_app_url)  # Launch's form on this store (not started: the store stays as is)

    follow_link(browser, real_app_url, "demo", "inspector")  # a tool of the per-tool table → its episodes
    open_tab(browser, "Fidelity")
    tools = wb.fidelity_by_tool("demo")
    row = next(i for i, t in enumerate(tools["tool"]) if t != "all")
    rows = (By.CSS_SELECTOR, "#fidelity-tools [data-testid^='cell-'][data-testid$='-0']")
    try:
        wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#fidelity-run input").get_attribute("value") == "demo"
                   and [c.text for c in d.find_elements(*rows)] == list(tools["tool"]))
    except TimeoutException:
        pytest.fail(f"Fidelity on {browser.find_element(By.CSS_SELECTOR, '#fidelity-run input').get_attribute('value')}"
                    f" lists {[c.text for c in browser.find_elements(*rows)]}, not {list(tools['tool'])}")
    click("fidelity-tools", row)
    listed("demo", wb.episodes("demo", tool=tools["tool"].iloc[row])["episode_id"])
    step = (By.CSS_SELECTOR, "#inspector-step input, #inspector-step textarea")
    assert browser.find_element(*step).get_attribute("value") == ""  # no step filter

    follow_link(browser, real_app_url, "train", "training")  # a GRPO step → its groups' episodes
    click("training-steps", 0)
    listed("train", wb.episodes("train", phase="grpo", step=0)["episode_id"])
    assert browser.find_element(*step).get_attribute("value") == "0"

    run = sorted(wb.runs_with("memories"))[0]  # a privately rehearsed turn → its episode, open
    episode = wb.rehearsed_turns(run)["episode_id"].iloc[0]
    follow_link(browser, real_app_url, run, "rehearsal")
    click("rehearsal-turns", 0)
    button = (By.ID, "rehearsal-inspect")
    wait.until(lambda d: any(b.is_displayed() for b in d.find_elements(*button)))
    browser.find_element(*button).click()
    shown = (By.CSS_SELECTOR, f"#inspector-view [data-episode='{episode}'] details.private")
    wait.until(lambda d: d.find_elements(*shown), message=f"{run}: episode {episode} not opened with its rehearsal")
    assert toasts(browser) == []


def test_screenshots_take_the_newest_complete_demo_and_say_when_there_is_none(tmp_path, capsys):
    from apps import screenshots
    from envace.store import Run

    assert screenshots.main(["--root", str(tmp_path), "--out", str(tmp_path / "shots")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run `make demo` first" in err[0] and not (tmp_path / "shots").exists()
    for stamp, trained in (("20261201-100000", "completed"), ("20261202-100000", "completed"),
                           ("20261203-100000", "interrupted")):  # the newest demo stopped in its training
        for name in (f"demo-{stamp}", f"demo-private-{stamp}", f"demo-train-{stamp}"):
            Run.create(tmp_path, "rollout", {}, "default", name).update(
                status=trained if "train" in name else "completed")
    runs = screenshots.demo_runs(tmp_path)
    assert runs["training"] == "demo-train-20261202-100000" and runs["inspector"] == "demo-20261202-100000"
    assert set(runs) == {name for _, name in screenshots.TABS}


def test_pageload_times_each_runs_link_and_refuses_bad_input(store, browser, tmp_path, capsys):
    """`python -m apps.pageload` (docs/benchmarks.md): a time per link opened, the medians, the browser's CPU
    on each tab while the timer ticks; bad input one line."""
    from apps import pageload

    assert pageload.main(["--root", str(store), "--repeat", "1", "--limit", "1", "--idle", "0.3"]) == 0
    out = capsys.readouterr().out.splitlines()
    *lines, median = [line for line in out if " link " in line]  # not Gradio's
    assert len(lines) == 1 and float(lines[0].split("link")[1].split()[0]) > 0
    assert median.startswith("median over 1: link ")
    idle = [line for line in out if line.startswith("idle on ")]
    assert [line.split()[2] for line in idle] == ["Inspector", "Runs", "Fidelity", "Private", "Training", "Launch"]
    assert all(float(line.split("browser")[1].split()[0]) >= 0 for line in idle)
    for argv in (["--root", str(store), "--repeat", "0"], ["--root", str(tmp_path)], ["--root", str(store),
                 "--idle", "-1"]):
        assert pageload.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: "), err


@pytest.mark.parametrize("name", ["../../escaped", "{tmp}/absolute", "nested/$(x)", "a..b"])
def test_the_launch_tab_checks_the_run_name_before_writing_anything(app_url, store, tmp_path, name):
    name = name.format(tmp=tmp_path)
    logs = store / ".logs"
    before = sorted(logs.rglob("*")) if logs.exists() else []
    client = Client(app_url, verbose=False)
    with pytest.raises(Exception, match="invalid run name"):
        client.predict("experiments/smoke.toml", "rollout", name, api_name="/start_job")
    assert (sorted(logs.rglob("*")) if logs.exists() else []) == before  # no config written, no folder made
    assert not list(tmp_path.iterdir()) and not list(store.parent.glob("escaped*"))  # nor outside the store


def test_each_timer_of_the_app_runs_one_event_a_tick_without_a_spinner(tmp_path):
    """Every event redraws the page's status in the browser: seven views listening to the store's 5 s timer kept
    headless Chromium at ~0.5 core on an idle Launch tab, and a job launched from it ran 3× slower on two cores
    (`docs/benchmarks.md`). Each timer now drives one event (`apps.ticks.Ticks`), without a progress spinner."""
    import gradio as gr

    from apps.app import build

    app = build(tmp_path)
    timers = [b for b in app.blocks.values() if isinstance(b, gr.Timer)]
    assert len(timers) == 2  # the store's, and the Launch tab's while a job starts or stops
    for timer in timers:
        [event] = [f for f in app.fns.values() if (timer._id, "tick") in f.targets]
        assert event.show_progress == "hidden"


def test_a_view_that_fails_on_the_tick_leaves_the_others_updating():
    import gradio as gr

    from apps.ticks import Ticks

    requests = []

    def second(text, other, request: gr.Request):
        requests.append(request)
        return text.upper(), other + "!"

    with gr.Blocks() as app:
        ticks = Ticks(5.0)
        a, b, c = gr.Textbox("a"), gr.Textbox("b"), gr.Textbox("c")
        ticks.add(lambda text: 1 / 0, a, a)
        ticks.add(second, [b, a], [b, c])
        ticks.wire()
    [event] = [f for f in app.fns.values() if (ticks.timer._id, "tick") in f.targets]
    with pytest.warns(UserWarning, match="division by zero"):
        out = event.fn("the request", "a", "b")  # the request first, then each input once: a, b
    assert out[0] == gr.skip() and out[1:] == ["B", "a!"] and requests == ["the request"]


@pytest.mark.heavy
def test_a_tick_that_finds_nothing_new_runs_no_other_event(app_url, browser, monkeypatch):
    """Sending a multiselect picker the same runs fired its `.change` in the browser: every tick redrew the
    Training tab's curves (their zoom reset every 5 s) and the Runs tab's config diff. Idle on Training with a run
    picked, two ticks run and nothing else."""
    import collections
    import time

    import gradio.blocks

    ran, process = collections.Counter(), gradio.blocks.Blocks.process_api

    async def counted(self, block_fn, *args, **kwargs):
        ran[getattr(block_fn, "name", None) or str(block_fn)] += 1
        return await process(self, block_fn, *args, **kwargs)

    browser.get(app_url)
    open_tab(browser, "Training")
    time.sleep(3)  # the tab's first draw done
    monkeypatch.setattr(gradio.blocks.Blocks, "process_api", counted)
    deadline = time.time() + 30
    while ran["tick"] < 2 and time.time() < deadline:  # two ticks of the store's 5 s timer
        time.sleep(0.1)
    time.sleep(1)  # what the first tick set off has had its ~5 s to reach the server, the second its 1 s
    assert ran["tick"] >= 2 and set(ran) == {"tick"}, ran


def test_a_links_page_load_draws_each_chart_tab_once(app_url, browser, monkeypatch):
    """Each chart tab was drawn twice per page load, once chained after the load filled its picker and once by
    the picker's `.change` (a link's page load measured 1.4x slower for it). Once now, whether the load moves
    the pick (`?run=trained`: Fidelity's picker to that run) or not (`?run=sw`, no pairs: Fidelity stays on all
    runs). The tab the link opens is left out: opening it redraws it, as opening any tab does."""
    import collections
    import time

    from workbench import Workbench

    drawn = collections.Counter()

    def counted(name):
        method = getattr(Workbench, name)

        def call(self, *args, **kwargs):
            drawn[name] += 1
            return method(self, *args, **kwargs)
        return call

    draws = {"fidelity_by_tool": "Fidelity", "training": "Training", "sweep": "Private rehearsal"}  # one call a draw
    for name in draws:
        monkeypatch.setattr(Workbench, name, counted(name))
    for link, opens in (("trained", "Training"), ("sw", "Private rehearsal")):
        drawn.clear()
        browser.get(f"{app_url}?run={link}")
        deadline = time.time() + 60
        while any(drawn[n] == 0 for n in draws) and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(3)  # a second draw would have come by now (no run here is running: no tick redraws one)
        assert {n: drawn[n] for n, tab in draws.items() if tab != opens} == {
            n: 1 for n, tab in draws.items() if tab != opens}, (link, drawn)
        assert drawn[next(n for n, tab in draws.items() if tab == opens)] >= 1, (link, drawn)  # and drawn


def test_a_picker_is_sent_only_when_its_runs_or_its_pick_changed():
    import gradio as gr
    import pandas as pd

    from apps.common import kept_unless_changed, skipped

    skip = (gr.skip(), gr.skip())
    assert skipped(gr.skip()) and not skipped(["a"]) and not skipped(pd.DataFrame({"a": [1]})) and not skipped({})
    assert kept_unless_changed(["a", "b"], ["b"], ["a", "b"], multiselect=True) == skip
    assert kept_unless_changed(["a", "b"], [], ["a", "b"], multiselect=True, pick_first=False) == skip
    update, known = kept_unless_changed(["c", "a", "b"], ["b"], ["a", "b"], multiselect=True)  # a new run: sent
    assert ([c[0] for c in update.choices], update.value, known) == (["c", "a", "b"], ["b"], ["c", "a", "b"])
    update, _ = kept_unless_changed(["a"], ["b"], ["a", "b"], multiselect=True)  # the pick is gone: the newest
    assert update.value == ["a"]
    assert kept_unless_changed(["a", "b"], "b", ["a", "b"]) == skip  # one pick: a tick never sends it back
    update, known = kept_unless_changed(["a", "b"], "c", ["a", "b"])
    assert update.value == "a" and known == ["a", "b"]
