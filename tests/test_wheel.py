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
