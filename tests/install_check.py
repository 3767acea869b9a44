"""Install from the lock as a machine that is not ours would: pip's machine configuration ignored
(``PIP_CONFIG_FILE`` set to the null device, every ``PIP_*`` variable dropped) and ``TORCH_INDEX`` pointed at a
stand-in for PyTorch's CPU wheel index: a PEP 503 simple index served on the loopback address that holds only the
torch wheel (the real index is not reachable from the build machines).

    python -m tests.install_check            # a copy of the working tree's tracked files: make venv, then imports
    python -m tests.install_check --torch-only   # only the lock's torch entry into a fresh venv (about 30 s)

``make install-check`` runs the first; ``tests/test_install.py`` runs the second (and the first where asked).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def torch_wheel(dest: Path) -> Path:
    """The lock's torch wheel, obtained the way this machine's own pip configuration finds it (a local wheel folder
    here); None-free: raises RuntimeError when pip cannot find it."""
    sys.path.insert(0, str(ROOT))
    from cel_utils import lockfile

    req = dest / "torch.lock"
    req.write_text(lockfile.entry(lockfile.LOCK, "torch"))
    out = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                          "-d", str(dest), "-r", str(req)], capture_output=True, text=True)
    wheels = sorted(dest.glob("torch-*.whl"))
    if out.returncode or not wheels:
        raise RuntimeError(f"cannot obtain the lock's torch wheel with this machine's pip: {out.stderr[-500:]}")
    return wheels[0]


@contextlib.contextmanager
def loopback_index(wheel: Path):
    """A simple index on 127.0.0.1 with one project, torch, and one file, ``wheel``: yields the index's URL."""
    root = Path(tempfile.mkdtemp(prefix="torch_index_"))
    (root / "files").mkdir()
    os.symlink(wheel, root / "files" / wheel.name)
    (root / "simple" / "torch").mkdir(parents=True)
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    href = f"../../files/{urllib.parse.quote(wheel.name)}#sha256={sha}"
    (root / "simple" / "torch" / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="{href}">{wheel.name}</a></body></html>\n')
    (root / "simple" / "index.html").write_text('<html><body><a href="torch/">torch</a></body></html>\n')
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        shutil.rmtree(root, ignore_errors=True)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # noqa: D102  (pip's requests are not the check's output)
        pass


def outside_env() -> dict:
    """This process's environment without pip's machine configuration: what a user's shell would have."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def tracked_copy(dest: Path) -> Path:
    """The working tree's tracked files (what a clone of this commit plus its edits has) copied into ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def install_torch_only(work: Path, index: str) -> subprocess.CompletedProcess:
    """The Makefile's torch step, as written there, into a fresh venv in ``work``."""
    sys.path.insert(0, str(ROOT))
    from cel_utils import lockfile

    subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True)
    req = work / "torch.lock"
    req.write_text(lockfile.entry(lockfile.LOCK, "torch"))
    return subprocess.run([str(work / "venv" / "bin" / "pip"), "install", "--quiet", "--require-hashes", "--no-deps",
                           "--index-url", index, "-r", str(req)], env=outside_env(), capture_output=True, text=True)


def full_install(work: Path, index: str) -> subprocess.CompletedProcess:
    """``make venv`` in a copy of the tracked files, then the package and its heaviest dependencies imported."""
    clone = tracked_copy(work / "clone")
    run = subprocess.run(["make", "venv", f"TORCH_INDEX={index}", f"PY={sys.executable}"], cwd=clone,
                         env=outside_env(), capture_output=True, text=True)
    if run.returncode:
        return run
    return subprocess.run([str(clone / ".venv" / "bin" / "python"), "-c",
                           "import torch, transformers, lm_eval, cel_utils.cli; print(torch.__version__)"],
                          cwd=clone, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--torch-only", action="store_true")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="install_check_"))
    try:
        wheel = torch_wheel(work)
        with loopback_index(wheel) as index:
            t0 = time.time()
            run = (install_torch_only if args.torch_only else full_install)(work, index)
            print(run.stdout[-2000:], run.stderr[-4000:], sep="\n")
            print(f"install from {index} with PIP_CONFIG_FILE={os.devnull}: exit {run.returncode} in "
                  f"{time.time() - t0:.0f} s")
        return run.returncode
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
