"""The documentation site builds with warnings as errors (a broken link between pages is one), and README.md's
links and commands are the ones users and CI rely on."""

import os
import re
import shutil
import subprocess
import sys

from tests.cli import TIMEOUT_S

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
SPHINX = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-E", "-q", "-b", "html"]


def _build(src, out):
  return subprocess.run([*SPHINX, str(src), str(out)], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_docs_build_without_warnings(tmp_path):
  result = _build(DOCS, tmp_path / "html")
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
  for page in ("index", "getting_started", "reference/config", "reference/released_recipes", "reference/fits",
               "reference/api"):
    assert (tmp_path / "html" / f"{page}.html").is_file(), page
  api = (tmp_path / "html" / "reference" / "api.html").read_text(encoding="utf-8")
  for name in ("glmrl.grpo.policy_loss", "glmrl.grpo.group_advantages", "glmrl.policy.registry.trained",
               "glmrl.rewards.registry.register"):
    assert f'id="{name}"' in api, f"autodoc did not document {name}"


def test_a_broken_link_between_pages_fails_the_build(tmp_path):
  """The site's own settings (docs/conf.py) turn a link to a missing page or heading into an error."""
  src = tmp_path / "src"
  src.mkdir()
  shutil.copy(os.path.join(DOCS, "conf.py"), src / "conf.py")
  (src / "index.md").write_text("# Index\n\n```{toctree}\nother\n```\n", encoding="utf-8")
  (src / "other.md").write_text("# Other\n\n## A heading\n\n[fine](other.md#a-heading)\n", encoding="utf-8")
  assert _build(src, tmp_path / "ok").returncode == 0
  broken = ("[gone](missing.md)", "[gone](other.md#no-such-heading)", "[gone](../nowhere/file.py)")
  (src / "other.md").write_text("# Other\n\n## A heading\n\n" + "\n\n".join(broken) + "\n", encoding="utf-8")
  result = _build(src, tmp_path / "broken")
  assert result.returncode != 0, result.stderr[-2000:]
  assert result.stderr.count("xref_missing") == len(broken), result.stderr[-2000:]


def _readme():
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    return f.read()


def test_readme_links_resolve():
  links = re.findall(r"\]\(([^)\s]+)\)", _readme())
  local = [link for link in links if not re.match(r"[a-z]+://|mailto:|#", link)]
  assert local, "README.md links to no page"
  missing = [link for link in local if not os.path.exists(os.path.join(ROOT, link.split("#")[0]))]
  assert not missing, f"README.md links to missing files: {missing}"


def test_readme_is_short_and_current():
  readme = _readme()
  assert len(readme.splitlines()) <= 200
  assert not re.search(r"\b20\d\d-\d\d-\d\d\b", readme), "a date: dated material goes to docs/benchmarks.md"
  hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", readme) if re.search(r"[a-f]", w) and re.search(r"\d", w)]
  assert not hashes, f"commit hashes in README.md: {hashes}"


def test_readme_holds_the_command_ci_runs():
  with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
    command = [line for line in f.read().splitlines() if "python -m pytest" in line and not line.startswith("#")]
  assert command and all(line in _readme().splitlines() for line in command), command
