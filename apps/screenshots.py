"""Every tab of the app, photographed in headless Debian Chromium: `make screenshots` takes them on the newest
`make demo` result for docs/screenshots (`python -m apps.screenshots --root runs --out docs/screenshots`), and
the app's browser test takes them on the store the default model writes.
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
from contextlib import contextmanager
from pathlib import Path

from envace.errors import UsageError, run_main
from envace.store import list_runs

CHROMIUM, DRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
# (the tab's label, the screenshot's name): the Inspector opens the run's first episode
TABS = (("Inspector", "inspector"), ("Runs", "runs"), ("Fidelity", "fidelity"),
        ("Private rehearsal", "private-rehearsal"), ("Training", "training"), ("Launch", "launch"))


POLL_S = 0.1  # how often a wait looks at the page again (selenium's 0.5 s default rounds every wait up to it)


def waiting(driver, timeout: float, **kw):
    """A `WebDriverWait` on `driver` that polls every `POLL_S` seconds."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=POLL_S, **kw)


def chromium(profile: Path):
    """Headless Debian chromium driven by selenium (never a downloaded browser)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (CHROMIUM.exists() and DRIVER.exists()):
        raise UsageError(f"{CHROMIUM} or {DRIVER} is missing (`make browser` installs Debian's chromium)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", f"--user-data-dir={profile}", "--window-size=1400,2000"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(str(DRIVER)), options=options)


def open_tab(driver, name: str):
    """Click the tab labelled `name`; the wait, for what follows."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    wait = waiting(driver, 60)
    wait.until(ec.element_to_be_clickable((By.XPATH, f"//button[@role='tab' and contains(., '{name}')]"))).click()
    return wait


LABELS = {"runs": "Runs", "inspector": "Inspector", "fidelity": "Fidelity", "rehearsal": "Private rehearsal",
          "training": "Training", "launch": "Launch"}  # the app's tab ids → their labels


def follow_link(driver, url: str, run: str, lands: str, timeout: float = 150) -> None:
    """Open `url?run=RUN` and wait until the app has switched to the run's own tab (`lands`, a tab id from
    `apps.app.tab_of`): the link switches tabs once the page has loaded, which would undo a tab clicked before."""
    from urllib.parse import quote

    from selenium.webdriver.common.by import By

    driver.get(url + f"?run={quote(run)}")
    selected = (By.CSS_SELECTOR, "button[role='tab'][aria-selected='true']")
    waiting(driver, timeout).until(lambda d: [t.text for t in d.find_elements(*selected)] == [LABELS[lands]],
                                   message=f"?run={run} did not land on {LABELS[lands]}")


def landings(root: str | Path) -> dict[str, str]:
    """Each run of the store → the tab a link to it opens."""
    from apps.app import tab_of
    from workbench import Workbench

    wb = Workbench(root)
    return {r: tab_of(wb, r, k) for r, k in zip(wb.runs()["run_id"], wb.runs()["kind"], strict=True)}


def toasts(driver) -> list[str]:
    """The error toasts on the page."""
    from selenium.webdriver.common.by import By

    return [t.text for t in driver.find_elements(By.CSS_SELECTOR, "[data-testid='toast-body'], .toast-body")]


def shoot(driver, url: str, root: str | Path, runs: dict[str, str], out: Path) -> list[Path]:
    """A screenshot of each tab of `TABS` opened on its run (`runs`: screenshot name → run id of the store at
    `root`) into `out`, once the tab has drawn (plots too); a tab that shows an error toast is a RuntimeError."""
    from selenium.webdriver.common.by import By

    out.mkdir(parents=True, exist_ok=True)
    saved, lands = [], landings(root)
    for tab, name in TABS:
        follow_link(driver, url, runs[name], lands[runs[name]])
        open_tab(driver, tab)
        wait = waiting(driver, 60)
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, ".pending, .generating"))
        if tab == "Inspector":
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#inspector-view [data-episode]"))
        if tab in ("Fidelity", "Training"):  # plots drawn on first open, without picking anything
            wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot"),
                       message=f"no plot in {tab}: " + driver.find_element(By.TAG_NAME, "body").text[:600])
        if toasts(driver):
            raise RuntimeError(f"{tab} on {runs[name]}: {toasts(driver)}")
        driver.save_screenshot(str(out / f"{name}.png"))
        saved.append(out / f"{name}.png")
    return saved


def demo_runs(root: str | Path) -> dict[str, str]:
    """The newest completed `make demo` result under `root`: each screenshot's run (the rollout for the
    Inspector, Runs, Fidelity and Launch; its private-rehearsal evaluation; its training run)."""
    runs = {r["run_id"]: r for r in list_runs(root)}
    stamps = sorted(m[1] for r in runs if (m := re.fullmatch(r"demo-(\d{8}-\d{6})", r)))
    for stamp in reversed(stamps):
        chosen = {"rollout": f"demo-{stamp}", "private": f"demo-private-{stamp}", "train": f"demo-train-{stamp}"}
        if all(runs.get(r, {}).get("status") == "completed" for r in chosen.values()):
            return {"inspector": chosen["rollout"], "runs": chosen["rollout"], "fidelity": chosen["rollout"],
                    "private-rehearsal": chosen["private"], "training": chosen["train"], "launch": chosen["rollout"]}
    raise UsageError(f"no completed `make demo` result in {root}: run `make demo` first")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="runs")
    parser.add_argument("--out", default="docs/screenshots")
    args = parser.parse_args(argv)
    return run_main(lambda: _shoot_demo(args.root, Path(args.out)))


@contextmanager
def served(root: str | Path):
    """(url, driver): the app on `root`, served on a free port for the purpose, and a headless browser."""
    import tempfile

    from apps.app import serve

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = serve(root, port=port, block=False)
    try:
        with tempfile.TemporaryDirectory() as profile:
            driver = chromium(Path(profile))
            try:
                yield f"http://127.0.0.1:{port}/", driver
            finally:
                driver.quit()
    finally:
        app.close()


def _shoot_demo(root: str, out: Path) -> int:
    """Every tab on the newest demo result."""
    runs = demo_runs(root)
    with served(root) as (url, driver):
        for path in shoot(driver, url, root, runs, out):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
