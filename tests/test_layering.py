"""What imports what: product code (kernels/, nodes/, integrations/, the ComfyUI entry) never imports
the study package, and the prepare / operand modules never import a backend (no import loop)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = sorted([ROOT / "__init__.py", *(ROOT / "kernels").glob("*.py"), *(ROOT / "nodes").glob("*.py"),
                  *(ROOT / "integrations").glob("*.py")])


def _imported(path: Path) -> set[str]:
    """Dotted names a module imports, relative ones resolved against the package root ("kernels.x")."""
    package = path.parent.relative_to(ROOT).parts
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names.update(f"{module}.{alias.name}".lstrip(".") for alias in node.names)
            names.add(module)
    return names


@pytest.mark.parametrize("path", PRODUCT, ids=lambda p: str(p.relative_to(ROOT)))
def test_product_code_never_imports_the_study_package(path):
    assert not [n for n in _imported(path) if n == "study" or n.startswith("study.") or ".study" in n]


@pytest.mark.parametrize("name", ["operands", "prepare_reference", "prepare_cuda", "operand_emulation", "prepared_run", "layout"])
def test_prepare_modules_import_no_backend(name):
    imported = _imported(ROOT / "kernels" / f"{name}.py")
    assert not [n for n in imported if n.startswith(("kernels.backend", "kernels.api"))]


def test_the_import_walk_sees_relative_imports():
    """Guards the two tests above against passing vacuously."""
    assert "kernels.backends.Backend" in _imported(ROOT / "kernels" / "backend_mma.py")
    assert "study.videodata" in _imported(ROOT / "commands" / "demo_modes.py")
