"""docs/commands.md and docs/layout.md are what `make docs` writes from the parser and the tree: regenerated here
into a temporary folder, they must equal the committed pages."""

from pathlib import Path

import pytest

from envace.cli import docs

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("page", ["commands.md", "layout.md"])
def test_the_generated_pages_are_up_to_date(tmp_path, page):
    docs.write(tmp_path)
    fresh, committed = (tmp_path / page).read_text(encoding="utf-8"), (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert fresh == committed, f"docs/{page} is not what the code says now: run `make docs`"


def test_every_command_and_subcommand_has_its_section():
    page = docs.commands_page()
    for command in ("rollout", "train", "check-env", "bench", "bench rollout", "bench store"):
        assert f"### envace {command}\n" in page or f"#### envace {command}\n" in page, command
    assert "| `--limit LIMIT` | BFCL test episodes (= batch size) (default: 2) |" in page
    assert "## Modes" in page and "## Fidelity columns" in page  # the hand-written sections other pages link to


def test_the_layout_names_every_module_with_its_summary(tmp_path):
    package = tmp_path / "envace"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text('"""The core."""\n')
    (package / "sub" / "__init__.py").write_text('"""A package whose summary\nwraps. And goes on."""\n')
    (package / "sub" / "mod.py").write_text('"""One module, e.g. this one."""\n')
    (package / "data").mkdir()  # no Python below it: not listed
    (package / "data" / "x.toml").write_text("")
    for layer in ("workbench", "apps"):
        (tmp_path / layer).mkdir()
    page = docs.layout_page(tmp_path)
    assert ("- `envace/` — The core.\n"
            "  - `sub/` — A package whose summary wraps.\n"
            "    - `mod.py` — One module, e.g. this one.\n") in page
    assert "data/" not in page.split("Beside the code")[0]
