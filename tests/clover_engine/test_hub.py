"""Hub ids as model names (`clover_engine.backbones.hub`), against a REAL huggingface_hub cache.

A temporary ``HF_HOME`` is filled the way huggingface_hub fills it --
``hub/models--ORG--NAME/blobs/<sha256>``, ``snapshots/<40-hex commit>/<file>`` symlinked to the blob, and
``refs/main`` (and ``refs/dev``) holding the commit -- with a tiny clover-test checkpoint our code saves.
Nothing of the resolver is mocked: every hub resolution runs in a subprocess whose environment sets
``HF_HOME`` and ``HF_HUB_OFFLINE=1`` before huggingface_hub is imported (it reads both at import time), so
``snapshot_download`` finds the cache exactly as it would on a user's machine without a network.

Covered: ``org/name`` and ``org/name@<commit>`` / ``@<branch>`` load (model id = the hub id, decodes); the
explorer's loader and notebook `Explorer` take a hub id; an unknown id and an uncached revision offline, and
a cached snapshot without safetensors, give the clear errors, and so do a gated repo, an unknown repo and a
missing revision as a (local, fake) hub answers them and a hub that cannot be reached; a local folder shaped ``a/b`` still wins;
``clover-explorer generate --model org/name`` end to end (trace records the hub id), and its error.

Run: ``.venv/bin/python -m pytest -q tests/clover_engine/test_hub.py``
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import clover_engine
from clover_engine.backbones.hub import CHECKPOINT_FILES, HubId, parse_hub_id
from clover_engine.checkpoint import save_model
from clover_engine.recording.trace import Trace
from clover_engine.tokenizer import byte_tokenizer

ROOT = Path(__file__).resolve().parents[2]
REPO = "clover-org/clover-test"
REV = "0123456789abcdef0123456789abcdef01234567"
DEV_REV = "89abcdef0123456789abcdef0123456789abcdef"
NO_WEIGHTS = "clover-org/bin-only"


def put_in_cache(hf_home: Path, repo_id: str, revision: str, files: dict[str, bytes], refs: tuple[str, ...]) -> Path:
    """One snapshot of ``repo_id`` in huggingface_hub's cache layout; returns the snapshot folder."""
    repo = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(revision)  # no newline: as huggingface_hub writes it
    return snapshot


@pytest.fixture(scope="module")
def hub_home(tmp_path_factory) -> Path:
    """``HF_HOME`` holding clover-org/clover-test (main and dev, two commits) and a .bin-only repo."""
    tmp = tmp_path_factory.mktemp("hub")
    saved = tmp / "saved"
    save_model(clover_engine.CloverModel(clover_engine.CloverConfig.from_name("clover-test")), saved,
               tokenizer=byte_tokenizer())
    files = {p.name: p.read_bytes() for p in saved.iterdir() if p.is_file()}
    assert "model.safetensors" in files and "config.json" in files
    hf_home = tmp / "hf"
    put_in_cache(hf_home, REPO, REV, files, ("main",))
    put_in_cache(hf_home, REPO, DEV_REV, files, ("dev",))
    put_in_cache(hf_home, NO_WEIGHTS, REV, {"config.json": files["config.json"], "pytorch_model.bin": b"\0" * 64},
                 ("main",))
    return hf_home


def hub_env(hf_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), CLOVER_TORCH_THREADS="1",
               OMP_NUM_THREADS="1")
    return env


# Every library-level case in one interpreter (importing torch + the engine costs seconds on a busy machine).
CASES = textwrap.dedent("""
    import json, os, sys
    out = {}

    def err(fn):
        try:
            fn()
        except ValueError as e:
            return str(e)
        return None

    import torch
    torch.set_num_threads(1)
    from clover_engine.backbones.hub import model_source, parse_hub_id
    from clover_engine.checkpoint import load_model, load_tokenizer
    from clover_engine.decoding.decoder import BlockDecoder, DecodeConfig
    REPO, REV = sys.argv[1], sys.argv[2]

    m = load_model(REPO)
    tok = load_tokenizer(REPO)
    r = BlockDecoder(m, tok, DecodeConfig(block_size=4, max_new_tokens=4)).generate("hi", record_trace=True)
    out["plain"] = {"model_id": m.model_id, "trace_id": r.trace.model_id, "tokens": len(r.tokens),
                    "dir": str(model_source(REPO)[0])}
    out["at_rev"] = load_model(f"{REPO}@{REV}").model_id
    out["at_dev"] = {"id": load_model(f"{REPO}@dev").model_id, "dir": str(model_source(f"{REPO}@dev")[0])}
    out["unknown"] = err(lambda: load_model("nobody/no-such-model"))
    out["unknown_tokenizer"] = err(lambda: load_tokenizer("nobody/no-such-model"))
    out["uncached_rev"] = err(lambda: load_model(f"{REPO}@" + "f" * 40))
    out["no_safetensors"] = err(lambda: load_model(sys.argv[3]))

    from clover_viz import models
    spec = models.resolve_model(REPO)
    loaded = models.load_model_cached(spec, check_memory=True)
    out["viz"] = {"kind": spec.kind, "path": spec.path, "model_id": loaded.model_id, "label": loaded.label}
    out["viz_unknown"] = err(lambda: models.load_model_cached(models.resolve_model("nobody/no-such-model")))
    from clover_viz.widgets import Explorer
    ex = Explorer(f"{REPO}@dev")
    out["explorer"] = ex.state.loaded_model.model_id

    os.chdir(sys.argv[4])  # a folder holding ./clover-org/clover-test: the local checkpoint wins
    out["local"] = {"parsed": parse_hub_id(REPO), "model_id": load_model(REPO).model_id,
                    "viz_kind": models.resolve_model(REPO).kind}
    print("RESULTS " + json.dumps(out, default=str))
""")


