"""Every relative link of README.md, docs/ and docs/guide/ reaches a file of the repository
and, where it names one, a heading of that file (GitHub's anchors: the heading lowercased,
punctuation but `-` and `_` dropped, spaces as `-`); README's lists of options name the options
there are."""

from __future__ import annotations

import re

import pytest

from helpers import ROOT

DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "guide").glob("*.md")),  # the guide's pages
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (code blocks' `#` lines are not)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    heads = re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def links() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if not re.match(r"[a-z]+:", target):  # http(s):, mailto:
                found.append((doc.relative_to(ROOT).as_posix(), target))
    return found


def test_the_docs_have_links():
    assert len(links()) > 20
    guide = [t for d, t in links() if d.startswith("docs/guide/")]
    assert len(guide) > 20 and any(t.startswith("../") for t in guide)


@pytest.mark.parametrize(("doc", "target"), links())
def test_a_relative_link_reaches_its_file_and_heading(doc, target):
    path, _, anchor = target.partition("#")
    file = (ROOT / doc).parent / path if path else ROOT / doc
    assert file.exists(), f"{doc}: {target}: no such file"
    if anchor:
        assert anchor in anchors(file.read_text()), f"{doc}: {target}: no such heading"


def test_anchors_are_githubs():
    text = "# Fine-tuning and inference\n## The order (ad relevance)\n```\n# not a heading\n```\n"
    assert anchors(text) == {"fine-tuning-and-inference", "the-order-ad-relevance"}


def test_readmes_experiment_list_is_conf_experiment():
    """README's `experiment` row (train.py's groups) names every train.py experiment of
    conf/experiment/ and no other; finetune.py's (their command is `python finetune.py`) are
    not train.py options."""
    row = next(
        r for r in (ROOT / "README.md").read_text().splitlines() if r.startswith("| `experiment` |")
    )
    listed = re.findall(r"`(\w+)`", row.split("|")[2])
    shipped = sorted(
        p.stem
        for p in (ROOT / "conf" / "experiment").glob("*.yaml")
        if "python finetune.py" not in p.read_text()
    )
    assert sorted(listed) == shipped and len(listed) == len(set(listed))
