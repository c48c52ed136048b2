"""Checks the Bazel BUILD files against the source tree (docs/style.md §4).

Every Python source under agentrl/, kernels/, experiments/, scripts/ and tests/ must be in the
`srcs` of exactly one target; every `*_test.py` must be a `py_test`; every local dep label must
name an existing target; every py_test must be in //:all_tests. BUILD files are Starlark, which
parses as Python, so this needs no Bazel.

Exempt: `__init__.py` (Bazel creates package markers itself), the root `setup.py` and
`conftest.py` (pip and pytest plumbing, not Bazel sources).
"""
import ast
import os
import pathlib

from absl.testing import absltest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("agentrl", "kernels", "experiments", "scripts", "tests")
RULES = ("py_library", "py_test", "py_binary", "test_suite", "filegroup")
SKIP_DIRS = {".git", "__pycache__", ".ci-venv", "venv", ".venv", "build", "runs"}


def _build_files():
  for dirpath, dirnames, filenames in os.walk(ROOT):
    dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info")]
    if "BUILD" in filenames:
      yield pathlib.Path(dirpath) / "BUILD"


def _literal(node):
  try:
    return ast.literal_eval(node)
  except ValueError:
    return None  # e.g. glob(...); not used in this repo


def parse_build(path: pathlib.Path):
  """Returns [(rule, kwargs)] for each rule call at the top level of a BUILD file."""
  tree = ast.parse(path.read_text(), filename=str(path))
  targets = []
  for stmt in tree.body:
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
      continue
    call = stmt.value
    name = call.func.id if isinstance(call.func, ast.Name) else None
    if name in RULES:
      targets.append((name, {kw.arg: _literal(kw.value) for kw in call.keywords}))
  return targets


def _package(build: pathlib.Path) -> str:
  rel = build.parent.relative_to(ROOT).as_posix()
  return "" if rel == "." else rel


def _resolve(label: str, package: str) -> str | None:
  """Canonical '//pkg:name' for a local label, None for external (@pip//...) ones."""
  if label.startswith("@"):
    return None
  if label.startswith(":"):
    return f"//{package}{label}"
  if label.startswith("//"):
    if ":" in label:
      return label
    pkg = label[2:]
    return f"{label}:{pkg.rsplit('/', 1)[-1]}"
  return f"//{package}:{label}"


class BuildTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.targets = {}  # '//pkg:name' -> (rule, kwargs, package)
    for build in _build_files():
      package = _package(build)
      for rule, kwargs in parse_build(build):
        label = f"//{package}:{kwargs['name']}"
        self.assertNotIn(label, self.targets, f"{build}: duplicate target {label}")
        self.targets[label] = (rule, kwargs, package)

  def test_every_source_is_in_exactly_one_target(self):
    owners = {}
    for label, (_, kwargs, package) in self.targets.items():
      for src in kwargs.get("srcs") or []:
        path = (pathlib.Path(package) / src).as_posix()
        self.assertTrue((ROOT / path).exists(), f"{label} lists missing source {path}")
        owners.setdefault(path, []).append(label)
    sources = []
    for top in SOURCE_DIRS:
      for path in sorted((ROOT / top).rglob("*.py")):
        if SKIP_DIRS & set(path.relative_to(ROOT).parts) or path.name == "__init__.py":
          continue
        sources.append(path.relative_to(ROOT).as_posix())
    self.assertGreater(len(sources), 5)  # the walk found the tree (cannot pass vacuously)
    for path in sources:
      self.assertEqual(len(owners.get(path, [])), 1,
                       f"{path} must be in exactly one BUILD target, found {owners.get(path)}. "
                       "Add a py_library/py_test/py_binary for it in its directory's BUILD.")

  def test_tests_are_py_tests_named_after_their_file(self):
    for label, (rule, kwargs, _) in self.targets.items():
      for src in kwargs.get("srcs") or []:
        if src.endswith("_test.py"):
          self.assertEqual(rule, "py_test", f"{label}: {src} must be a py_test")
          self.assertEqual(kwargs["name"], pathlib.Path(src).stem, label)

  def test_deps_name_existing_targets(self):
    for label, (_, kwargs, package) in self.targets.items():
      for dep in (kwargs.get("deps") or []) + (kwargs.get("tests") or []):
        canonical = _resolve(dep, package)
        if canonical is not None:
          self.assertIn(canonical, self.targets, f"{label} depends on unknown target {dep}")

  def test_all_tests_suite_covers_every_py_test(self):
    suite = self.targets.get("//:all_tests")
    self.assertIsNotNone(suite, "the root BUILD needs test_suite(name = 'all_tests')")
    listed = {_resolve(t, "") for t in suite[1].get("tests") or []}
    for label, (rule, _, _) in self.targets.items():
      if rule == "py_test":
        self.assertIn(label, listed, f"{label} is missing from //:all_tests")


  def test_binaries_depend_only_on_libraries(self):
    # An experiment is a one-file fork: what two experiments share is library code.
    binaries = [label for label, (rule, _, _) in self.targets.items() if rule == "py_binary"]
    self.assertIn("//experiments/policy:grpo", binaries)
    for label in binaries:
      _, kwargs, package = self.targets[label]
      for dep in kwargs.get("deps") or []:
        canonical = _resolve(dep, package)
        if canonical is not None and canonical in self.targets:
          self.assertEqual(self.targets[canonical][0], "py_library",
                           f"{label} depends on {dep}, which is not a py_library")

  def test_binary_deps_match_their_imports(self):
    for label, (rule, kwargs, package) in self.targets.items():
      if rule != "py_binary" or not package.startswith("experiments"):
        continue
      local = {_resolve(d, package) for d in kwargs.get("deps") or []} - {None}
      imported = set()
      for src in kwargs["srcs"]:
        imported |= _local_imports(ROOT / package / src)
      self.assertEqual(imported - local, set(), f"{label}: imports without a BUILD dep")
      self.assertEqual(local - imported, set(), f"{label}: BUILD deps it does not import")


def _local_imports(path: pathlib.Path) -> set[str]:
  """'//pkg:module' for every agentrl/kernels/experiments module a file imports."""
  labels = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module:
      for alias in node.names:
        full = f"{node.module}.{alias.name}"
        if (ROOT / (full.replace(".", "/") + ".py")).exists():
          labels.add("//" + node.module.replace(".", "/") + ":" + alias.name)
        elif (ROOT / (node.module.replace(".", "/") + ".py")).exists():
          pkg, _, name = node.module.rpartition(".")
          labels.add("//" + pkg.replace(".", "/") + ":" + name)
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if (ROOT / (alias.name.replace(".", "/") + ".py")).exists():
          pkg, _, name = alias.name.rpartition(".")
          labels.add("//" + pkg.replace(".", "/") + ":" + name)
  return labels


class ForkUnitTest(absltest.TestCase):

  def test_no_experiment_imports_another(self):
    files = sorted((ROOT / "experiments").rglob("*.py"))
    self.assertGreater(len(files), 10)  # the glob found the experiments
    for path in files:
      for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
          names = [node.module]
        elif isinstance(node, ast.Import):
          names = [alias.name for alias in node.names]
        for name in names:
          self.assertFalse(name == "experiments" or name.startswith("experiments."),
                           f"{path.relative_to(ROOT)} imports {name}: an experiment imports only "
                           "agentrl, kernels and third-party packages; move what it shares "
                           "into the library")


if __name__ == "__main__":
  absltest.main()