@pytest.fixture(scope="module")
def results(hub_home, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("work")
    local = work / "clover-org" / "clover-test"
    save_model(clover_engine.CloverModel(clover_engine.CloverConfig.from_name("clover-test")), local,
               tokenizer=byte_tokenizer())
    proc = subprocess.run([sys.executable, "-c", CASES, REPO, REV, NO_WEIGHTS, str(work)], capture_output=True,
                          text=True, env=hub_env(hub_home), cwd=ROOT, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line.removeprefix("RESULTS "))


def test_parse_hub_id_shapes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_hub_id("GSAI-ML/LLaDA-8B-Instruct") == HubId("GSAI-ML/LLaDA-8B-Instruct")
    assert parse_hub_id(" org/name@v1.0 ") == HubId("org/name", "v1.0")
    assert str(HubId("org/name", REV)) == f"org/name@{REV}"
    for not_hub in ("clover-test", "models/clover-tiny", "clover-tiny", "a/b/c", "/abs/path", "./a/b", "~/a",
                    "a/../b", "org--x/name", "org/name@", "org/na me", ""):
        assert parse_hub_id(not_hub) is None, not_hub
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert parse_hub_id("a/b") is None  # an existing local folder keeps its meaning
    assert parse_hub_id(Path("org/name")) is None  # a Path is local by intent
    assert {"config.json", "*.safetensors", "*.safetensors.index.json", "tokenizer.json", "*.py",
            "chat_template.jinja", "generation_config.json"} <= set(CHECKPOINT_FILES)


def test_hub_ids_load_and_decode_with_the_hub_id_as_model_id(results, hub_home):
    plain = results["plain"]
    assert plain["model_id"] == plain["trace_id"] == REPO
    assert plain["tokens"] > 0
    assert Path(plain["dir"]) == hub_home / "hub" / "models--clover-org--clover-test" / "snapshots" / REV
    assert results["at_rev"] == f"{REPO}@{REV}"
    assert results["at_dev"]["id"] == f"{REPO}@dev" and results["at_dev"]["dir"].endswith(DEV_REV)


def test_the_explorer_loads_a_hub_id(results):
    viz = results["viz"]
    assert viz["kind"] == "hub" and viz["path"] == REPO and viz["model_id"] == REPO
    assert viz["label"] == f"{REPO} (hub)"
    assert results["explorer"] == f"{REPO}@dev"
    assert "HF_HUB_OFFLINE=1" in results["viz_unknown"]


def test_unknown_id_or_uncached_revision_offline_is_a_clear_error(results):
    for key in ("unknown", "unknown_tokenizer"):
        msg = results[key]
        assert msg.startswith("nobody/no-such-model is not in the huggingface_hub cache"), msg
        assert "HF_HUB_OFFLINE=1 is set" in msg and "download it first" in msg
        assert "hf download nobody/no-such-model" in msg and "no local directory" in msg
    assert f"{REPO}@{'f' * 40} is not in the huggingface_hub cache" in results["uncached_rev"]
    assert f"--revision {'f' * 40}" in results["uncached_rev"]


def test_a_snapshot_without_safetensors_is_refused(results):
    msg = results["no_safetensors"]
    assert msg.startswith(f"{NO_WEIGHTS} (snapshot ") and "has no *.safetensors weights" in msg, msg
    assert "this engine reads safetensors only" in msg


def test_a_local_folder_shaped_like_a_hub_id_wins(results):
    local = results["local"]
    assert local["parsed"] is None and local["viz_kind"] == "checkpoint"
    assert local["model_id"] == "clover-test"  # the local folder's name, not the hub id


def test_clover_explorer_generate_with_a_hub_id_end_to_end(hub_home, tmp_path):
    trace = tmp_path / "t.parquet"
    proc = subprocess.run([sys.executable, "-m", "clover_explorer", "generate", "--model", REPO, "--prompt", "hi",
                           "--block-size", "4", "--max-new-tokens", "4", "--trace", str(trace)],
                          capture_output=True, text=True, env=hub_env(hub_home), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the summary and its memory-mode reason name the model by its hub id, not by its snapshot's commit folder
    assert f"[{REPO}] block_size=4" in proc.stdout and "trace saved to" in proc.stdout
    assert REV not in proc.stdout + proc.stderr and f"(default: {REPO} has an attention window" in proc.stdout, proc.stdout
    assert Trace.load(trace).model_id == REPO  # traces name the hub model, not its snapshot folder

    bad = subprocess.run([sys.executable, "-m", "clover_explorer", "generate", "--model", "nobody/no-such-model",
                          "--prompt", "hi"], capture_output=True, text=True, env=hub_env(hub_home), cwd=tmp_path,
                         timeout=600)
    assert bad.returncode == 2 and bad.stderr.startswith("error: nobody/no-such-model is not in the "
                                                         "huggingface_hub cache"), bad.stderr



class _FakeHub(http.server.BaseHTTPRequestHandler):
    """The hub's answers to ``repo_info`` for the three refusals, with the headers huggingface_hub reads
    (``X-Error-Code``): the real client, its error classes and `snapshot_download`'s handling all run."""

    ANSWERS = {
        "/api/models/gated-org/gated-model/revision/main": (403, "GatedRepo"),
        "/api/models/nobody/missing-model/revision/main": (401, "RepoNotFound"),
        f"/api/models/{REPO}/revision/no-such-branch": (404, "RevisionNotFound"),
    }

    def do_GET(self):  # noqa: N802 (http.server's name)
        status, code = self.ANSWERS.get(self.path.split("?")[0], (500, ""))
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"error": code or "unexpected request"}).encode())

    def log_message(self, *args):
        pass


