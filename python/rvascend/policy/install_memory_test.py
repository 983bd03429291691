"""What installing the policy leaves resident: with --cpu-kernels-drop-unpacked every
weight is packed in its own storage, so nothing the install allocated on the way (the
shape gate's timing weights, the packers' scratch) may stay, even in a process that
never pinned glibc's thresholds (a library caller's, not the server's)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

_INSTALL = """
from rvascend.models import default_model
from rvascend.models.loader import load_model
from rvascend.policy import KernelPolicyConfig, install_kernel_policy

def anon_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) >> 10 for line in f if line.startswith("RssAnon:"))

model = load_model(default_model.ensure_default_model())  # dequantized to BF16: packed in place
loaded = anon_mib()
install_kernel_policy(model, KernelPolicyConfig.from_flag(compile_mode="eager", drop_unpacked=True))
print(loaded, anon_mib())
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_installing_the_policy_leaves_no_freed_heap_resident():
    # Its own process, glibc's thresholds untouched. Before the install returned the
    # heap's free pages, SmolLM2-135M's install kept 77 MiB of freed temporaries (522
    # MiB anonymous against 445 loaded).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", _INSTALL], capture_output=True, text=True, check=True, env=env)
    loaded, installed = map(int, out.stdout.split()[-2:])
    assert installed <= loaded + 16, out.stdout


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
