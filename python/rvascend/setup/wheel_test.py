"""The wheel writer: same inputs, same bytes; RECORD hashes match the files; tests and dev tooling left out."""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import zipfile

import pytest

from rvascend.setup.wheel import build_wheel

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_same_inputs_give_the_same_bytes(tmp_path):
    ext = tmp_path / "_fake.so"
    ext.write_bytes(b"\x7fELF not really")
    first = build_wheel(PACKAGE, [str(ext)], "0.1.0", "cp313", "linux_riscv64", str(tmp_path / "a"))
    os.utime(ext, (1, 1))  # file times must not matter
    second = build_wheel(PACKAGE, [str(ext)], "0.1.0", "cp313", "linux_riscv64", str(tmp_path / "b"))
    assert os.path.basename(first) == "rvascend-0.1.0-cp313-cp313-linux_riscv64.whl"
    assert open(first, "rb").read() == open(second, "rb").read()


def test_record_matches_and_tests_are_left_out(tmp_path):
    path = build_wheel(PACKAGE, [], "0.1.0", "cp313", "linux_riscv64", str(tmp_path))
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        record = zf.read("rvascend-0.1.0.dist-info/RECORD").decode().splitlines()
        for line in record:
            name, digest, size = line.rsplit(",", 2)
            if not digest:
                continue
            data = zf.read(name)
            want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == want and int(size) == len(data), name
    assert "rvascend/server/app.py" in names and "rvascend/ops/packed_linear.py" in names
    # Data the package reads at run time: the pins and the board's shape gate table.
    assert {"rvascend/models/default_model.lock.json", "rvascend/dispatch/gate_riscv64.json"} <= set(names)
    assert not [n for n in names if n.endswith(("_test.py", "/testing.py"))]
    # Dev tooling stays in the source tree: a board serves without it.
    assert not [n for n in names if n.split("/")[1] in ("bench", "setup", "repro", "testing")]
    assert "Tag: cp313-cp313-linux_riscv64" in zipfile.ZipFile(path).read("rvascend-0.1.0.dist-info/WHEEL").decode()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