ONLINE_CASES = textwrap.dedent("""
    import json, sys
    from clover_engine.backbones.hub import hub_snapshot
    out = {}
    for name in sys.argv[1:]:
        try:
            out[name] = str(hub_snapshot(name))
        except ValueError as e:
            out[name] = str(e)
    print("RESULTS " + json.dumps(out))
""")


def _online(hub_home: Path, endpoint: str, *ids: str) -> dict:
    env = {k: v for k, v in hub_env(hub_home).items() if "proxy" not in k.lower()}
    env.pop("HF_HUB_OFFLINE")
    env.update(HF_ENDPOINT=endpoint, HF_HUB_ETAG_TIMEOUT="5", HF_HUB_DOWNLOAD_TIMEOUT="5")
    proc = subprocess.run([sys.executable, "-c", ONLINE_CASES, *ids], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line.removeprefix("RESULTS "))


def test_gated_unknown_and_missing_revision_answers_of_the_hub_are_clear_errors(hub_home):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        got = _online(hub_home, f"http://127.0.0.1:{server.server_address[1]}", "gated-org/gated-model",
                      "nobody/missing-model", f"{REPO}@no-such-branch")
    finally:
        server.shutdown()
    gated = got["gated-org/gated-model"]
    assert gated.startswith("gated-org/gated-model is a gated model on the Hugging Face hub"), gated
    assert "accept its licence at https://huggingface.co/gated-org/gated-model" in gated
    assert "`hf auth login`" in gated and "HF_TOKEN" in gated
    missing = got["nobody/missing-model"]
    assert missing.startswith("no model 'nobody/missing-model' on the Hugging Face hub"), missing
    revision = got[f"{REPO}@no-such-branch"]
    assert revision.startswith(f"{REPO} has no revision 'no-such-branch'"), revision


def test_no_network_with_nothing_cached_is_a_clear_error_and_a_cached_model_still_loads(hub_home):
    with socket.socket() as s:  # a port nothing listens on: the hub cannot be reached
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got = _online(hub_home, f"http://127.0.0.1:{port}", "nobody/missing-model", REPO)
    msg = got["nobody/missing-model"]
    assert "is not in the huggingface_hub cache" in msg and "the hub cannot be reached (no network?)" in msg, msg
    assert got[REPO].endswith(f"snapshots/{REV}")  # huggingface_hub falls back on its cache
