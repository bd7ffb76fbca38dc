"""Writes docker/constraints.txt: the version installed here of every distribution that the
images' `pip install ".[EXTRAS]"` pulls, so that an image gets what the tests ran with. Run it in
the environment the tests pass in, from the repository root:

    python docker/constraints.py            # rewrite docker/constraints.txt
    python docker/constraints.py --check    # exit 1 if the file is not what it would write

To move the pins forward: `pip install -U -e ".[test]"` (without `-c`), run the tests, then
rewrite the file. An environment made with `-c docker/constraints.txt` has the pinned versions.

The list is the closure of pyproject.toml's dependencies and the extras the Dockerfiles install,
read from this environment's metadata (importlib.metadata), with markers evaluated here (Linux,
the Python of the images). torch and what only torch requires are left out: the CUDA image's
base brings its own torch, the CPU image installs its pinned CPU build first.
tests/test_docker.py fails when the file and the environment disagree."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = [ROOT / "docker/Dockerfile", ROOT / "docker/Dockerfile.cpu"]
CONSTRAINTS = ROOT / "docker/constraints.txt"
EXCLUDED = {"torch"}  # the image provides it (see the module's docstring)
HEADER = """\
# Written by `python docker/constraints.py` (do not edit): the versions the tests ran with of
# everything `pip install ".[{extras}]"` pulls, torch excluded. The Dockerfiles install with
# `-c` this file; tests/test_docker.py fails when it is stale.
"""


def image_extras(dockerfile: Path) -> list[str]:
    """The extras of the project that a Dockerfile installs: its `pip install ... ".[a,b]"`."""
    found = re.findall(r"pip install [^\n]*\"[^\"\s]*\[([\w,-]+)\]\"", dockerfile.read_text())
    if len(found) != 1:
        raise ValueError(f"{dockerfile}: expected one pip install of the project with extras")
    return sorted(found[0].split(","))


def project_requirements(extras: list[str]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def closure(requirements: list[Requirement]) -> dict[str, metadata.Distribution]:
    """Every installed distribution these requirements pull, by canonical name, the EXCLUDED
    ones and their own requirements aside. Raises if one (EXCLUDED ones too) is missing or at a
    version outside a requirement's range: the pins, with this torch, are consistent."""
    found: dict[str, metadata.Distribution] = {}
    extras_seen: dict[str, set[str]] = {}
    todo = [(req, "pyproject.toml") for req in requirements]
    while todo:
        req, by = todo.pop()
        name = canonicalize_name(req.name)
        try:
            dist = found.get(name) or metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{req} (required by {by}) is not installed here") from None
        if not req.specifier.contains(dist.version, prereleases=True):
            raise SystemExit(f"{by} requires {req}, {dist.version} is installed here")
        if name in EXCLUDED:  # its version checked against every requirement, no further
            continue
        first = name not in found
        new = {canonicalize_name(e) for e in req.extras} - extras_seen.get(name, set())
        if not first and not new:
            continue
        found[name] = dist
        extras_seen.setdefault(name, set()).update(new)
        wanted = [""] * first + sorted(new)  # "": the requirements without an extra
        for line in dist.requires or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in wanted):
                todo.append((sub, dist.metadata["Name"]))
    return found


def render() -> str:
    per_file = {path.name: image_extras(path) for path in DOCKERFILES}
    if len({tuple(e) for e in per_file.values()}) != 1:
        raise SystemExit(f"the Dockerfiles install different extras: {per_file}")
    extras = next(iter(per_file.values()))
    dists = closure(project_requirements(extras))
    pins = [f"{dists[n].metadata['Name']}=={dists[n].version}" for n in sorted(dists)]
    return HEADER.format(extras=",".join(extras)) + "\n".join(pins) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv == ["--check"]:
        if CONSTRAINTS.read_text() != text:
            print(f"{CONSTRAINTS} is stale: run python docker/constraints.py", file=sys.stderr)
            return 1
        return 0
    if argv:
        raise SystemExit(__doc__)
    CONSTRAINTS.write_text(text)
    print(f"{CONSTRAINTS}: {len(text.splitlines()) - HEADER.count(chr(10))} pins")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
