"""Shipped files cite only documents that ship: no design notes from outside the repository.

Every `<file>.md` a source, test, BUILD, config, script or doc file mentions must exist in the
repository (relative to the root, the citing file's directory or docs/), nothing may point at
the design notes that lived outside it (FORBIDDEN), no section may be cited after a bare doc
name instead of its file, and every section a citation names ("docs/algorithms.md §1.2",
"docs/style.md C4", lists like "§2.6, §2.8" and ranges like "§4.2-§4.11" included) must be a
heading of that file. Every experiment a shipped file names, as `python -m experiments.<...>` or
as a path `experiments/<...>.py`, must exist (tests excepted: they may name a missing one on
purpose). Pure file reading: the tree is walked, git is not needed.
"""
import os
import pathlib
import re

from absl.testing import absltest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SUFFIXES = (".py", ".md", ".sh", ".toml", ".cfg", ".txt")
# Not shipped: the CI venv, VCS data, run outputs, build and packaging outputs, caches.
SKIP_DIRS = {".ci-venv", ".git", "runs", "build", "dist", "__pycache__", "node_modules"}
# Split so that this file does not contain the strings it forbids.
FORBIDDEN = ("../" + "shared", "shared/" + "docs", "offline_" + "resources")
# A section cited after a bare doc name (no ".md"): ambiguous, and no path a reader can open.
_BARE = re.compile(r"(?<![\w/.-])(algorithms|architecture|style|kernels|offline)\s+(§\d|C\d)")
_MD = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.md)\b")
# A section: §N[.M...] or CN[.M]. A citation is a file then sections joined by ",", "-", "–" or
# "and", across line breaks and comment markers.
_SEC = r"(?:§\d+(?:\.\d+)*|C\d+(?:\.\d+)?)"
_CITATION = re.compile(
    r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.md)[\s#]+(" + _SEC + r"(?:\s*(?:,|-|–|and)[\s#]*"
    + _SEC + r")*)")
# An experiment named as a module to run, or as a file (`--config=experiments/<...>.py:preset`).
_EXPERIMENT_MODULE = re.compile(r"python -m (experiments(?:\.\w+)+)")
_EXPERIMENT_FILE = re.compile(r"(?<![\w/.<-])(experiments/[\w/]+\.py)\b")


def _skipped_dir(path: pathlib.Path) -> bool:
  return (path.name in SKIP_DIRS or path.name.endswith(".egg-info")
          or (path.name.startswith(".") and path != ROOT)
          or (path / "pyvenv.cfg").is_file())  # any virtual environment


def _shipped() -> list[pathlib.Path]:
  found = []
  for top, dirs, files in os.walk(ROOT):
    top = pathlib.Path(top)
    dirs[:] = sorted(d for d in dirs if not _skipped_dir(top / d))
    found += [top / f for f in sorted(files) if f.endswith(SUFFIXES) or f == "BUILD"]
  return found


def _resolve(name: str, citing: pathlib.Path) -> pathlib.Path | None:
  for candidate in (ROOT / name, citing.parent / name, ROOT / "docs" / name):
    if candidate.is_file():
      return candidate
  return None


def _headings(path: pathlib.Path) -> set[str]:
  """'§1', '§1.2', 'C4' for headings like '## 1. Title', '### 1.2 Title', '### C4. Title'."""
  found = set()
  for line in path.read_text(encoding="utf-8").splitlines():
    m = re.match(r"#+ (C\d+|\d+(?:\.\d+)*)\.? ", line)
    if m:
      found.add(m.group(1) if m.group(1).startswith("C") else "§" + m.group(1))
  return found


def _section_exists(target: pathlib.Path, section: str) -> bool:
  if re.fullmatch(r"C\d+\.\d+", section):  # an item inside a rule, written "C11.5" there
    return section.split(".")[0] in _headings(target) and section in target.read_text("utf-8")
  return section in _headings(target)


class DocsTest(absltest.TestCase):

  def test_the_walk_finds_the_tree(self):
    names = {p.relative_to(ROOT).as_posix() for p in _shipped()}
    for expected in ("README.md", "docs/algorithms.md", "agentrl/losses/policy.py", "BUILD"):
      self.assertIn(expected, names)
    self.assertFalse(any(n.startswith((".ci-venv/", ".git/", "runs/")) for n in names))

  def test_no_reference_outside_the_repository(self):
    bad = []
    for path in _shipped():
      text = path.read_text(encoding="utf-8", errors="replace")
      bad += [f"{path.relative_to(ROOT)}: mentions {n}" for n in FORBIDDEN if n in text]
      bad += [f"{path.relative_to(ROOT)}: cites {m.group(0)!r}; name the file, docs/"
              f"{m.group(1)}.md" for m in _BARE.finditer(text)]
    self.assertEmpty(bad, "\n".join(bad))

  def test_every_cited_markdown_file_exists(self):
    missing = []
    for path in _shipped():
      text = path.read_text(encoding="utf-8", errors="replace")
      missing += [f"{path.relative_to(ROOT)}: cites {name}"
                  for name in sorted(set(_MD.findall(text))) if _resolve(name, path) is None]
    self.assertEmpty(missing, "\n".join(missing))

  def test_every_cited_section_exists(self):
    missing, checked = [], 0
    for path in _shipped():
      text = path.read_text(encoding="utf-8", errors="replace")
      for name, sections in set(_CITATION.findall(text)):
        target = _resolve(name, path)
        for section in re.findall(_SEC, sections):
          checked += 1
          if target is None or not _section_exists(target, section):
            missing.append(f"{path.relative_to(ROOT)}: {name} {section}")
    self.assertGreater(checked, 50)  # the citations were found (cannot pass vacuously)
    self.assertEmpty(missing, "\n".join(sorted(missing)))

  def test_every_named_experiment_exists(self):
    missing, checked = [], 0
    for path in _shipped():
      if path.name.endswith("_test.py"):
        continue
      text = path.read_text(encoding="utf-8", errors="replace")
      files = [m.replace(".", "/") + ".py" for m in _EXPERIMENT_MODULE.findall(text)]
      files += _EXPERIMENT_FILE.findall(text)
      checked += len(files)
      missing += [f"{path.relative_to(ROOT)}: names {f}" for f in sorted(set(files))
                  if not (ROOT / f).is_file()]
    self.assertGreater(checked, 100)  # the commands were found
    self.assertEmpty(missing, "\n".join(missing))


if __name__ == "__main__":
  absltest.main()
