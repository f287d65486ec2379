"""Build the attn_utils wheel, install it (not editable) into a clean virtual environment, import every module.

    python tools/check_wheel.py          # make check-wheel

Every other install path in the project is editable (``pip install -e .``), which imports from the
source tree and so cannot notice a wheel that leaves a subpackage out. This one can: it fails when
the wheel lacks a module the source tree has, when its version is not ``attn_utils.__version__``,
or when any module fails to import from the installed copy (run outside the source tree).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tempfile
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def source_modules() -> list[str]:
    """Dotted names of every module under attn_utils/ in the source tree."""
    names = []
    for path in sorted((ROOT / "attn_utils").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def source_version() -> str:
    tree = ast.parse((ROOT / "attn_utils" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit("attn_utils/__init__.py has no __version__")


def main() -> int:
    build_dir_existed = (ROOT / "build").exists()
    with tempfile.TemporaryDirectory(prefix="wheel-") as tmp:
        tmp = Path(tmp)
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp / "dist"), str(ROOT)],
            check=True,
        )
        if not build_dir_existed:  # setuptools builds in the source tree: leave no build/ behind
            shutil.rmtree(ROOT / "build", ignore_errors=True)
        (wheel,) = (tmp / "dist").glob("attn_utils-*.whl")
        version = wheel.name.split("-")[1]
        if version != source_version():
            print(f"wheel version {version} is not attn_utils.__version__ {source_version()}")
            return 1
        in_wheel = {
            n.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            for n in zipfile.ZipFile(wheel).namelist()
            if n.endswith(".py")
        }
        missing = [m for m in source_modules() if m not in in_wheel]
        if missing:
            print(f"the wheel lacks {len(missing)} module(s): {', '.join(missing)}")
            return 1
        venv.create(tmp / "venv", with_pip=True)
        python = tmp / "venv" / "bin" / "python"
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-c",
                str(ROOT / "constraints.txt"),
                str(wheel),
            ],
            check=True,
        )
        imports = "; ".join(f"import {m}" for m in source_modules())
        probe = f"{imports}; import attn_utils; assert '{tmp}' in attn_utils.__file__, attn_utils.__file__"
        subprocess.run([str(python), "-c", probe], check=True, cwd=tmp)  # cwd outside the source tree
        print(f"{wheel.name}: {len(source_modules())} modules installed from the wheel and imported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
