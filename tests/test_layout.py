"""The package's dependencies point one way:
tasks, kernels <- mixers <- config, model <- train <- sweep, analysis, bench <- cli.

Read from the source (every ``import`` and ``from ... import``, at any depth, so an import inside a
function counts too): a module may import from its own layer and the layers below, never above, and
the imports between modules form no cycle."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "sandbox"
LAYERS = [("sandbox.tasks", "sandbox.kernels", "sandbox.recipes"), ("sandbox.mixers",), ("sandbox.config", "sandbox.model"),
          ("sandbox.train",), ("sandbox.sweep", "sandbox.analysis", "sandbox.bench"),
          ("sandbox.cli",)]


def modules() -> dict[str, Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the package that ``name`` imports (``from pkg import mod`` resolves to pkg.mod)."""
    found = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                base = ".".join(parent + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m in known and m != name}


def layer(name: str) -> int:
    for i, group in enumerate(LAYERS):
        if any(name == g or name.startswith(g + ".") for g in group):
            return i
    return -1                                            # sandbox/__init__.py


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, deps in g.items() for b in deps if layer(b) > layer(a))


def find_cycles(g: dict[str, set[str]]) -> list[str]:
    cycles, state = [], {}

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for d in sorted(g[m]):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [])
    return cycles


def test_every_module_has_a_layer_and_imports_point_down():
    g = graph()
    assert "sandbox.sweep.runner" in g and "sandbox.kernels.triton_chunk" in g     # the walk found the tree
    unplaced = [m for m in g if layer(m) < 0 and m != "sandbox"]
    assert not unplaced, f"modules outside the layer table: {unplaced}"
    assert not upward_imports(g), "imports against the direction of the layers:\n" + "\n".join(upward_imports(g))


def test_no_import_cycles():
    cycles = find_cycles(graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The walk itself: a two-module cycle and a kernel importing the training loop are found."""
    pkg = tmp_path / "sandbox"
    (pkg / "kernels").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kernels" / "__init__.py").write_text("")
    (pkg / "kernels" / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "kernels" / "b.py").write_text("from sandbox.kernels.a import f\nimport sandbox.train\n")
    (pkg / "train.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "ROOT", pkg)
    g = graph()
    assert g["sandbox.kernels.a"] == {"sandbox.kernels", "sandbox.kernels.b"}
    assert find_cycles(g) == ["sandbox.kernels.a -> sandbox.kernels.b -> sandbox.kernels.a"]
    assert upward_imports(g) == ["sandbox.kernels.b -> sandbox.train"]


# ---- the figures: one folder each, and a library that names none ------------------------------------------

FIGURES = ROOT.parent / "figures"
FIGURE_NAMES = ("sse_fig8", "zoology_fig2", "sla_heads", "sse_ablations", "sse_state_scaling", "lalte_hybrid")


def figure_folders() -> list[Path]:
    return sorted(p for p in FIGURES.iterdir() if p.is_dir())


@pytest.mark.slow
def test_every_figure_folder_has_a_readme_sweep_files_and_verdict_code_that_loads():
    from sandbox.analysis.verdicts import _load
    from sandbox.sweep.spec import load_sweep
    assert [p.name for p in figure_folders()] == ["lalte_hybrid", "sla_heads", "sse_ablations", "sse_fig8_topk",
                                                  "sse_state_scaling", "zoology_fig2"]
    for folder in figure_folders():
        assert (folder / "README.md").is_file(), folder
        sweeps = sorted(folder.glob("*.yaml"))
        assert sweeps, f"{folder}: no sweep file"
        for path in sweeps:
            spec = load_sweep(path)
            assert spec.points(), path
            module = _load(folder, spec.name)
            assert all(callable(f) for f in module.CLAIMS), folder
            assert set(getattr(module, "PICTURE_RUNS", {})) <= {load_sweep(p).name for p in sweeps}, folder


def test_the_library_names_no_figure():
    hits = [f"{path.relative_to(ROOT.parent)}:{n}" for path in sorted(ROOT.rglob("*"))
            if path.is_file() and path.suffix in (".py", ".md", ".yaml", ".txt")
            for n, line in enumerate(path.read_text().splitlines(), 1) if any(f in line for f in FIGURE_NAMES)]
    assert not hits, "sandbox/ names a figure (its code belongs in figures/NAME/):\n" + "\n".join(hits)
