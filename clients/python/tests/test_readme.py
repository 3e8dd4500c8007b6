"""The README's walkthrough runs as written: here, and in a fresh venv with nothing but
``pip install ./clients/python``."""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import pytest

from . import readme_blocks
from .conftest import Driver, Guests

PACKAGE = Path(__file__).resolve().parents[1]
README = PACKAGE / "README.md"


def test_the_readme_has_a_walkthrough() -> None:
    found = readme_blocks.blocks(README.read_text())
    assert len(found) >= 10
    assert "Client()" in found[0] and "FLINT_GUESTS" in found[0]


def test_the_readme_runs(driver: Driver, guests: Guests, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLINT_URL", driver.url)
    monkeypatch.delenv("FLINT_TOKEN", raising=False)
    monkeypatch.setenv("FLINT_GUESTS", str(guests.root))
    assert driver.service is not None
    monkeypatch.setenv("FLINT_SERVICE", driver.service)
    monkeypatch.chdir(tmp_path)
    namespace = readme_blocks.run(str(README))
    assert namespace["top"] == {"it": 6, "of": 6, "the": 6}


def test_the_readme_runs_after_pip_install_in_a_fresh_venv(driver: Driver, guests: Guests, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(PACKAGE)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, f"pip install failed:\n{install.stdout}\n{install.stderr}"
    # Nothing of this checkout is importable there: the package comes from the venv.
    where = subprocess.run(
        [str(python), "-c", "import flint_client, sys; print(flint_client.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert where.returncode == 0 and str(env_dir) in where.stdout, where.stdout + where.stderr
    env = driver.env()
    env["FLINT_GUESTS"] = str(guests.root)
    env.pop("PYTHONPATH", None)
    run = subprocess.run(
        [str(python), str(Path(readme_blocks.__file__)), str(README)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, f"the README failed in a fresh venv:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert "--- all blocks ran" in run.stdout
