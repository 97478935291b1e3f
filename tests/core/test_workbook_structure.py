"""The workbook's shape: chapter folders, exercises vs solutions, stubs, set-up files, checked notebook outputs."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from llmrs_core.workbook import CHAPTERS, EXTRA_FOLDERS, exercises

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
STUB = re.compile(
    r"^Exercise (?P<n>\d+)\.(?P<m>\d+) `(?P<qualname>[\w.]+)`: not implemented yet — "
    r"see (?P<notebook>\w+)\.ipynb §(?P<section>\d+\.\d+)$"
)


def chapters_with_exercises() -> list[int]:
    return [n for n, folder in CHAPTERS.items() if (ROOT / "chapters" / folder / "exercises.py").exists()]


def test_every_chapter_folder_has_a_readme():
    for folder in [*CHAPTERS.values(), *EXTRA_FOLDERS]:
        readme = ROOT / "chapters" / folder / "README.md"
        assert readme.exists(), f"chapters/{folder}/README.md is missing"
        assert readme.read_text().strip(), f"chapters/{folder}/README.md is empty"


def test_foundation_chapters_have_notebooks():
    for n in (0, 1):
        folder = CHAPTERS[n]
        assert (ROOT / "chapters" / folder / f"{folder}.ipynb").exists(), f"{folder}.ipynb is missing"


@pytest.mark.parametrize("chapter", chapters_with_exercises())
def test_chapter_is_complete(chapter):
    folder = CHAPTERS[chapter]
    assert (ROOT / "chapters" / folder / f"{folder}.ipynb").exists(), f"chapter {chapter} needs its notebook"
    assert (ROOT / "solutions" / f"{folder}.py").exists(), f"solutions/{folder}.py is missing"
    tests = list((ROOT / "tests" / f"ch{chapter:02d}").glob("test_*.py"))
    assert tests, f"chapter {chapter} has exercises but no tests in tests/ch{chapter:02d}/"
    for test_file in tests:
        for node in ast.parse(test_file.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                assert re.match(rf"test_ex{chapter}_\d+_", node.name), (
                    f"{test_file.name}::{node.name} should be named test_ex{chapter}_M_..."
                )


# -- exercises and solutions expose the same API --------------------------------


def describe(obj) -> object:
    """A comparable description of a public name: signatures, fields, members."""
    if inspect.isclass(obj):
        members = {}
        for name, value in vars(obj).items():
            if name.startswith("_") and name != "__init__":
                continue
            if isinstance(value, (classmethod, staticmethod)):
                members[name] = (type(value).__name__, str(inspect.signature(value.__func__)))
            elif isinstance(value, property):
                members[name] = ("property",)
            elif inspect.isfunction(value):
                members[name] = ("method", str(inspect.signature(value)))
            elif dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}:
                continue  # a field's default: compared with the fields
            else:
                members[name] = ("attribute", repr(value))
        fields = (
            [(f.name, str(f.type), repr(f.default)) for f in dataclasses.fields(obj)]
            if dataclasses.is_dataclass(obj)
            else None
        )
        bases = [b.__name__ for b in obj.__mro__[1:]]
        return {"class": obj.__name__, "bases": bases, "fields": fields, "members": members}
    if callable(obj):
        return ("function", str(inspect.signature(obj)))
    return ("value", type(obj).__name__)


@pytest.mark.parametrize("chapter", chapters_with_exercises())
def test_exercises_and_solutions_have_the_same_api(chapter):
    learner = exercises(chapter, "learner", root=ROOT)
    solutions = exercises(chapter, "solutions", root=ROOT)
    for module in (learner, solutions):
        assert hasattr(module, "__all__"), f"{module.__name__} must list its public names in __all__"
    assert sorted(learner.__all__) == sorted(solutions.__all__)
    for name in learner.__all__:
        ours, theirs = getattr(learner, name), getattr(solutions, name)
        if ours is theirs:
            continue
        got, want = describe(ours), describe(theirs)
        if inspect.isclass(ours):  # the exercise's API is a subset of the engine's class (which may do more)
            want["members"] = {k: v for k, v in want["members"].items() if k in got["members"]}
        assert got == want, f"chapter {chapter}: {name} differs between the two"


# -- every stub raises the pointed error -----------------------------------------


def stub_messages(path: Path) -> dict[str, str | None]:
    """qualname -> the NotImplementedError message its body raises (None if it raises none).

    Public functions and methods, and ``__init__``; a docstring starting with
    "(provided)" marks code given to the learner, which is skipped.
    """
    tree = ast.parse(path.read_text())
    out: dict[str, str | None] = {}

    def visit(body, prefix=""):
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, prefix + node.name + ".")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                not node.name.startswith("_") or node.name == "__init__"
            ):
                if (ast.get_docstring(node) or "").startswith("(provided)"):
                    continue  # given to the learner, not an exercise
                message = None
                for sub in ast.walk(node):
                    if (
                        isinstance(sub, ast.Raise)
                        and isinstance(sub.exc, ast.Call)
                        and getattr(sub.exc.func, "id", None) == "NotImplementedError"
                        and sub.exc.args
                        and isinstance(sub.exc.args[0], ast.Constant)
                    ):
                        message = sub.exc.args[0].value
                out[prefix + node.name] = message

    visit(tree.body)
    return out


@pytest.mark.parametrize("chapter", chapters_with_exercises())
def test_every_stub_raises_its_pointed_error(chapter):
    folder = CHAPTERS[chapter]
    path = ROOT / "chapters" / folder / "exercises.py"
    stubs = stub_messages(path)
    assert stubs, f"{path} has no exercise stubs"
    exercise_numbers = set()
    for qualname, message in stubs.items():
        assert message is not None, f"{qualname} in {path.name} must raise NotImplementedError('Exercise ...')"
        m = STUB.match(message)
        assert m, f"{qualname}: message {message!r} does not follow the 'Exercise N.M `name`: ...' pattern"
        assert int(m["n"]) == chapter, f"{qualname}: exercise number {m['n']}.{m['m']} is not chapter {chapter}"
        assert m["qualname"] == qualname, f"{qualname}: the message names {m['qualname']}"
        assert m["notebook"] == folder, f"{qualname}: the message points to {m['notebook']}.ipynb"
        assert m["section"] == f"{m['n']}.{m['m']}"
        exercise_numbers.add(f"{m['n']}_{m['m']}")
    test_names = " ".join(
        p.read_text() for p in (ROOT / "tests" / f"ch{chapter:02d}").glob("test_*.py")
    )
    for number in exercise_numbers:
        assert f"def test_ex{number}_" in test_names, f"Exercise {number.replace('_', '.')} has no tests"


# -- set-up files -------------------------------------------------------------------


def requirement_names(specs) -> set[str]:
    names = set()
    for spec in specs:
        name = re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0].strip().lower().replace("_", "-")  # PEP 503
        if name and name not in {"python", "pip", "llmrs-core"}:
            names.add(name)
    return names


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    specs, todo = list(project["dependencies"]), ["lab", "dev"]
    while todo:  # the dev extra pulls in others by naming llmrs-core[lab], llmrs-core[serve]
        extra = todo.pop()
        for spec in extras[extra]:
            specs.append(spec)
            m = re.match(r"llmrs-core\[([a-z,]+)\]", spec)
            todo += m.group(1).split(",") if m else []
    wanted = requirement_names(specs)
    listed = []
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("dependencies:"))
    for line in lines[start + 1 :]:
        m = re.match(r"^\s+- ([A-Za-z0-9_.\-]+[^#]*?)\s*(#.*)?$", line)
        if m and not m.group(1).endswith(":"):
            listed.append(m.group(1))
    assert requirement_names(listed) == wanted, (
        "environment.yml and pyproject.toml (dependencies + lab + dev, and the extras dev pulls in) list different packages"
    )


def test_gitignore_keeps_weights_and_environments_out():
    ignored = (ROOT / ".gitignore").read_text().split()
    for pattern in ("models/", "*.gguf", ".venv/", "__pycache__/"):
        assert pattern in ignored, f".gitignore should contain {pattern}"
    if shutil.which("git") and (ROOT / ".git").exists():
        tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout
        # tests/golden/ may hold tiny reference files (a 4 KB torch checkpoint); nothing else may
        weights = [f for f in tracked.splitlines()
                   if re.search(r"\.(gguf|safetensors|bin|whl)$", f) and not f.startswith("tests/golden/")]
        assert not weights, f"model weights are tracked: {weights}"


# -- checked notebook outputs are the same on every CPU (issue 26) -------------------------------
#
# nbval compares a stored output only in cells marked ``# NBVAL_CHECK_OUTPUT``, and CI runs on
# whatever CPU it gets. A checked output must therefore not depend on the CPU: shapes, counts,
# exact integer arithmetic, stored data, truth values of comparisons (against a tolerance that
# float32 rounding justifies), or text from a computation that is bit-reproducible across CPUs.
# Greedy text and logits are not: BLAS kernels and the Numba kernels' vector reductions round
# differently on AVX2 and AVX-512, and the int8 path turns a last-bit difference into a changed
# 8-bit code, so at a near tie another token wins. The README's "Notebook outputs" says the rule;
# this holds what a static check can (``ast``, nothing runs): a checked cell never prints an
# *engine value* unless reduced to a truth value or a shape.

CHECK_OUTPUT = "# NBVAL_CHECK_OUTPUT"
#: calls whose result is the model's arithmetic (a Model's, a network's, an exercise's): text, token ids, logits
ENGINE_CALLS = {"generate", "chat", "logits", "forward", "forward_batch", "generate_ids", "greedy_generate",
                "pipelined_greedy"}
#: matrix products: BLAS, whose kernels (and so their roundings) differ from CPU to CPU
MATRIX_CALLS = {"matmul", "einsum", "dot", "linear", "matvec"}
#: fields and keys that hold what an engine generated
ENGINE_ATTRS = {"token_ids", "output_ids", "new_token_ids", "new_text"}
ENGINE_KEYS = {"text", "token_ids", "output_ids", "logits"}
#: what turns an engine value into a truth value (with a comparison, ``not``), or keeps only its shape
TRUTH_CALLS = {"bool", "all", "any", "isinstance", "array_equal", "array_equiv", "allclose", "isclose",
               "shares_memory"}
TRUTH_METHODS = {"any", "all", "startswith", "endswith", "isdisjoint", "issubset", "issuperset"}
SHAPE_ATTRS = {"shape", "dtype", "ndim"}
MUTATORS = {"append", "extend", "insert", "update", "add", "setdefault"}
PRINTS = {"print", "display"}
#: a printed line may carry its own justification: ``print(...)  # robust: <why it is the same on every CPU>``
ROBUST = re.compile(r"#\s*robust:\s*\S")


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def _truth(node: ast.AST | None) -> bool:
    """Whether an expression is a truth value: a comparison, ``not``, a truth call, ``and``/``or`` of those."""
    if isinstance(node, ast.Compare) or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
        return True
    if isinstance(node, ast.BoolOp):
        return all(_truth(v) for v in node.values)
    if isinstance(node, ast.Constant):
        return isinstance(node.value, bool)
    if isinstance(node, ast.Call):
        name = _call_name(node)
        return name in TRUTH_CALLS or (isinstance(node.func, ast.Attribute) and name in TRUTH_METHODS)
    return False


def _names(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


class EngineValues:
    """Which names hold engine values, followed through a notebook's cells in order (``ast``, nothing runs),
    and what the checked cells print of them."""

    def __init__(self):
        self.names: set[str] = set()
        self.sources = set(ENGINE_CALLS)  # and the notebook's own functions that call one of them
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.truthy: set[str] = set()  # the notebook's functions that return truth values only
        self.problems: list[str] = []
        self.where = ""  # the cell being read, for the messages
        self.lines: list[str] = []  # its source lines
        self.checked = False  # whether nbval compares its output
        self.stack: list[str] = []

    # -- is this expression (or part of it, not reduced to a truth value) an engine value?
    def engine_value(self, node: ast.AST | None, local: dict | None = None) -> bool:
        local = local or {}
        if node is None:
            return False
        if isinstance(node, ast.Compare) or (isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not)):
            return False
        if isinstance(node, ast.Name):
            return local[node.id] if node.id in local else node.id in self.names
        if isinstance(node, ast.Attribute):
            if node.attr in SHAPE_ATTRS:
                return False
            return node.attr in ENGINE_ATTRS or self.engine_value(node.value, local)
        if isinstance(node, ast.Subscript):
            if isinstance(node.slice, ast.Constant) and node.slice.value in ENGINE_KEYS:
                return True
            return self.engine_value(node.value, local)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            return True
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name in TRUTH_CALLS or (isinstance(node.func, ast.Attribute) and node.func.attr in TRUTH_METHODS):
                return False
            if name in self.truthy and isinstance(node.func, ast.Name):
                return False
            if name in self.sources or (name in MATRIX_CALLS and name not in self.functions):
                return True
            parts = [*node.args, *(k.value for k in node.keywords)]
            if isinstance(node.func, ast.Attribute):
                parts.append(node.func.value)
            return any(self.engine_value(p, local) for p in parts)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            inner = dict(local)  # the loop variables shadow the notebook's names
            for gen in node.generators:
                value = self.engine_value(gen.iter, inner)
                inner.update(dict.fromkeys(_names(gen.target), value))
            parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            parts += [cond for gen in node.generators for cond in gen.ifs]
            return any(self.engine_value(p, inner) for p in parts)
        if isinstance(node, ast.Lambda):
            params = [a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]]
            return self.engine_value(node.body, {**local, **dict.fromkeys(params, False)})
        return any(self.engine_value(child, local) for child in ast.iter_child_nodes(node))

    def bind(self, target: ast.AST, value: bool) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.bind(element, value)
            return
        if isinstance(target, ast.Starred):
            self.bind(target.value, value)
            return
        if isinstance(target, (ast.Subscript, ast.Attribute)):
            if value:  # x[k] = engine value: x holds one
                while isinstance(target, (ast.Subscript, ast.Attribute)):
                    target = target.value
                self.names |= set(_names(target))
            return
        for name in _names(target):
            (self.names.add if value else self.names.discard)(name)

    # -- what the statements do, in order
    def run(self, body: list[ast.stmt], top: bool = False) -> None:
        for i, stmt in enumerate(body):
            self.statement(stmt, last=top and i == len(body) - 1)

    def statement(self, stmt: ast.stmt, last: bool = False) -> None:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.functions[stmt.name] = stmt
            if any((isinstance(n, ast.Call) and (_call_name(n) in self.sources or _call_name(n) in MATRIX_CALLS))
                   or (isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult)) for n in ast.walk(stmt)):
                self.sources.add(stmt.name)
            else:
                self.sources.discard(stmt.name)
            returns = [n.value for n in ast.walk(stmt) if isinstance(n, ast.Return)]
            if returns and all(_truth(r) for r in returns):
                self.truthy.add(stmt.name)
            else:
                self.truthy.discard(stmt.name)
            return
        if isinstance(stmt, ast.ClassDef):
            return
        self.calls(stmt)
        if isinstance(stmt, ast.Assign):
            value = self.engine_value(stmt.value)
            for target in stmt.targets:
                self.bind(target, value)
        elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) and stmt.value is not None:
            value = self.engine_value(stmt.value)
            if value or isinstance(stmt, ast.AnnAssign):
                self.bind(stmt.target, value)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            self.bind(stmt.target, self.engine_value(stmt.iter))
            self.run(stmt.body)
            self.run(stmt.body)  # what one iteration binds, the next reads
            self.run(stmt.orelse)
        elif isinstance(stmt, ast.While):
            self.run(stmt.body)
            self.run(stmt.body)
            self.run(stmt.orelse)
        elif isinstance(stmt, ast.If):
            self.run(stmt.body)
            self.run(stmt.orelse)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, self.engine_value(item.context_expr))
            self.run(stmt.body)
        elif isinstance(stmt, ast.Try):
            self.run(stmt.body)
            for handler in stmt.handlers:
                self.run(handler.body)
            self.run(stmt.orelse)
            self.run(stmt.finalbody)
        elif isinstance(stmt, ast.Expr) and last and self.checked:
            value = stmt.value
            shown = not isinstance(value, (ast.Call, ast.Await, ast.Constant)) or _call_name(value) in self.sources
            if shown:
                self.printed(value, stmt)

    def calls(self, stmt: ast.stmt) -> None:
        """The calls of one simple statement (compound statements' own expressions: their tests and iterables)."""
        exprs = [stmt] if not isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith,
                                                 ast.Try)) else [getattr(stmt, "iter", None), getattr(stmt, "test", None),
                                                                 *(i.context_expr for i in getattr(stmt, "items", []))]
        for expr in exprs:
            if expr is None:
                continue
            for node in ast.walk(expr):
                if not isinstance(node, ast.Call):
                    continue
                name = _call_name(node)
                func = node.func
                if name in PRINTS and self.checked:
                    for arg in node.args:
                        self.printed(arg, node)
                elif name in MUTATORS and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                    if any(self.engine_value(a) for a in node.args):
                        self.names.add(func.value.id)
                if name in self.functions and isinstance(func, ast.Name) and self.checked:
                    self.call_function(self.functions[name], node)
                if name in self.sources and self.checked:  # callbacks (on_text=...) receive engine values
                    for arg in [*node.args, *(k.value for k in node.keywords)]:
                        if isinstance(arg, ast.Name) and arg.id in self.functions:
                            self.call_function(self.functions[arg.id], None)

    def call_function(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call | None) -> None:
        """A checked cell calls a function of the notebook: what it prints lands in the cell. Its parameters
        hold engine values where the call passes them (``call`` None: a callback, every parameter)."""
        if fn.name in self.stack or len(self.stack) > 4:
            return
        params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]]
        if call is None:
            tainted = set(params)
        else:
            tainted = {p for p, a in zip(params, call.args) if self.engine_value(a)}
            tainted |= {k.arg for k in call.keywords if k.arg and self.engine_value(k.value)}
        saved = set(self.names)
        self.names = (self.names - set(params)) | tainted
        self.stack.append(fn.name)
        try:
            self.run(fn.body)
        finally:
            self.stack.pop()
            self.names = saved

    def printed(self, expr: ast.AST, at: ast.AST) -> None:
        if not self.engine_value(expr):
            return
        lines = self.lines[at.lineno - 1 : at.end_lineno] if not self.stack else []
        if any(ROBUST.search(line) for line in lines):
            return
        inside = f" (inside {self.stack[-1]}())" if self.stack else ""
        problem = f"{self.where}, line {at.lineno}{inside}: prints {ast.unparse(expr)[:80]!r}"
        if problem not in self.problems:
            self.problems.append(problem)


