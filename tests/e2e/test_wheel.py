"""The package as users install it: a built wheel, installed (not editable) into
a fresh virtual environment, run from outside the checkout.

An editable install maps the import names onto the source tree, so a wheel that
lacks a subpackage passes every other test (the first wave shipped one without
``crowdmix.aggregator.accounting`` and ``crowdmix.aggregator.decode``). Here:

1. the wheel is built from a clean copy of the checkout the way ``pip install .``
   builds it;
2. every package in the source tree (every folder with an ``__init__.py``) and
   every package-data file must be in it;
3. it is installed with ``--no-deps`` into a new venv whose only other path is
   the dependencies' site-packages of the check's own venv (a ``.pth`` line
   adds a directory but does not run the ``.pth`` files in it, so the
   checkout's editable finder stays off), and ``crowdmix demo``, ``crowdmix
   report`` and ``crowdmix privacy amplify`` run from a scratch directory and
   are checked to import the installed copy, not the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.aggregator.test_report import write_rappor_files

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL = ("client", "shuffler", "aggregator", "protos", "crowdmix")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy: setuptools reuses an in-tree build/lib, which would hide
    # a discovery bug behind the files an earlier build left there.
    src = tmp_path_factory.mktemp("src") / "crowdmix"
    shutil.copytree(
        ROOT, src, ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "out",
        ),
    )  # fmt: skip
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(src)],
        check=True,
        timeout=300,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    (path,) = out.glob("crowdmix-*.whl")
    return path


def _source_packages() -> set[str]:
    """Every package of the checkout by its installed name (crowdmix.client, ...)."""
    found = set()
    for top in TOP_LEVEL:
        for init in (ROOT / top).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT).parts
            if "__pycache__" in parts or (top == "crowdmix" and len(parts) > 1):
                continue  # crowdmix/<folder> are the links, walked under their own folder
            found.add(".".join(parts if top == "crowdmix" else ("crowdmix", *parts)))
    return found


def test_the_wheel_holds_one_top_level_package(wheel: Path) -> None:
    """An app's own client.py or protos/ is never shadowed by ours, nor ours by it."""
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert whl.read(top_level).decode().split() == ["crowdmix"]
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"crowdmix"}


def test_the_wheel_holds_every_package_and_its_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {".".join(Path(n).parent.parts) for n in names if n.endswith("/__init__.py")}
    assert _source_packages() <= packages, sorted(_source_packages() - packages)
    for data in ("crowdmix/protos/crowdmix.proto", "crowdmix/client/py.typed"):
        assert data in names, data
    for module in (ROOT / "aggregator").rglob("*.py"):
        assert f"crowdmix/{module.relative_to(ROOT).as_posix()}" in names, module


def _venv_with_wheel(env_dir: Path, wheel: Path) -> tuple[Path, Path]:
    """A new venv in ``env_dir`` with the wheel alone installed (``--no-deps``):
    its python and its site-packages."""
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet",
         "--disable-pip-version-check", "--target", purelib, str(wheel)],
        check=True, timeout=300,
    )  # fmt: skip
    return py, Path(purelib)


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    env_dir = tmp_path_factory.mktemp("venv")
    py, purelib = _venv_with_wheel(env_dir, wheel)
    # The dependencies come from the check's venv; crowdmix itself only from the wheel.
    (purelib / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (env_dir / "bin" / "crowdmix").write_text(
        f"#!{py}\nimport sys\nfrom crowdmix.cli import main\nsys.exit(main())\n"
    )
    (env_dir / "bin" / "crowdmix").chmod(0o755)
    yield env_dir


def _run(env_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{env_dir / 'bin'}:{env.get('PATH', '')}"
    return subprocess.run(
        [str(env_dir / "bin" / "crowdmix"), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_installed_wheel_imports_itself_not_the_checkout(
    installed: Path, tmp_path: Path
) -> None:
    code = (
        "import json, crowdmix, crowdmix.aggregator.accounting, crowdmix.aggregator.decode;"
        "import crowdmix.client, crowdmix.protos, crowdmix.shuffler;"
        "from crowdmix import aggregator, client, protos, shuffler;"
        "print(json.dumps({m.__name__: m.__file__ for m in (crowdmix.aggregator.accounting,"
        " crowdmix.aggregator.decode, client, crowdmix, protos, shuffler, aggregator)}))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(
        [str(installed / "bin" / "python"), "-c", code],
        cwd=tmp_path, check=True, capture_output=True, text=True, env=env,
    ).stdout  # fmt: skip
    for name, path in json.loads(out).items():
        assert Path(path).is_relative_to(installed), (name, path)
        assert not Path(path).is_relative_to(ROOT), (name, path)
    for name in ("client", "shuffler", "aggregator", "protos"):  # nothing else was installed
        gone = subprocess.run(
            [str(installed / "bin" / "python"), "-c", f"import {name}"],
            cwd=tmp_path, capture_output=True, text=True, env=env,
        )  # fmt: skip
        assert gone.returncode != 0 and "No module named" in gone.stderr, name


def test_demo_report_and_privacy_run_from_the_installed_wheel(
    installed: Path, tmp_path: Path
) -> None:
    demo = _run(installed, tmp_path, "demo", "--clients", "20000", "--seed", "3", "--out", "d")
    assert demo.returncode == 0, demo.stderr[-2000:]
    assert "Traceback" not in demo.stderr
    assert (tmp_path / "d" / "results.csv").is_file()

    counts, map_, params = write_rappor_files(tmp_path, n=20_000)
    report = _run(
        installed, tmp_path, "report", "--rappor-counts", str(counts), "--rappor-map", str(map_),
        "--rappor-params", str(params), "--out", "r", "--no-plot",
    )  # fmt: skip
    assert report.returncode == 0, report.stderr[-2000:]
    assert (tmp_path / "r" / "summary.json").is_file()

    amplify = _run(
        installed,
        tmp_path,
        "privacy",
        "amplify",
        "--epsilon0",
        "2",
        "--n",
        "100000",
        "--delta",
        "1e-6",
        "--json",
    )
    assert amplify.returncode == 0, amplify.stderr[-2000:]
    assert json.loads(amplify.stdout)


def test_the_core_install_encodes_and_the_reporter_names_the_extra_it_needs(
    wheel: Path, tmp_path: Path
) -> None:
    """``pip install crowdmix`` (mmh3 only): the encoders work; ``client.Reporter``
    refuses at once, naming the ``transport`` extra, instead of failing at a send."""
    import mmh3

    py, purelib = _venv_with_wheel(tmp_path / "core", wheel)
    shutil.copy(mmh3.__file__, purelib)  # the one core dependency, and nothing else
    code = (
        "import sys\n"
        "from crowdmix import client\n"
        "p = client.RapporParams()\n"
        "client.RapporEncoder(p, secret=client.new_secret(), metric='m').encode('x')\n"
        "try:\n"
        "    client.Reporter(sys.argv[1], '127.0.0.1:1')\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [str(py), "-c", code, str(tmp_path / "app")],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "pip install 'crowdmix[transport]'" in out.stdout
