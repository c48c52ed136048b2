"""Shipped files cite only documents that ship: no design notes from outside the repository.

Every `<file>.md` a source, test, BUILD or doc file mentions must exist in the repository
(relative to the root, the citing file's directory or docs/), nothing may point at `../shared`
or `shared/docs`, and every "docs/<file>.md §N" or "docs/style.md C<N>" citation must name a
section heading that exists in that file.
"""
import pathlib
import re
import subprocess

from absl.testing import absltest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SUFFIXES = (".py", ".md", ".sh", ".toml", ".cfg", ".txt")
_MD = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.md)\b")
_SECTION = re.compile(r"(docs/[\w-]+\.md) (§\d+(?:\.\d+)*|C\d+)")


def _shipped() -> list[pathlib.Path]:
  out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                       cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
  paths = [ROOT / p for p in out if not p.startswith(("runs/", ".ci-venv/"))]
  return [p for p in paths if p.is_file() and (p.suffix in SUFFIXES or p.name == "BUILD")]


def _headings(path: pathlib.Path) -> set[str]:
  """'§1', '§1.2', 'C4' for headings like '## 1. Title', '### 1.2 Title', '### C4. Title'."""
  found = set()
  for line in path.read_text(encoding="utf-8").splitlines():
    m = re.match(r"#+ (C\d+|\d+(?:\.\d+)*)\.? ", line)
    if m:
      found.add(m.group(1) if m.group(1).startswith("C") else "§" + m.group(1))
  return found


class DocsTest(absltest.TestCase):

  def test_no_reference_outside_the_repository(self):
    bad = []
    for path in _shipped():
      text = path.read_text(encoding="utf-8", errors="replace")
      for needle in ("../shared", "shared/docs"):
        if needle in text and path.name != "docs_test.py":
          bad.append(f"{path.relative_to(ROOT)}: mentions {needle}")
    self.assertEmpty(bad, "\n".join(bad))

  def test_every_cited_markdown_file_exists(self):
    missing = []
    for path in _shipped():
      text = path.read_text(encoding="utf-8", errors="replace")
      for name in set(_MD.findall(text)):
        candidates = (ROOT / name, path.parent / name, ROOT / "docs" / name)
        if not any(c.is_file() for c in candidates):
          missing.append(f"{path.relative_to(ROOT)}: cites {name}")
    self.assertEmpty(missing, "\n".join(missing))

  def test_every_cited_section_exists(self):
    missing = []
    for path in _shipped():
      text = path.read_text(encoding="utf-8", errors="replace")
      for doc, section in set(_SECTION.findall(text)):
        target = ROOT / doc
        if not target.is_file() or section not in _headings(target):
          missing.append(f"{path.relative_to(ROOT)}: {doc} {section}")
    self.assertEmpty(missing, "\n".join(missing))


if __name__ == "__main__":
  absltest.main()
