"""Keeps model text from running as Python in verifier workers (`bounded.Pool(untrusted=True)`).

Some scorers hand the answer to Python's evaluator. sympy's `parse_expr` (and `sympify` of a
string, which calls it) rewrites the text into Python source and ends in
`sympy.parsing.sympy_parser.eval_expr`, a plain `eval` whose globals hold all of sympy and the
builtins: reasoning-gym's simple_integration, intermediate_integration,
polynomial_multiplication, puzzle24 and countdown scorers run `open('/x', 'w')` or
`__import__('os').system(...)` given as an answer. Its binary_matrix, spiral_matrix,
string_insertion and n_queens scorers call `eval(answer)` to accept a Python list. In a worker,
`install()` (once, at start) and `guard()` (around each untrusted call) close both paths:

  - sympy: `eval_expr` (and `evaluateFalse`, for `parse_expr(..., evaluate=False)`) are
    replaced by versions that parse the code with `ast`, allow only arithmetic, comparisons,
    tuples and lists, numbers, and names and calls from `SYMPY_NAMES` (plus the caller's
    `local_dict`), with strings only as the argument of Symbol, Function, Integer, Float or
    Rational, and evaluate that tree themselves: the text is never passed to `eval`.
    Attributes, subscripts, lambdas, comprehensions, builtins (open, eval, __import__, getattr,
    chr) and string parsers (sympify, S, parse_expr, lambdify, symbols, var) raise ValueError,
    which the scorers turn into a 0 score.
  - `eval` in the modules of `EVAL_GUARDED_PACKAGES` is shadowed by `literal_eval`: literals
    (numbers, strings, lists, tuples, sets, dicts) and arithmetic on them, no names or calls.
    Those packages also `eval` their own generated text (`(0x3f << 2) + 5`), which it accepts.

Defense in depth: an audit hook (`sys.addaudithook`), active only inside `guard()`, refuses what
an answer should never cause: opening a file for writing; removing, renaming, creating or
changing files; starting processes (subprocess, os.system, exec, spawn, fork); signals to other
processes; sockets; ctypes; changing resource limits; building code objects by hand. Reads stay
allowed (lazy imports read files), and the worker's own socket I/O raises no audit event. The
refusal raises PermissionError in the caller and is recorded, so a scorer that swallows it
still cannot return a score (`take_refusal`). Audit hooks are a tripwire, not a sandbox: code
that already runs can reach the operating system without an audited call (os.write on a known
descriptor, a C extension) or turn the hook off by changing this module's state. The sandbox
is the AST check; the hook catches what it might miss.
"""
import ast
import builtins
import contextlib
import operator
import os
import sys
import types
from typing import Any, Callable

# Python-level names an answer may use in sympy's parser (after its transformations: `2x` is
# `Integer(2)*Symbol('x')`, `5!` is `factorial(Integer(5))`, `f(x)` is `Function('f')(...)`).
SYMPY_NAMES = frozenset("""
    Symbol Function Integer Float Rational Add Mul Pow Mod Tuple Matrix
    pi E I oo zoo nan EulerGamma GoldenRatio Catalan true false
    exp log ln sqrt cbrt root real_root Abs abs sign floor ceiling frac Max Min max min
    re im arg conjugate factorial factorial2 binomial gamma erf erfc
    sin cos tan cot sec csc asin acos atan acot asec acsc atan2
    sinh cosh tanh coth sech csch asinh acosh atanh acoth asech acsch
    Eq Ne Lt Le Gt Ge And Or Not Xor Implies Piecewise
    FiniteSet Interval Union Intersection Complement EmptySet
    Derivative Integral Sum Product Limit
""".split())
# Calls whose positional arguments may be string constants, as sympy's transformations write them
# (`Symbol('x')`, `Float('1.5e3')`); none of them parses its string as an expression.
_STRING_ARGUMENT_CALLS = frozenset(("Symbol", "Function", "Integer", "Float", "Rational"))
# Packages whose scorers `eval` model text; a module of theirs sees `literal_eval` as `eval`.
EVAL_GUARDED_PACKAGES = ("reasoning_gym", "math_verify", "latex2sympy2_extended")

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
           ast.BitOr: operator.or_, ast.BitXor: operator.xor, ast.BitAnd: operator.and_}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Invert: operator.invert,
          ast.Not: operator.not_}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
            ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}
