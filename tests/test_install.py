"""The lock installs on a machine that is not ours: torch's entry of the lock, hash required, from a stand-in for
PyTorch's CPU wheel index served on the loopback address, with pip's machine configuration ignored (no local
wheel folder, no local index). ``make install-check`` does the whole install the same way."""

import os

import pytest

from tests import install_check

pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    try:
        return install_check.torch_wheel(tmp_path_factory.mktemp("wheel"))
    except RuntimeError as e:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(e))


def test_torch_installs_from_the_index_alone(wheel, tmp_path):
    with install_check.loopback_index(wheel) as index:
        run = install_check.install_torch_only(tmp_path, index)
    assert run.returncode == 0, run.stderr[-3000:]
    pip_list = (tmp_path / "venv" / "lib").glob("python3*/site-packages/torch-2.13.0+cpu.dist-info")
    assert list(pip_list), "torch 2.13.0+cpu is not installed in the fresh venv"


def test_a_wrong_hash_is_refused(wheel, tmp_path, monkeypatch):
    """The check can fail: the same install with the lock's torch hash changed by one digit is refused."""
    from cel_utils import lockfile

    entry = lockfile.entry(lockfile.LOCK, "torch")
    digit = entry.split("sha256:")[1][0]
    bad = entry.replace(f"sha256:{digit}", f"sha256:{'0' if digit != '0' else '1'}", 1)
    monkeypatch.setattr(lockfile, "entry", lambda path, name: bad)
    with install_check.loopback_index(wheel) as index:
        run = install_check.install_torch_only(tmp_path, index)
    assert run.returncode != 0 and "hash" in run.stderr.lower()

