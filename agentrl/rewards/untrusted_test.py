"""Tests for agentrl.rewards.untrusted: model text is never run as Python in verifier workers."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.rewards import bounded
from agentrl.rewards import untrusted

try:
  import sympy  # pylint: disable=g-import-not-at-top
  from sympy.parsing import sympy_parser  # pylint: disable=g-import-not-at-top
except ImportError:
  sympy = None

_SKIP = "sympy is not installed (pip install -e '.[envs]')"
_SYMPY = {}
if sympy is not None:
  exec("from sympy import *", _SYMPY)  # pylint: disable=exec-used  # parse_expr's global_dict


def _write(path: str) -> None:
  with open(path, "w") as f:
    f.write("x")


def _write_and_swallow(path: str) -> float:
  try:
    _write(path)
  except PermissionError:
    pass
  return 1.0  # a scorer that catches every error must not get a score out


def _read_and_import(path: str) -> str:
  import importlib  # pylint: disable=g-import-not-at-top
  importlib.import_module("wave")  # not imported yet: a lazy import reads (and compiles) files
  with open(path) as f:
    return f.read()


def _parse(text: str) -> str:
  return str(sympy.parse_expr(text))


@absltest.skipIf(sympy is None, _SKIP)
class CheckTest(parameterized.TestCase):

  def test_sympy_code_as_its_transformations_write_it(self):
    x, c = sympy.Symbol("x"), sympy.Symbol("C")
    got = untrusted.sympy_eval_expr(
        "Integer (3 )*Symbol ('x' )**Integer (2 )/Integer (2 )+Symbol ('C' )", {}, _SYMPY)
    self.assertEqual(got, 3 * x**2 / 2 + c)
    got = untrusted.sympy_eval_expr("Function ('f' )(x )+sin (x )*factorial (Integer (5 ))<y",
                                    {"x": x, "y": c}, _SYMPY)
    self.assertEqual(got, sympy.Function("f")(x) + 120 * sympy.sin(x) < c)
    self.assertEqual(untrusted.sympy_eval_expr("Float ('1.5e3' )", {}, _SYMPY),
                     sympy.Float(1500))

  @parameterized.parameters(
      "open ('/tmp/x','w' )", "__import__ ('os' ).getpid ()", "().__class__",
      "Symbol ('x' ).__class__", "Integer (1 ).args [0 ]", "(lambda :1 )()",
      "[c for c in (Integer (1 ),)]", "sympify ('1' )", "S ('1' )", "parse_expr ('1' )",
      "lambdify (Symbol ('x' ),Symbol ('x' ))", "var ('x' )", "symbols ('x' )",
      "getattr (Integer (1 ),'func' )", "Symbol (chr (111 ))", "sin ('x' )", "eval ('1' )",
      "f'{1}'", "Integer (1 )if True else Integer (2 )", "Symbol (**{'name':'x'})",
      "_x", "(x :=Integer (1 ))", "Integer (1 );Integer (2 )")
  def test_sympy_refuses(self, code):
    with self.assertRaisesRegex(ValueError, "refused to evaluate model text"):
      untrusted.sympy_eval_expr(code, {}, dict(_SYMPY, open=open, getattr=getattr, chr=chr,
                                                eval=eval))

  def test_parse_expr_and_sympify_through_the_checked_parser(self):
    unchecked = sympy.parse_expr("x**2/2 - 1", evaluate=False)
    with mock.patch.object(sympy_parser, "eval_expr", untrusted.sympy_eval_expr), \
         mock.patch.object(sympy_parser, "evaluateFalse",
                           untrusted._checking_evaluate_false(sympy_parser.evaluateFalse)):
      x = sympy.Symbol("x")
      self.assertEqual(sympy.parse_expr("2*x**3 - x/2 + 0.[3]"),
                       2 * x**3 - x / 2 + sympy.Rational(1, 3))
      checked = sympy.parse_expr("x**2/2 - 1", evaluate=False)
      self.assertEqual(sympy.srepr(checked), sympy.srepr(unchecked))
      self.assertEqual(sympy.sympify("sqrt(8) + pi"), sympy.sqrt(8) + sympy.pi)
      for text in ("open('f', 'w')", "x.__class__", "sympify(chr(111))"):
        with self.assertRaisesRegex((ValueError, sympy.SympifyError), "refused"):
          sympy.sympify(text)
        with self.assertRaisesRegex(ValueError, "refused"):
          sympy.parse_expr(text, evaluate=False)


class LiteralEvalTest(parameterized.TestCase):

  @parameterized.parameters(("[[1, 0], [0, 1]]", [[1, 0], [0, 1]]), ("['a', 'b']", ["a", "b"]),
                            ("(0x3f << 2) + 5 // 2", 254), (" -1.5", -1.5),
                            ("{'k': (1, None)}", {"k": (1, None)}))
  def test_literal_eval_accepts(self, text, want):
    self.assertEqual(untrusted.literal_eval(text), want)

  @parameterized.parameters("__import__('os')", "().__class__", "[1][0]", "open", "len([])",
                            "[c for c in 'ab']", "'a' * 3", "{**{}}")
  def test_literal_eval_refuses(self, text):
    with self.assertRaisesRegex(ValueError, "refused"):
      untrusted.literal_eval(text)


@absltest.skipIf(sympy is None, _SKIP)
class UntrustedPoolTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.tmp)
    self.pool = bounded.Pool(max_workers=1, untrusted=True)
    self.addCleanup(self.pool.close)

  def test_audit_hook_refuses_a_write_that_skips_the_ast_check(self):
    path = os.path.join(self.tmp, "f")
    with self.assertRaisesRegex(bounded.Refused, r"refused open\('.*f', 'w'"):
      self.pool.call(_write, path)
    with self.assertRaisesRegex(bounded.Refused, "refused open"):
      self.pool.call(_write_and_swallow, path)  # catching the PermissionError does not help
    self.assertFalse(os.path.exists(path))
    trusted = bounded.Pool(max_workers=1)  # the option is off by default
    self.addCleanup(trusted.close)
    trusted.call(_write, path)
    self.assertTrue(os.path.exists(path))

  def test_audit_hook_refuses_processes_signals_and_removal(self):
    victim = subprocess.Popen(["sleep", "60"])
    self.addCleanup(victim.wait)
    self.addCleanup(victim.kill)
    kept = os.path.join(self.tmp, "kept")
    _write(kept)
    for fn, args in ((os.kill, (victim.pid, signal.SIGKILL)), (os.remove, (kept,)),
                     (subprocess.run, (["true"],)), (os.system, ("true",))):
      with self.assertRaisesRegex(bounded.Refused, "refused"):
        self.pool.call(fn, *args)
    self.assertIsNone(victim.poll())
    self.assertTrue(os.path.exists(kept))
    self.assertEqual(self.pool.started, 4)  # each refusing worker was replaced

  def test_the_workers_own_work_goes_on(self):
    path = os.path.join(self.tmp, "r")
    _write(path)
    self.assertEqual(self.pool.call(_read_and_import, path), "x")
    self.assertEqual(self.pool.call(_parse, "x**2 + 2*x"), "x**2 + 2*x")  # sympy, checked
    with self.assertRaisesRegex(ValueError, "refused to evaluate model text"):
      self.pool.call(_parse, "open('f', 'w')")
    self.assertEqual(self.pool.started, 1)
    self.assertIsNot(sympy_parser.eval_expr, untrusted.sympy_eval_expr)  # patched there only

  def test_replies_are_plain(self):
    with self.assertRaisesRegex(ValueError, "invalid literal"):
      self.pool.call(int, "x")  # builtin errors keep their type
    with self.assertRaisesRegex(RuntimeError, "JSONDecodeError: Expecting value"):
      self.pool.call(json.loads, "x")  # others are named in a RuntimeError
    with self.assertRaisesRegex(bounded.Refused, "not plain data"):
      self.pool.call(sympy.Integer, 3)  # a result that would need a class looked up
    self.assertEqual(self.pool.call(abs, -3), 3)


if __name__ == "__main__":
  absltest.main()
