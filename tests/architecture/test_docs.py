"""Every code block of the README and of the manual (docs/) runs as written, or is parsed.

Each ```python and ```bash block runs in its own folder with the installed
``sparse-dp`` on ``PATH``; a ```json block must load. A block that cannot run on
a CPU test machine (a TPU, a cluster, the real Criteo files, minutes of training
at full scale) has ``<!-- check: parse-only, REASON -->`` on the line above it
and is parsed instead: every ``sparse-dp`` command line by the command's own
argument parser, the shell by ``bash -n``, Python (and a shell's here-document
of Python) by ``compile``. ``<!-- check: slow, REASON -->`` marks a block that
trains at the smoke scale: a ``slow`` test, run on one stack (tests/conftest.py).
Identical blocks (the README's example is also the manual's) run once. The manual
itself builds with ``mkdocs build --strict``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap
from typing import List, Optional

import pytest

from sparse_dp.cli import build_parser

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# A fenced block at any indentation (inside a list item too), with the check
# comment on the line above it when it has one.
FENCE = re.compile(
    r"^(?:(?P<indent_check>[ \t]*)<!-- check: (?P<check>[\w-]+), (?P<reason>[^\n]+?) -->\n)?"
    r"(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$",
    re.MULTILINE | re.DOTALL)
CHECKS = (None, "parse-only", "slow")
RUNNABLE = ("python", "bash")
HEREDOC = re.compile(r"<<-?\s*'?(\w+)'?([^\n]*)\n(.*?)^\1$", re.MULTILINE | re.DOTALL)
SHELL_OPERATORS = {"&&", "||", ";", "|", "&"}
# A redirection: alone (its target is the next word) or with its target attached.
REDIRECTION = re.compile(r"^(?:\d*|&)(?:>>?|<)(?P<target>&\d+|\S+)?$")


@dataclasses.dataclass(frozen=True)
class Block:
  """One fenced code block, where it is and how the tests check it."""
  pages: tuple
  lang: str
  code: str
  check: Optional[str]
  reason: Optional[str]

  @property
  def name(self) -> str:
    return f"{self.pages[0]}:{self.lang}:{self.check or 'run'}"


def _blocks() -> List[Block]:
  found = {}
  for page in PAGES:
    for match in FENCE.finditer(page.read_text()):
      code = textwrap.dedent(re.sub(rf"^{match['indent']}", "", match["code"], flags=re.M))
      key = (match["lang"], code, match["check"], match["reason"])
      where = str(page.relative_to(ROOT))
      found[key] = found[key] + (where,) if key in found else (where,)
  return [Block(pages, *key) for key, pages in found.items()]


BLOCKS = _blocks()


def _params():
  for block in BLOCKS:  # a block that runs starts a subprocess: the slow tier (conftest.py)
    marks = [pytest.mark.slow] if block.check != "parse-only" and block.lang in RUNNABLE else []
    yield pytest.param(block, id=block.name, marks=marks)


def _environment(cwd) -> dict:
  scripts = pathlib.Path(sys.executable).parent  # the installed `sparse-dp` lives beside it
  return {"PATH": f"{scripts}:/usr/bin:/bin", "HOME": str(cwd), "TF_CPP_MIN_LOG_LEVEL": "2"}


def _run(argv, cwd) -> str:
  done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=900,
                        env=_environment(cwd))
  assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
  return done.stdout


def sparse_dp_command_lines(script: str) -> List[List[str]]:
  """The arguments of every ``sparse-dp`` call of a shell script (here-documents left out)."""
  script = HEREDOC.sub(lambda match: match[2], script).replace("\\\n", " ")
  calls = []
  for line in script.splitlines():
    words = shlex.split(line, comments=True)
    command: List[str] = []
    redirected = False
    for word in words + [";"]:
      if redirected:  # the target of a redirection
        redirected = False
        continue
      redirection = REDIRECTION.match(word)
      if redirection:
        redirected = redirection["target"] is None
        continue
      if word not in SHELL_OPERATORS:
        command.append(word)
        continue
      while command and re.match(r"^\w+=", command[0]):  # VAR=value before the command
        command.pop(0)
      if command and pathlib.PurePath(command[0]).name == "sparse-dp":
        calls.append(command[1:])
      command = []
  return calls


def _parse(block: Block) -> None:
  if block.lang == "python":
    compile(block.code, block.name, "exec")
    return
  syntax = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
  assert syntax.returncode == 0, syntax.stderr
  for match in HEREDOC.finditer(block.code):
    if re.search(r"python\S*\s+-\s*$", block.code[:match.start()].splitlines()[-1]):
      compile(match[3], f"{block.name} (here-document)", "exec")
  for argv in sparse_dp_command_lines(block.code):
    try:
      args = build_parser().parse_args(argv)
    except SystemExit as refused:
      raise AssertionError(f"`sparse-dp {shlex.join(argv)}` is refused by its parser") from refused
    assert callable(args.run)


def test_the_readme_and_the_manual_have_blocks_of_each_kind():
  kinds = {(block.lang, block.check) for block in BLOCKS}
  assert {("python", None), ("bash", None), ("bash", "parse-only"), ("bash", "slow")} <= kinds


@pytest.mark.parametrize("block", list(_params()))
def test_block(block: Block, tmp_path):
  assert block.check in CHECKS, f"{block.pages}: unknown check {block.check!r}; use {CHECKS[1:]}"
  if block.lang == "json":
    json.loads(block.code)
    return
  assert block.lang in RUNNABLE, (
      f"{block.pages}: a ```{block.lang} block the tests cannot check; write it as "
      "```python, ```bash or ```json")
  if block.check == "parse-only":
    _parse(block)
    return
  if block.lang == "python":
    out = _run([sys.executable, "-c", block.code], tmp_path)
  else:
    out = _run(["bash", "-euo", "pipefail", "-c", block.code], tmp_path)
  if "gradient-size reduction" in block.code:  # the first example: private, within budget, sparse
    epsilon, reduction = re.search(r"epsilon ([\d.]+); gradient-size reduction ([\d,]+)x",
                                   out).groups()
    assert 0 < float(epsilon) <= 1.0
    assert float(reduction.replace(",", "")) > 100  # rows of the table / rows updated per step
    assert "satisfies (" in out and "-DP" in out


def test_the_parse_check_refuses_a_flag_the_command_does_not_have():
  block = Block(("test",), "bash", "sparse-dp train \\\n  --no-such-flag 3\n", "parse-only", "x")
  assert sparse_dp_command_lines(block.code) == [["train", "--no-such-flag", "3"]]
  with pytest.raises(AssertionError, match="refused by its parser"):
    _parse(block)


def test_redirections_are_not_arguments_of_the_command():
  script = ("sparse-dp train --json > out.json 2>&1 && sparse-dp privacy --epsilon 1 2> err <in\n"
            "sparse-dp audit --json >>log 2> /dev/null | tee x\n")
  assert sparse_dp_command_lines(script) == [["train", "--json"], ["privacy", "--epsilon", "1"],
                                             ["audit", "--json"]]


@pytest.mark.slow
def test_the_manual_builds_with_mkdocs_strict(tmp_path):
  done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                         "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                        timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
  assert done.returncode == 0, done.stderr[-5000:]
  assert (tmp_path / "site" / "reference" / "training" / "index.html").is_file()


def test_papers_are_cited_by_authors_and_venue():
  listed = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.ipynb"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout.split()
  numbered = re.compile(r"seed ?0\d\d|seed[s]/|stored[ ]seed|core[ ]paper", re.IGNORECASE)
  assert [name for name in listed
          if numbered.search((ROOT / name).read_text(errors="ignore"))] == []
