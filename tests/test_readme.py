"""The README's CPU examples run as shown.

Convention: a fenced code block whose opening line (```bash or ```python) comes right after a
line ``<!-- cpu -->`` is a CPU example; this test runs each one from the repository root (bash
blocks with ``bash -eu``, python blocks with this interpreter), offline and with a private cache,
and checks that it exits 0. Only runnable usage examples carry the marker: the set-up commands
(pip install) and the GPU examples do not, and are never run here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

MARKER = "<!-- cpu -->"
BLOCK = re.compile(r"^<!-- cpu -->\n```(bash|python)\n(.*?)^```$", re.S | re.M)


def cpu_blocks() -> list[tuple[str, str]]:
    text = (REPO / "README.md").read_text()
    blocks = BLOCK.findall(text)
    # every marker opens a block this test understands: a typo would otherwise skip an example
    assert len(blocks) == text.count(MARKER), "a <!-- cpu --> marker not followed by a ```bash or ```python block"
    return blocks


def test_the_readme_marks_cpu_examples_and_no_set_up():
    blocks = cpu_blocks()
    assert {lang for lang, _ in blocks} == {"bash", "python"}
    for _, code in blocks:
        assert "pip install" not in code and "pytest" not in code, code


@pytest.mark.slow
@pytest.mark.parametrize("lang, code", cpu_blocks(), ids=lambda x: x.splitlines()[0][:60] if "\n" in x else x)
def test_cpu_example_runs(lang, code, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", MEGAKERNEL_CACHE=str(tmp_path / "mkcache"),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    cmd = ["bash", "-eu", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode}\n{code}\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-3000:]}"
    assert r.stdout.strip(), f"the example printed nothing:\n{code}"
