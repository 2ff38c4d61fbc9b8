"""Every Python block of the README runs as written, and says what the README claims."""

import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)


def run_block(code: str, cwd) -> str:
  done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                        timeout=600, env={"TF_CPP_MIN_LOG_LEVEL": "2",
                                          "PATH": "/usr/bin:/bin", "HOME": str(cwd)})
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout


def test_the_readme_has_python_blocks():
  assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index, tmp_path):
  out = run_block(BLOCKS[index], tmp_path)
  if "make_private" in BLOCKS[index]:  # the first example: private, within budget, sparse
    epsilon, reduction = re.search(r"epsilon ([\d.]+); gradient-size reduction ([\d,]+)x",
                                   out).groups()
    assert 0 < float(epsilon) <= 1.0
    assert float(reduction.replace(",", "")) > 100  # rows of the table / rows updated per step
    assert "satisfies (" in out and "-DP" in out
