"""The README and the pages it indexes stay true: the README is short and reaches every page,
its experiment table and each family's README list every experiment file, the worked example
in docs/components.md runs, every function its tables name exists, and the metrics glossary
is well formed."""
import importlib
import pathlib
import re
import subprocess
import sys
import tempfile

from absl.testing import absltest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
COMPONENTS = (ROOT / "docs" / "components.md").read_text()
METRICS = (ROOT / "docs" / "metrics.md").read_text()
MAX_README_LINES = 300
# Modules whose public functions the objective tables list.
MODULES = ("agentrl.advantages.estimators", "agentrl.losses.aggregation", "agentrl.losses.distill",
           "agentrl.losses.kl",
           "agentrl.losses.policy", "agentrl.losses.preference", "agentrl.losses.ratios",
           "agentrl.losses.regularizers", "agentrl.losses.schedules", "agentrl.losses.value",
           "agentrl.credit.igpo", "agentrl.credit.siop", "agentrl.credit.infopo",
           "agentrl.credit.gigpo", "agentrl.credit.matchtir", "agentrl.credit.spa",
           "agentrl.credit.mapo", "agentrl.credit.certainty_mix", "agentrl.credit.spo",
           "agentrl.credit.oprl", "agentrl.credit.tree", "agentrl.credit.treerl",
           "agentrl.credit.spo_tree", "agentrl.credit.latr", "agentrl.credit.restart",
           "agentrl.rewards.length_rewards", "agentrl.advantages.efficiency",
           "agentrl.rollout.delethink", "agentrl.losses.selection", "agentrl.losses.trust_region",
           "agentrl.losses.consistency", "agentrl.advantages.shaping", "agentrl.rewards.label_free",
           "agentrl.advantages.exploration", "agentrl.losses.guided")
# Backticked words in that section that are values or metric keys, not functions.
NOT_FUNCTIONS = {"k1", "k2", "k3", "abs", "ratio_mean", "ratio_max"}


def _section(text: str, title: str) -> str:
  """From the heading `title` to the next level-2 heading."""
  start = text.index(title)
  end = text.find("\n## ", start + len(title))
  return text[start:] if end < 0 else text[start:end]


def _experiment_files() -> set[tuple[str, str]]:
  """(family, name) of every experiment; experiments/eval.py is ("", "eval")."""
  found = set()
  for p in (ROOT / "experiments").rglob("*.py"):
    if p.stem != "__init__":
      family = p.parent.relative_to(ROOT / "experiments").as_posix()
      found.add(("" if family == "." else family, p.stem))
  return found


def _families() -> list[str]:
  return sorted({family for family, _ in _experiment_files() if family})


class ReadmeTest(absltest.TestCase):

  def test_readme_is_short(self):
    self.assertLessEqual(README.count("\n"), MAX_README_LINES,
                         "README.md is too long: move the detail to a docs/ page")

  def test_ci_blocks_present(self):
    for marker in ("<!-- ci:install -->", "<!-- ci:test -->", "<!-- ci:main -->"):
      self.assertIn(marker, README)

  def test_experiment_table_lists_every_experiment(self):
    # A row's first cell names its family's experiments: `experiments.<family>.<name>`, then
    # the family's other experiments by bare name.
    rows = [line for line in _section(README, "## Experiments").splitlines()
            if line.startswith("| `experiments.")]
    self.assertGreater(len(rows), 5)  # the table was found
    listed = set()
    for row in rows:
      names = re.findall(r"`([a-z0-9_.]+)`", row.split("|")[1])
      family = ".".join(names[0].split(".")[1:-1])
      listed |= {(family, name.split(".")[-1]) for name in names}
    files = _experiment_files()
    self.assertEqual(files - listed, set(), "experiments missing from the README table, or "
                     "listed in another family's row")
    self.assertEqual(listed - files, set(), "README table rows without an experiment file")

  def test_each_family_readme_lists_its_experiments(self):
    for family in _families():
      text = (ROOT / "experiments" / family / "README.md").read_text()
      commands = set(re.findall(rf"python -m experiments\.{family}\.(\w+)", text))
      names = {name for fam, name in _experiment_files() if fam == family}
      self.assertEqual(names - commands, set(), f"experiments/{family}/README.md lacks a "
                       "`python -m` command for these experiments")

  def test_docs_index_reaches_every_page(self):
    index = _section(README, "## Documentation")
    pages = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "docs").glob("*.md"))]
    pages += [f"experiments/{family}/README.md" for family in _families()]
    pages.append("kernels/README.md")
    missing = [page for page in pages if f"]({page})" not in index]
    self.assertEmpty(missing, "pages the README's docs index does not link")

  def test_metrics_table_is_well_formed(self):
    # Each smoke run checks its records against this table (experiments_smoke_test); here, the
    # parts that check cannot see: one row per name, and a "logged by" column that names real
    # RL experiments in the form that test reads.
    rows = [line for line in METRICS.splitlines() if line.startswith("| `")]
    self.assertGreater(len(rows), 20)  # the table was found
    rl = {name for _, name in _experiment_files()} - {"sft", "eval"}
    keys = []
    for row in rows:
      cells = re.split(r"(?<!\\)\|", row)  # a `\|` inside a cell is not a column break
      self.assertLen(cells, 5, f"not a 3-column row: {row}")
      keys += re.findall(r"`([^`]+)`", cells[1])
      by, named = cells[3].strip(), set(re.findall(r"`([^`]+)`", cells[3]))
      self.assertContainsSubset(named, rl, f"'logged by' names a non-RL experiment: {row}")
      self.assertTrue(by.startswith("every RL experiment") or named
                      or by == "no shipped experiment", f"unreadable 'logged by': {row}")
    self.assertEqual(sorted(k for k in set(keys) if keys.count(k) > 1), [],
                     "metrics listed in two rows")

  def test_worked_example_runs(self):
    section = _section(COMPONENTS, "### Worked example")
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    self.assertIn("aggregation.aggregate", code)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
      f.write(code + "\nassert float(jax.numpy.abs(grad_BT[:, [0, 3]]).max()) == 0.0\n")
    result = subprocess.run([sys.executable, f.name], capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])

  def test_named_functions_exist(self):
    modules = [importlib.import_module(m) for m in MODULES]
    table_text = _section(COMPONENTS, "## 1. Objectives and estimators")
    table_text = table_text[:table_text.index("### Worked example")]
    names = set(re.findall(r"`([a-z_][a-z0-9_]*)`", table_text)) - NOT_FUNCTIONS
    self.assertGreater(len(names), 30)  # the tables were found
    missing = sorted(n for n in names if not any(hasattr(m, n) for m in modules))
    self.assertEqual(missing, [], "docs/components.md names functions that do not exist")


if __name__ == "__main__":
  absltest.main()