_SCALARS = (int, float, complex, bool, type(None))


class _Evaluator:
  """Checks and evaluates one expression tree; `names` resolves the names it may use."""

  def __init__(self, names: Callable[[str], Any] | None):
    self.names = names  # None: no names or calls (literal_eval)

  def refuse(self, node: ast.AST, what: str = "") -> ValueError:
    what = what or type(node).__name__
    return ValueError(f"refused to evaluate model text: {what} is not allowed")

  def value(self, node: ast.AST, string_ok: bool = False) -> Any:
    kind = type(node)
    if kind is ast.Constant:
      if isinstance(node.value, _SCALARS) or (isinstance(node.value, str) and string_ok):
        return node.value
      raise self.refuse(node, f"the constant {node.value!r:.40}")
    if kind is ast.BinOp and type(node.op) in _BINARY:
      return _BINARY[type(node.op)](self.value(node.left), self.value(node.right))
    if kind is ast.UnaryOp and type(node.op) in _UNARY:
      return _UNARY[type(node.op)](self.value(node.operand))
    if kind is ast.Compare and all(type(op) in _COMPARE for op in node.ops):
      return self.compare(node)
    if kind in (ast.Tuple, ast.List, ast.Set):
      items = [self.value(item, string_ok and self.names is None) for item in node.elts]
      return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[kind](items)
    if kind is ast.Dict and self.names is None and None not in node.keys:
      return {self.value(k, True): self.value(v, True) for k, v in zip(node.keys, node.values)}
    if self.names is not None and kind is ast.Name:
      return self.names(node.id)
    if self.names is not None and kind is ast.Call:
      return self.call(node)
    raise self.refuse(node)

  def compare(self, node: ast.Compare) -> Any:
    left, result = self.value(node.left), True
    for op, right_node in zip(node.ops, node.comparators):  # as Python chains comparisons
      right = self.value(right_node)
      result = _COMPARE[type(op)](left, right)
      if len(node.ops) > 1 and not result:
        return result
      left = right
    return result

  def call(self, node: ast.Call) -> Any:
    strings = isinstance(node.func, ast.Name) and node.func.id in _STRING_ARGUMENT_CALLS
    if not isinstance(node.func, (ast.Name, ast.Call)):  # `Function('f')(x)` calls a call
      raise self.refuse(node.func, f"calling {type(node.func).__name__}")
    fn = self.value(node.func)
    args = [self.value(arg, strings) for arg in node.args]
    kwargs = {}
    for keyword in node.keywords:
      if keyword.arg is None or keyword.arg.startswith("_"):
        raise self.refuse(keyword, f"the keyword {keyword.arg or '**'}")
      kwargs[keyword.arg] = self.value(keyword.value)
    return fn(*args, **kwargs)


def _parse(source: str) -> ast.AST:
  try:
    return ast.parse(source.lstrip(" \t"), mode="eval").body  # eval() strips these too
  except (SyntaxError, ValueError) as e:
    raise ValueError(f"refused to evaluate model text: {e}") from None


def _sympy_names(local_dict: dict, global_dict: dict) -> Callable[[str], Any]:
  def resolve(name: str) -> Any:
    if name.startswith("_") or not (name in SYMPY_NAMES or name in local_dict):
      raise ValueError(f"refused to evaluate model text: the name {name!r} is not allowed")
    for scope in (local_dict, global_dict):  # as eval(code, global_dict, local_dict)
      if name in scope:
        return scope[name]
    raise NameError(f"name {name!r} is not defined")
  return resolve


_checked_code: dict[tuple, ast.AST] = {}  # evaluateFalse's tree, for parse_expr's eval_expr


def _code_key(code: types.CodeType) -> tuple:
  return code.co_code, code.co_consts, code.co_names  # not co_flags: __future__ imports differ


def sympy_eval_expr(code: str | types.CodeType, local_dict: dict, global_dict: dict) -> Any:
  """Replacement of sympy_parser.eval_expr: evaluates the code only within the allow-list."""
  if isinstance(code, types.CodeType):
    tree = _checked_code.pop(_code_key(code), None)
    if tree is None:
      raise ValueError("refused to evaluate a code object that sympy_evaluate_false did not "
                       "check")
  else:
    tree = _parse(code)
  return _Evaluator(_sympy_names(local_dict, global_dict)).value(tree)