def unportable_outputs(path: Path) -> list[str]:
    """Every place where a checked cell of the notebook at ``path`` prints an engine value."""
    nb = json.loads(path.read_text())
    values = EngineValues()
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        values.where = f"{path.parent.name} cell {index}"
        values.lines = src.splitlines()
        values.checked = CHECK_OUTPUT in src
        values.run(ast.parse(src).body, top=True)
    return values.problems


def checked_notebooks() -> list[Path]:
    return sorted(ROOT.glob("chapters/*/*.ipynb"))


@pytest.mark.parametrize("path", checked_notebooks(), ids=lambda p: p.parent.name)
def test_checked_cells_print_no_engine_value(path):
    problems = unportable_outputs(path)
    assert not problems, (
        f"{path.name}: a cell marked {CHECK_OUTPUT!r} prints what the model computed (text, token ids, logits "
        "or a matrix product), which differs from CPU to CPU at a near tie or in the last bits:\n  "
        + "\n  ".join(problems)
        + "\nprint a comparison instead (same tokens as ...: True, within float32_tolerance: True, "
        "text.startswith(...)), move the raw print to an unchecked cell, or, where the printed value does not come "
        "from the arithmetic (a count of launches, a stored figure), say why on the line: '# robust: <why>'"
    )


def _cells_problems(*cells: tuple[bool, str]) -> list[str]:
    """The checker on a notebook of the given (checked?, source) code cells."""
    values = EngineValues()
    for index, (checked, src) in enumerate(cells):
        values.where, values.lines, values.checked = f"cell {index}", src.splitlines(), checked
        values.run(ast.parse(src).body, top=True)
    return values.problems


