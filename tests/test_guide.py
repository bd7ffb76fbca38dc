"""docs/guide/ is task-first and holds no measurement: no dated figure and no table column of
measured figures on any page (they live in the results pages, which the guide links); the index
and README's Guide section name every page; each task page has the same parts."""

from __future__ import annotations

import re

import pytest

from helpers import ROOT

GUIDE = ROOT / "docs" / "guide"
PAGES = sorted(p for p in GUIDE.glob("*.md") if p.name != "README.md")
PARTS = ("## What to expect", "## Keys that matter", "## Reference")
MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
DATE = re.compile(
    rf"\b(?:19|20)\d\d[-/.](?:0?[1-9]|1[0-2])[-/.]\d\d?\b"  # 2026-12-02
    rf"|\b\d\d?[-/.](?:0?[1-9]|1[0-2])[-/.](?:19|20)\d\d\b"  # 02.12.2026
    rf"|\b(?:{MONTHS})[a-z]*\.? (?:\d\d?, )?(?:19|20)\d\d\b"  # December 2026, Dec 2, 2026
    rf"|\b\d\d? (?:{MONTHS})[a-z]* (?:19|20)\d\d\b"  # 2 December 2026
)
# a figure: a decimal, a ratio (2.6x), a share (43%), a spread (±), a time or rate with its unit,
# or a bare count; code spans (`1e-3`, `--top-k 5`) are settings, not figures
FIGURE = re.compile(r"\d\.\d|\d\s*x\b|\d\s*%|±|\d\s*(?:ms|s|min|h|/s)\b|^\W*\d[\d,]*\W*$")


def dates(text: str) -> list[str]:
    return [m.group(0) for m in DATE.finditer(text)]


def tables(text: str) -> list[list[list[str]]]:
    """The Markdown tables outside code blocks, each as its body rows' cells."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    found, rows = [], []
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if len(rows) >= 2 and set("".join(rows[1])) <= set("-: "):
            found.append(rows[2:])  # header and separator rows left out
        rows = []
    return found


def is_figure(cell: str) -> bool:
    prose = re.sub(r"`[^`]*`", "", cell).replace("*", "").strip()
    return bool(prose) and bool(FIGURE.search(prose))


def measured_columns(text: str) -> list[list[str]]:
    """Columns of a table whose every filled body cell is a figure: a table of measurements."""
    found = []
    for body in tables(text):
        width = max((len(r) for r in body), default=0)
        for c in range(width):
            cells = [r[c] for r in body if c < len(r) and r[c]]
            if cells and all(is_figure(x) for x in cells):
                found.append(cells)
    return found


@pytest.mark.parametrize("page", sorted(GUIDE.glob("*.md")), ids=lambda p: p.name)
def test_no_dated_measurement_on_a_guide_page(page):
    text = page.read_text()
    assert not dates(text), f"{page.name}: a date {dates(text)}: link a results page instead"
    columns = measured_columns(text)
    assert not columns, f"{page.name}: measured figures {columns[0]}: link a results page instead"


def test_the_checks_catch_a_pasted_measurement():
    """README's and the results pages' tables, pasted into a guide page, fail the test above."""
    readme = (ROOT / "README.md").read_text()
    dated = [t for t in tables(readme) if any(dates(" ".join(r)) for r in t)]
    assert dated, "README has a dated table to paste"
    for name in ("finetuning-results.md", "serving-results.md", "downstream.md"):
        assert measured_columns((ROOT / "docs" / name).read_text()), name
    pasted = "| machine, date | tokens/s |\n|---|---|\n| CPU, 2 cores | 41,230 |\n| GPU | 1.19M |\n"
    assert measured_columns(pasted)
    assert dates("measured 2026-12-02 on 2 cores") and dates("in December 2026")
    keys = "| key | what |\n|---|---|\n| `optim.lr` | the rate, `3e-5` by default |\n"
    assert not measured_columns(keys) and not dates("Gururangan et al. 2020; Kaggle 2016")


def test_the_index_and_readme_name_every_page():
    index = (GUIDE / "README.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for page in PAGES:
        assert f"]({page.name})" in index, f"docs/guide/README.md: no link to {page.name}"
        assert f"](docs/guide/{page.name})" in readme, f"README.md: no link to {page.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_task_page_has_its_parts(page):
    text = page.read_text()
    assert text.startswith("# ") and "What this is for:" in text, page.name
    for part in PARTS:
        assert f"\n{part}\n" in text, f"{page.name}: no '{part}'"
    reference = text[text.index("## Reference") :]
    assert re.search(r"\]\(\.\./[\w-]+\.md", reference), f"{page.name}: no reference page linked"
