"""docs/config-keys.md, the reference of every config key, is what the YAML files of conf/ say
(each key as the command line sets it, its shipped value, the comment beside or above it): a key
added or changed there without the reference rebuilt fails here. `python tests/test_config_keys.py`
rebuilds it."""

from __future__ import annotations

import re
import sys

from helpers import ROOT

CONF = ROOT / "conf"
DOC = ROOT / "docs" / "config-keys.md"
KEY = re.compile(
    r"^(?P<indent> *)(?P<key>[\w@./-]+):(?: (?P<value>[^#]*?))?\s*(?:#\s?(?P<note>.*))?$"
)
OPTIONS_ONLY = ("experiment", "debug", "hparams_search", "dataset")  # overrides of other keys
SKIP = ("_target_", "_partial_", "_recursive_", "defaults")
HEAD = """# Configuration keys

Every key of the shipped configs (`conf/`), with its shipped value and what it does, file by
file. Each key is named as the command line sets it, `key=value` (`data.batch_size=64`; the
`schedule` group's keys are the trainer's: `trainer.max_steps=5`), a group's option as
`group=option` (`data=corpus`); `python train.py --cfg job` (or `finetune.py`) prints the
whole composed config a command would run, and a misspelt key is refused in one line naming it.
An option's file derives from the files its `defaults` name (`_corpus.yaml` for the file-based
data options, `_bert_defaults.yaml` for the model sizes): a key missing from an option's table
has the value of the file it derives from. The groups `experiment`, `debug`, `hparams_search`
and `dataset` set keys of the others; their tables list the options and what each is for.
"""


def description(lines: list[str]) -> str:
    """A file's first comment paragraph, as one line."""
    out = []
    for line in lines:
        if not line.startswith("#"):
            break
        out.append(line.lstrip("#").strip())
    text = " ".join(x for x in out if x and not x.startswith("@package"))
    return text.replace("|", "\\|")


def package(lines: list[str], group: str) -> tuple[str, ...]:
    """Where a group's file puts its keys: its `# @package` line's (`_global_`: the top), else
    the group's own name."""
    for line in lines:
        if line.startswith("# @package "):
            name = line.split()[-1]
            return () if name == "_global_" else tuple(name.split("."))
    return (group,)


def keys(lines: list[str], under: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    """(dotted key, shipped value, comment) of each key of a YAML file whose keys are `under`
    a package (a group's file); a mapping's key has the value "" and is followed by its own
    keys."""
    out, stack, above, noted = [], [], [], False
    start = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
    for line in lines[start:]:  # after the file's description
        if not line.strip():
            above, noted = [], False
            continue
        if line.lstrip().startswith("#"):
            text = line.strip().lstrip("#").strip()
            if noted and text[:1].islower():  # the comment beside the key above, continued
                k, v, n = out[-1]
                out[-1] = (k, v, f"{n} {text}")
            else:
                above.append(text.replace("|", "\\|"))
                noted = False
            continue
        m = KEY.match(line)
        noted = False
        if m is None:  # a list item or a continued value
            above = []
            continue
        depth = len(m["indent"]) // 2
        stack = stack[:depth] + [m["key"]]
        value, note = (m["value"] or "").strip(), " ".join([*above, m["note"] or ""]).strip()
        above = []
        if stack[0] in SKIP or stack[0] == "hydra" or m["key"] in SKIP:
            continue
        out.append((".".join([*under, *stack]), value, note.replace("|", "\\|")))
        noted = bool(m["note"])
    return out


def cell(value: str) -> str:
    return f"`{value}`" if value else ""


def reference() -> str:
    parts = [HEAD]
    for top in ("train", "finetune"):
        lines = (CONF / f"{top}.yaml").read_text().splitlines()
        parts.append(f"## `{top}.py` (conf/{top}.yaml)\n\n{description(lines)}\n")
        parts.append(table(keys(lines)))
    for group in sorted(p for p in CONF.iterdir() if p.is_dir()):
        files = sorted(group.rglob("*.yaml"))
        options = [f for f in files if not f.name.startswith("_")]
        parts.append(f"## `{group.name}`\n")
        rows = ["| option | what it is |", "|---|---|"]
        for f in options:
            name = f.relative_to(group).with_suffix("").as_posix()
            rows.append(f"| `{name}` | {description(f.read_text().splitlines())} |")
        parts.append("\n".join(rows) + "\n")
        if group.name in OPTIONS_ONLY:
            continue
        for f in files:
            lines = f.read_text().splitlines()
            found = keys(lines, package(lines, group.name))
            if found:
                about = description(lines)
                parts.append(f"### conf/{f.relative_to(CONF).as_posix()}\n")
                parts.append((f"{about}\n\n" if about else "") + table(found))
    return "\n".join(parts)


def table(found: list[tuple[str, str, str]]) -> str:
    rows = ["| key | shipped value | |", "|---|---|---|"]
    rows += [f"| `{k}` | {cell(v)} | {n} |" for k, v, n in found]
    return "\n".join(rows) + "\n"


def test_the_reference_is_what_the_configs_say():
    assert DOC.read_text() == reference(), "docs/config-keys.md: python tests/test_config_keys.py"


def test_every_key_a_run_reads_is_in_the_reference():
    """The keys of the composed default configs (the groups' shipped choices) are each in it."""
    from omegaconf import OmegaConf

    from bert_lightning.config import compose

    text = DOC.read_text()
    for top in ("train", "finetune"):
        extra = ["task.train_file=x"] if top == "finetune" else []
        cfg = OmegaConf.to_container(compose(top, ["paths.output_dir=.", *extra]))
        missing = [k for k in flat(cfg) if k.rsplit(".", 1)[-1] not in SKIP and not listed(k, text)]
        assert not missing, f"{top}: {missing}"


def listed(key: str, text: str) -> bool:
    """`key` is in `text`, or a mapping above it is, with a flow-style value (`{a: 1}`) that
    holds it."""
    parts = key.split(".")
    if f"| `{key}` |" in text:
        return True
    heads = [".".join(parts[:n]) for n in range(1, len(parts))]
    return any(f"| `{h}` | `{{" in text for h in heads)


def flat(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out += flat(v, key + ".")
        elif not isinstance(v, list | dict):
            out.append(key)
    return out


if __name__ == "__main__":
    DOC.write_text(reference())
    sys.exit(0)