@pytest.mark.parametrize("cells", [
    [(True, 'print(repr(model.generate("The capital of France is", max_tokens=8).text))')],
    [(False, 'runs = {n: m.generate(p, max_tokens=8) for n, m in models.items()}'),
     (True, 'for name, run in runs.items():\n    print(f"{name}: {run.text!r}")')],
    [(False, "out = [net.forward(ids)]"), (True, 'print("logits:", out[0][0, :3])')],
    [(True, "print(f'{(x @ w.T).max():.6f}')")],
    [(True, "def on_text(piece):\n    print(piece, end='')\n\nmodel.chat(messages, on_text=on_text)")],
    [(True, "def answer(p):\n    return model.generate(p).token_ids\n\nprint(answer('Hi'))")],
    [(True, "tokens = model.generate(p).token_ids\nprint(len(tokens), 'tokens')")],
    [(True, "reply = model.chat(messages)\nreply.text")],
], ids=["text", "through-cells", "logits", "matmul", "callback", "function", "length", "displayed"])
def test_the_checker_finds_engine_values(cells):
    assert _cells_problems(*cells), "the checker let an engine value through"


@pytest.mark.parametrize("cells", [
    [(True, 'a, b = m1.generate(p), m2.generate(p)\nprint("same tokens:", a.token_ids == b.token_ids)')],
    [(True, 'answer = model.generate(p, max_tokens=2).text\nprint("Paris?", answer.startswith(" Paris"))')],
    [(True, "err = normalised_error(gpu.logits(ids), cpu.logits(ids))\nprint(err <= float32_tolerance(576))")],
    [(True, "logits = net.forward(ids)\nprint('shape', logits.shape, logits.dtype)")],
    [(True, "print(np.allclose(net.forward(a), net.forward(b), atol=1e-3), not np.isnan(net.forward(a)).any())")],
    [(False, "logits = net.forward(ids)"), (True, "logits = np.zeros(3)\nprint(logits)")],
    [(True, "n = count_launches(lambda: net.forward(ids))\nprint(n)  # robust: launches counted, no value")],
    [(True, "print(len(tok.encode('hello')), cfg.n_params)")],
], ids=["comparison", "startswith", "tolerance", "shape", "truth-calls", "reassigned", "robust-comment", "no-engine"])
def test_the_checker_lets_robust_outputs_pass(cells):
    assert not _cells_problems(*cells)
