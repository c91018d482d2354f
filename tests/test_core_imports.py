"""The core install detects texts without the optional extras (serve, lab, corpora, ray, vllm), and the product
never imports the lab."""

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

EXTRAS = (
    "fastapi", "uvicorn", "peft", "matplotlib", "gensim", "datasets", "ray", "vllm",
    "lm_eval", "bitsandbytes", "hqq", "optimum",
)  # fmt: skip
SRC = Path(__file__).parents[1] / "src" / "openstamp"

# A child interpreter in which the extras cannot be imported and importlib.util.find_spec does not
# find them, as if they were never installed (a None entry in sys.modules does both).
GUARD = textwrap.dedent(
    f"""
    import sys
    for name in {EXTRAS!r}:
        sys.modules[name] = None
    """
)


def run_child(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"), *sys.path])}
    return subprocess.run(
        [sys.executable, "-c", GUARD + textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )


def test_detection_runs_without_the_extras(release):
    code = f"""
    import json, sys
    from typer.testing import CliRunner
    from openstamp import Detector

    text = "the river city council voted on a new plan for public parks and schools while farmers reported rain"
    detector = Detector.from_pretrained({str(release / "model")!r}, {str(release / "key")!r})
    api = detector.detect([text])[0]
    lab = sorted(m for m in sys.modules if m.startswith("openstamp.lab"))  # the library alone: none
    from openstamp.cli import app  # the command line adds the lab's commands, which import no lab extra

    args = ["detect", "--model", {str(release / "model")!r}, "--key", {str(release / "key")!r}]
    cli = CliRunner().invoke(app, [*args, "--min-tokens", "4", "--quiet", "--text", text])
    assert cli.exit_code == 0, cli.output
    loaded = sorted(m for m, v in sys.modules.items() if v is not None and m.split(".")[0] in {EXTRAS!r})
    print(json.dumps({{"api": api.status, "cli": json.loads(cli.stdout)["status"], "loaded": loaded, "lab": lab}}))
    """
    child = run_child(code)
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report == {"api": "ok", "cli": "ok", "loaded": [], "lab": []}


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` in ``path`` names, at any depth."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_the_product_never_imports_the_lab():
    product = [p for p in SRC.rglob("*.py") if "lab" not in p.relative_to(SRC).parts]
    assert len(product) > 30  # the walk found the package
    offenders = {
        str(p.relative_to(SRC)): sorted(m for m in imported_modules(p) if m.startswith("openstamp.lab"))
        for p in product
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_lab_commands_join_the_cli_through_the_entry_point():
    from importlib.metadata import entry_points

    from typer.main import get_command

    from openstamp.cli import app

    assert [e.value for e in entry_points(group="openstamp.cli")] == ["openstamp.lab.cli:register"]
    names = set(get_command(app).commands)
    assert {"embed", "detect", "calibrate", "serve", "audit", "export", "demo", "tune"} <= names
    assert {"eval", "report", "store", "merge-runs", "attack", "analyze"} <= names


@pytest.mark.parametrize(
    "code, message",
    [
        ("from openstamp.corpus import load_documents; load_documents('wikipedia')", "openstamp[corpora]"),
        ("from openstamp.corpus import load_documents; load_documents('hf:x:train:text')", "openstamp[corpora]"),
    ],
)
def test_a_missing_extra_is_named(code, message):
    child = run_child(
        f"""
    from openstamp.errors import MissingExtraError
    try:
        {code}
    except MissingExtraError as err:
        print(err)
    """
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert message in child.stdout


def test_engine_ray_without_ray_names_the_extra(release, tmp_path):
    (tmp_path / "in.jsonl").write_text('{"text": "the river"}\n')
    code = f"""
    from typer.testing import CliRunner
    from openstamp.cli import app
    args = ["detect", "--engine", "ray", "--model", {str(release / "model")!r}, "--key", {str(release / "key")!r}]
    result = CliRunner().invoke(app, [*args, {str(tmp_path / "in.jsonl")!r}, "--out", {str(tmp_path / "o")!r}])
    print(result.exit_code, result.output)
    """
    child = run_child(code)
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.startswith("2 ") and "pip install 'openstamp[ray]'" in child.stdout


def product_files() -> list[Path]:
    return [p for p in SRC.rglob("*.py") if "lab" not in p.relative_to(SRC).parts]


def test_at_most_eight_modules_sit_at_the_package_root():
    root = sorted(p.name for p in SRC.glob("*.py"))
    assert "__init__.py" in root and len(root) <= 8, root


def test_detection_never_imports_the_write_side():
    detect = list((SRC / "detect").glob("*.py"))
    assert len(detect) > 5
    offenders = {p.name: sorted(m for m in imported_modules(p) if m.startswith("openstamp.embed")) for p in detect}
    assert {k: v for k, v in offenders.items() if v} == {}


def thread_locals(path: Path) -> list[int]:
    """Lines of ``path`` that make a thread-local (``threading.local()`` or ``local()`` from threading)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr == "local") or (isinstance(f, ast.Name) and f.id == "local"):
                lines.append(node.lineno)
    return lines


def test_the_product_keeps_no_thread_locals():
    assert thread_locals(SRC / "lab" / "hidden.py")  # the check finds the lab's
    found = {str(p.relative_to(SRC)): thread_locals(p) for p in product_files()}
    assert {k: v for k, v in found.items() if v} == {}


def private_uses(path: Path, modules: dict[str, set[str]]) -> list[str]:
    """Private names (one leading underscore) that ``path`` imports from another openstamp module, or reads as an
    attribute of an object that is not ``self`` or ``cls``, where some other module of the package defines them."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
    others = set().union(*(names for p, names in modules.items() if p != str(path))) - own
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("openstamp"):
            uses += [
                f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.startswith("__")
            ]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            target = node.value.id if isinstance(node.value, ast.Name) else None
            if target not in ("self", "cls") and node.attr in others:
                uses.append(f"{target}.{node.attr}")
    return uses


def defined_private_names(paths: list[Path]) -> dict[str, set[str]]:
    """Per file, the private functions, classes and methods it defines."""
    found = {}
    for p in paths:
        tree = ast.parse(p.read_text(encoding="utf-8"))
        found[str(p)] = {
            n.name
            for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
            and n.name.startswith("_")
            and not n.name.startswith("__")
        }
    return found


def test_no_module_calls_another_modules_private_names(tmp_path):
    files = [*SRC.rglob("*.py"), *(SRC.parents[1] / "benchmarks").rglob("*.py")]
    modules = defined_private_names(files)
    found = {str(p.relative_to(SRC.parents[1])): private_uses(p, modules) for p in files}
    assert {k: v for k, v in found.items() if v} == {}
    # the check can fail: a module that calls a detector's private step is caught
    bad = tmp_path / "bad.py"
    bad.write_text("def f(detector):\n    return detector._hidden_step([])\n", encoding="utf-8")
    assert private_uses(bad, {"other.py": {"_hidden_step"}}) == ["detector._hidden_step"]
