"""A virtual environment per training framework, for tests that run the real thing.

The frameworks pin different versions of transformers and TRL, so each gets its own
environment: made once from the package index (CPU torch first, as ``.ci/run`` does), cached
under ``$FW_FRAMEWORK_ENVS`` (default ``~/.cache/forgetwatch/framework-envs``) and keyed by
what was installed; forgetwatch is installed into it from this checkout once per test session.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("FW_FRAMEWORK_ENVS", Path.home() / ".cache" / "forgetwatch" / "framework-envs"))
TORCH = "torch==" + torch.__version__.split("+")[0]  # the CPU wheel this machine installs

#: what each framework's environment holds beside torch and forgetwatch: the versions tested
FRAMEWORKS: dict[str, list[str]] = {
    "axolotl": ["axolotl==0.19.0"],
    "swift": ["ms-swift==4.6.0", "msgspec"],  # msgspec: its GRPO trainer imports it
    "llamafactory": ["llamafactory==0.9.5"],
}

#: PyPI's torchvision and torchaudio are CUDA builds that fail to load beside the CPU torch;
#: LLaMA-Factory's text training needs neither, but imports torchaudio: an empty one stands in
_NOT_ON_CPU: dict[str, list[str]] = {"llamafactory": ["torchvision", "torchaudio"]}
_STAND_INS: dict[str, list[str]] = {"llamafactory": ["torchaudio"]}

_installed_this_session: set[str] = set()


def framework_env(name: str) -> Path:
    """The ``bin`` folder of ``name``'s environment, made if needed, with this checkout's forgetwatch."""
    spec = [TORCH, *FRAMEWORKS[name]]
    key = hashlib.sha256(repr((sys.version_info[:2], spec, _NOT_ON_CPU.get(name))).encode()).hexdigest()[:12]
    folder = CACHE / f"{name}-{key}"
    bin_dir = folder / "bin"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one test run builds it; another waits
        if not (folder / "ready").exists():
            shutil.rmtree(folder, ignore_errors=True)
            _run([sys.executable, "-m", "venv", str(folder)])
            _pip(bin_dir, "install", TORCH)  # first: a bare resolve would pick CUDA torch
            _pip(bin_dir, "install", *spec, str(ROOT))
            if _NOT_ON_CPU.get(name):
                _pip(bin_dir, "uninstall", "-y", *_NOT_ON_CPU[name])
            site = next((folder / "lib").glob("python3*/site-packages"))
            for package in _STAND_INS.get(name, []):
                (site / package).mkdir(exist_ok=True)
                (site / package / "__init__.py").write_text('"""Stand-in: the CUDA build cannot load here."""\n')
            (folder / "ready").write_text("\n".join(spec) + "\n")
            for stale in CACHE.glob(f"{name}-*"):  # what an earlier spec built: gigabytes each
                if stale != folder:
                    shutil.rmtree(stale, ignore_errors=True)
        if name not in _installed_this_session:
            _pip(bin_dir, "install", "--no-deps", "--force-reinstall", str(ROOT))
            # a dependency this checkout added since the environment was made; those there are left as they are
            _pip(bin_dir, "install", *tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
            _installed_this_session.add(name)
    return bin_dir


def _pip(bin_dir: Path, *args: str) -> None:
    _run([str(bin_dir / "python"), "-m", "pip", "-q", "--disable-pip-version-check", *args])


def _run(command: Sequence[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, cwd="/")
    if done.returncode:
        raise RuntimeError(
            f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )


def framework_run(
    bin_dir: Path, command: Sequence[str], cwd: Path, log: Path, env: Mapping[str, str] | None = None
) -> str:
    """Run ``command`` (its first word from ``bin_dir``) offline; return what it printed (also kept in ``log``)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("FORGETWATCH_", "PYTHON", "VIRTUAL_ENV"))}
    environ.update(
        PATH=f"{bin_dir}{os.pathsep}{environ.get('PATH', '')}",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        WANDB_MODE="disabled",
        AXOLOTL_DO_NOT_TRACK="1",
        DO_NOT_TRACK="1",
        USE_HF="1",
        TOKENIZERS_PARALLELISM="false",
        CUDA_VISIBLE_DEVICES="",
        **(env or {}),
    )
    done = subprocess.run(
        [str(bin_dir / command[0]), *command[1:]],
        cwd=cwd,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    log.write_text(done.stdout)
    return done.stdout