def _checking_evaluate_false(original: Callable[[str], ast.Expression]):
  def sympy_evaluate_false(source: str) -> ast.Expression:
    """Replacement of sympy_parser.evaluateFalse: parse_expr compiles its tree and hands the
    code object to eval_expr, which evaluates the tree recorded here instead."""
    tree = original(source)
    _checked_code.clear()  # one parse at a time per worker
    _checked_code[_code_key(compile(tree, "<string>", "eval"))] = tree.body  # as parse_expr's
    return tree
  return sympy_evaluate_false


def literal_eval(source: str | bytes, *unused_scopes) -> Any:
  """`eval` for guarded modules: literals and arithmetic on them (no names, calls, attributes).

  The scopes (eval's globals and locals) are ignored: the expression may use no names.
  """
  if isinstance(source, bytes):
    source = source.decode()
  if not isinstance(source, str):
    raise TypeError(f"literal_eval takes a string, not {type(source).__name__}")
  return _Evaluator(None).value(_parse(source), string_ok=True)


# ------------------------------------------------------------------------- worker guards


def install() -> None:
  """Once per worker, before any untrusted call: patches sympy's parser and adds the hook."""
  sys.dont_write_bytecode = True  # imports during a call would otherwise write .pyc files
  try:
    from sympy.parsing import sympy_parser  # pylint: disable=g-import-not-at-top
  except ImportError:
    sympy_parser = None
  if sympy_parser is not None and sympy_parser.eval_expr is not sympy_eval_expr:
    sympy_parser.evaluateFalse = _checking_evaluate_false(sympy_parser.evaluateFalse)
    sympy_parser.eval_expr = sympy_eval_expr
  sys.addaudithook(_audit)


class _State:
  enforcing = False
  refusal = ""


def _guard_eval_in_loaded_modules() -> None:
  for name, module in list(sys.modules.items()):
    if (name.split(".")[0] in EVAL_GUARDED_PACKAGES and isinstance(module, types.ModuleType)
        and getattr(module, "eval", None) is not literal_eval):
      module.eval = literal_eval  # shadows the builtin for the module's own code


@contextlib.contextmanager
def guard():
  """Inside: `eval` of guarded modules is literal_eval and the audit hook refuses (see top)."""
  _guard_eval_in_loaded_modules()
  _State.enforcing = True
  try:
    yield
  finally:
    _State.enforcing = False


def take_refusal() -> str:
  """What the audit hook refused since the last call ("" if nothing), and forgets it."""
  refusal, _State.refusal = _State.refusal, ""
  return refusal


_REFUSED_EVENTS = frozenset((
    "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
    "os.symlink", "os.link", "os.utime", "os.chflags", "os.lchflags", "os.setxattr",
    "os.removexattr", "shutil.rmtree",
    "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.forkpty", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
    "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
    "socket.getaddrinfo", "resource.setrlimit", "resource.prlimit", "code.__new__",
    "function.__new__", "webbrowser.open",
))
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def _writes(mode: Any, flags: Any) -> bool:
  """Whether an "open" audit event opens for writing (builtin open: mode; os.open: flags)."""
  return ((isinstance(mode, str) and any(c in mode for c in "wax+"))
          or (isinstance(flags, int) and flags & _WRITE_FLAGS != 0))


def _audit(event: str, args: tuple) -> None:
  if not _State.enforcing:
    return
  if event == "open":
    refused = _writes(args[1], args[2])
  else:
    refused = event in _REFUSED_EVENTS or event.startswith("ctypes.")
  if refused:
    what = f"{event}{args!r:.200}"
    _State.refusal = _State.refusal or what
    raise PermissionError(f"refused in a verifier of model text: {what}")


def plain_exception(error: BaseException) -> BaseException:
  """error as a builtin exception holding only its message (what an untrusted reply may hold)."""
  message = str(error)[:2000]
  kind = type(error)
  if getattr(builtins, kind.__name__, None) is kind:
    try:
      return kind(message)
    except Exception:  # pylint: disable=broad-except
      pass
  return RuntimeError(f"{kind.__name__}: {message}")
