"""The Docker images install what the tests ran with and run what the tests run. No image is
built here (CI has no Docker engine; `.ci/run` lints the Dockerfiles with hadolint), so a build's
steps are checked one at a time, read from the Dockerfiles themselves:

- docker/constraints.txt pins, at the versions installed here, every distribution that the
  images' `pip install ".[extras]"` pulls (the closure of pyproject.toml's requirements in this
  environment's metadata), torch excepted: the CUDA base image brings its own, the CPU image
  installs its pinned build first (`python docker/constraints.py` rewrites the file);
- the images install the pins (`-r`), then the project from pyproject.toml with `-c` them; the
  project step (one line in both), run as `pip install --dry-run` into an empty environment
  holding only the CUDA base image's torch, resolves from the package index to exactly the
  pins (the CPU image's torch is this environment's, checked with the pins);
- each image's smoke step is tiny `python train.py` / `python finetune.py` runs, and runs here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from helpers import ROOT

DOCKERFILES = {name: ROOT / "docker" / name for name in ("Dockerfile", "Dockerfile.cpu")}
SMOKE_DIR = "/tmp/smoke"  # where the smoke step writes, then removes
# pip's own words when the index cannot be reached (then the resolution is skipped, not failed)
OFFLINE = re.compile(
    r"Failed to establish a new connection|Temporary failure in name resolution|"
    r"Network is unreachable|NameResolutionError|ProxyError"
)

_spec = importlib.util.spec_from_file_location("constraints", ROOT / "docker/constraints.py")
constraints = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(constraints)


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each instruction, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in dockerfile.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip() + " "
            continue
        keyword, _, args = pending.partition(" ")
        out.append((keyword.upper(), args.strip()))
        pending = ""
    return out


def build_args(dockerfile: Path) -> dict[str, str]:
    return dict(a.split("=", 1) for k, a in instructions(dockerfile) if k == "ARG" and "=" in a)


def pins() -> dict[str, tuple[str, str]]:
    """docker/constraints.txt: canonical name -> (name, version)."""
    out = {}
    for line in constraints.CONSTRAINTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, pinned = line.split("==")
            out[canonicalize_name(name)] = (name, pinned)
    return out


def extras() -> list[str]:
    (found,) = {tuple(constraints.image_extras(path)) for path in DOCKERFILES.values()}
    return list(found)


def image_torch(name: str) -> str:
    """The torch version an image has before its dependency step."""
    args = build_args(DOCKERFILES[name])
    if "TORCH_VERSION" in args:  # Dockerfile.cpu installs it
        return args["TORCH_VERSION"]
    return re.fullmatch(r"pytorch/pytorch:(\d+\.\d+\.\d+)-.*", args["BASE"]).group(1)


def install_steps(dockerfile: Path) -> tuple[str, str]:
    """The RUN lines that install the pinned dependencies, then the project."""
    runs = [a for k, a in instructions(dockerfile) if k == "RUN" and "pip install" in a]
    deps, project = [a for a in runs if "torch==" not in a]
    return deps, project


def smoke_step(dockerfile: Path) -> str:
    (line,) = [a for k, a in instructions(dockerfile) if k == "RUN" and "python train.py" in a]
    return line


def test_constraints_pin_everything_the_images_install():
    want = constraints.closure(constraints.project_requirements(extras()))
    have = pins()
    stale = "; rewrite it: python docker/constraints.py"
    assert not want.keys() - have.keys(), f"unpinned: {sorted(want.keys() - have.keys())}{stale}"
    assert not have.keys() - want.keys(), f"not pulled: {sorted(have.keys() - want.keys())}{stale}"
    wrong = {n: (have[n][1], d.version) for n, d in want.items() if have[n][1] != d.version}
    assert not wrong, f"pinned, installed: {wrong}{stale}"
    assert constraints.CONSTRAINTS.read_text() == constraints.render(), stale
    assert "torch" not in have  # the image's own


def test_the_images_install_the_project_with_its_dependencies():
    assert not (ROOT / "docker/requirements.txt").exists()  # one list: pyproject.toml
    ci_torch = re.search(r"pip install -q torch==([\w.]+)", (ROOT / ".ci/run").read_text())
    torch_range = next(
        r.specifier for r in constraints.project_requirements([]) if r.name == "torch"
    )
    for name, path in DOCKERFILES.items():
        deps, project = install_steps(path)
        assert "--no-deps" not in deps + project
        assert re.search(r"pip install [^&]*-r /tmp/constraints\.txt", deps), deps
        assert ("COPY", "docker/constraints.txt /tmp/constraints.txt") in instructions(path)
        assert re.search(r'pip install [^&]*-c docker/constraints\.txt -e "\.\[[\w,-]+\]"', project)
        assert torch_range.contains(image_torch(name)), (name, image_torch(name))
    # one dependency step and one project step, resolved for both images by
    # test_the_project_step_resolves_to_the_pins
    assert install_steps(DOCKERFILES["Dockerfile"]) == install_steps(DOCKERFILES["Dockerfile.cpu"])
    # the CPU image's torch is the one the tests ran with
    assert image_torch("Dockerfile.cpu") == version("torch").split("+")[0] == ci_torch.group(1)


@pytest.fixture(scope="module")
def resolution(tmp_path_factory):
    """The CUDA image's project step, started now, as `pip install --dry-run --report` into an
    empty environment (no pip of its own) holding only the base image's torch (its metadata
    without requirements: what torch needs comes with the base), in a copy of what the image's
    /app holds: it must pull exactly the pins, which the image's dependency step installs
    before it. The CPU image's step is the same line with this environment's torch, whose pins
    test_constraints_... checks consistent. Resolving takes pip ~10 s of CPU, so the smoke
    test starts it and runs beside it."""
    tmp = tmp_path_factory.mktemp("resolution")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp / "venv"], check=True)
    (site,) = (tmp / "venv/lib").glob("python3*/site-packages")
    base_torch = image_torch("Dockerfile")
    info = site / f"torch-{base_torch}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {base_torch}\n")
    (info / "RECORD").write_text("")
    _, line = install_steps(DOCKERFILES["Dockerfile"])
    line = line.split("&&")[0]  # the install, not the folders made after it
    app = tmp / "app"  # what the project's build reads of the image's /app
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for part in ("bert_lightning", "conf", "docker"):
        shutil.copytree(ROOT / part, app / part, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, app)
    report = tmp / "report.json"
    q = lambda p: shlex.quote(str(p))
    pip = f"{q(sys.executable)} -m pip --python {q(tmp / 'venv/bin/python')}"
    line = line.replace("pip install", f"{pip} install --dry-run --quiet --report {q(report)}")
    with open(tmp / "pip.log", "w") as log:
        proc = subprocess.Popen(
            ["bash", "-c", f"set -euo pipefail; {line}"],
            cwd=app,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    yield proc, report, tmp / "pip.log"
    if proc.poll() is None:  # a test failed before waiting for it
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_both_images_smoke_the_same_tiny_runs():
    lines = {name: smoke_step(path) for name, path in DOCKERFILES.items()}
    assert len(set(lines.values())) == 1, lines
    commands = [shlex.split(c) for c in next(iter(lines.values())).split("&&")]
    assert [c[:2] for c in commands] == [
        ["python", "train.py"],
        ["bert-lightning", "brackets-data"],
        ["python", "finetune.py"],
        ["rm", "-rf"],
    ], commands
    train, data, finetune, rm = commands
    # the tests' tiny run (debug=tiny: its sizes, on the CPU), two steps
    assert train[2] == "debug=tiny", train
    overrides = dict(o.split("=", 1) for o in train[3:])
    assert int(overrides["trainer.max_steps"]) <= 2
    tuned = dict(o.split("=", 1) for o in finetune[2:])
    assert int(tuned["trainer.max_steps"]) <= 2
    assert tuned["init_from"] == f"{overrides['paths.output_dir']}/checkpoints/last.ckpt"
    # everything it writes lies in SMOKE_DIR, which it removes
    written = [overrides["paths.output_dir"], overrides["data.cache_dir"], data[2]]
    written += [tuned["paths.output_dir"], tuned["paths.log_dir"]]
    assert all(w == SMOKE_DIR or w.startswith(SMOKE_DIR + "/") for w in written), written
    assert rm[2:] == [SMOKE_DIR]


@pytest.mark.slow
def test_the_smoke_step_runs_here(tmp_path, resolution):
    """The Dockerfiles' smoke RUN line, verbatim but for SMOKE_DIR, in a WORKDIR holding the
    two scripts (the package is the installed one), with the image's HF_HOME; it leaves
    nothing behind in either. `resolution` is asked for only to resolve beside this run."""
    app, hf_home = tmp_path / "app", tmp_path / "hf_home"
    app.mkdir()
    for script in ("train.py", "finetune.py"):
        shutil.copy(ROOT / script, app)
    line = smoke_step(DOCKERFILES["Dockerfile"]).replace(SMOKE_DIR, str(tmp_path / "smoke"))
    bin_dir = Path(sys.executable).parent  # `python` and `bert-lightning` of this environment
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", HF_HOME=str(hf_home))
    r = subprocess.run(
        ["bash", "-c", f"set -euo pipefail; {line}"],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert f"outputs in {tmp_path}/smoke/finetune" in r.stdout  # the last run got to its end
    assert sorted(p.name for p in app.iterdir()) == ["finetune.py", "train.py"]
    assert not (tmp_path / "smoke").exists()
    assert not hf_home.exists() or not any(hf_home.rglob("*")), list(hf_home.rglob("*"))


@pytest.mark.slow
def test_the_project_step_resolves_to_the_pins(resolution):
    proc, report, log = resolution
    proc.wait(timeout=180)
    out = log.read_text()
    if proc.returncode and OFFLINE.search(out):
        pytest.skip(f"the package index is out of reach: {OFFLINE.search(out).group(0)}")
    assert proc.returncode == 0, out[-3000:]
    got = {
        canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert got.pop("bert-lightning") == version("bert-lightning")  # the empty package
    want = {n: v for n, (_, v) in pins().items()}
    differ = {n: (got.get(n), want.get(n)) for n in got.keys() | want.keys()}
    assert got == want, {n: v for n, v in differ.items() if v[0] != v[1]}  # (resolved, pinned)
