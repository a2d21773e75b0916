"""The distribution installs one import package, `warrenmq`, and leaves `amqp` to py-amqp."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAPPED_FOLDERS = ["amqp", "exchanges", "log", "dlq", "cluster", "server", "spark"]


def test_py_amqp_and_warrenmq_amqp_import_side_by_side():
    import kombu

    import amqp
    import warrenmq.amqp

    assert hasattr(amqp, "Connection"), "`amqp` must be py-amqp, which kombu and Celery use"
    assert "site-packages" in amqp.__file__
    assert Path(warrenmq.amqp.__file__).parent == ROOT / "amqp"
    assert kombu.Connection("amqp://guest@localhost//").transport_cls in ("amqp", "pyamqp")


def test_a_fresh_interpreter_outside_the_repository_sees_the_same(tmp_path):
    code = (
        "import amqp, warrenmq.amqp, warrenmq.log, warrenmq.cluster.raft, warrenmq.server.cli;"
        "import kombu.transport.pyamqp;"
        "print(amqp.__file__); print(warrenmq.amqp.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, check=True, capture_output=True, text=True
    )
    py_amqp, ours = out.stdout.split()
    assert "site-packages" in py_amqp and not py_amqp.startswith(str(ROOT / "amqp"))
    assert ours.startswith(str(ROOT / "amqp"))


@pytest.mark.slow
def test_the_wheel_holds_only_warrenmq_with_every_subpackage(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("warrenmq-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"warrenmq"}
    for folder in MAPPED_FOLDERS:
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.relative_to(ROOT).as_posix()
            assert f"warrenmq/{relative}" in names, (
                f"{relative} is missing from the wheel: add it to pyproject packages"
            )
        for module in (ROOT / folder).rglob("*.py"):
            if "__pycache__" not in module.parts:
                assert f"warrenmq/{module.relative_to(ROOT).as_posix()}" in names
    # The web console is package data: every file of it, or the page breaks once installed.
    for console_file in (ROOT / "server" / "http" / "www").rglob("*"):
        if console_file.is_file():
            relative = console_file.relative_to(ROOT).as_posix()
            assert f"warrenmq/{relative}" in names, (
                f"{relative} is missing from the wheel: add its folder to pyproject package-data"
            )
