"""The wheel holds every folder of the package: pyproject.toml's `packages` list cannot miss one.

setuptools maps each top-level folder to `locomesh.<folder>` (`package-dir`) and takes only the
packages listed; a folder left out is silently absent from a wheel while the editable install
`cli/dev` makes still imports it. `.ci/wheel_check` builds the wheel and starts a node from it.
"""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
REPOSITORY_TOOLS = {"cli/dev"}  # the README's set-up script: run from a clone, never installed


def _setuptools() -> dict:
    return tomllib.loads((TOP / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folders_with_files(root: Path) -> list[Path]:
    return sorted(
        folder for folder in [root, *root.rglob("*")]
        if folder.is_dir() and folder.name != "__pycache__"
        and any(child.is_file() for child in folder.iterdir())
    )


def _package_name(folder: Path, package_dir: dict[str, str]) -> str:
    for name, top in package_dir.items():
        root = TOP / top
        if folder == root or root in folder.parents:
            return ".".join([name, *folder.relative_to(root).parts])
    raise AssertionError(f"{folder} is under no mapped folder")


def test_every_folder_of_the_package_is_listed() -> None:
    config = _setuptools()
    listed = set(config["packages"])
    package_dir = config["package-dir"]
    folders = [folder for top in package_dir.values() for folder in _folders_with_files(TOP / top)]
    assert len(folders) > len(package_dir)
    missing = sorted({_package_name(folder, package_dir) for folder in folders} - listed)
    assert not missing, f"add to pyproject.toml's [tool.setuptools] packages: {missing}"


def test_every_data_file_of_a_package_is_in_package_data() -> None:
    config = _setuptools()
    package_dir = config["package-dir"]
    data = config.get("package-data", {})
    unshipped = []
    for top in package_dir.values():
        for folder in _folders_with_files(TOP / top):
            patterns = data.get(_package_name(folder, package_dir), [])
            unshipped += [
                str(path.relative_to(TOP)) for path in folder.iterdir()
                if path.is_file() and path.suffix != ".py" and not path.name.startswith(".")
                and str(path.relative_to(TOP)) not in REPOSITORY_TOOLS
                and not any(fnmatch.fnmatch(path.name, pattern) for pattern in patterns)
            ]
    assert not unshipped, f"files a wheel would leave out (pyproject.toml's package-data): {unshipped}"


def test_every_top_level_package_folder_is_mapped() -> None:
    """A top-level folder with an `__init__.py` is one of `locomesh`'s subpackages: it has its
    `package-dir` line (tests/ is the suite, never installed)."""
    package_dir = _setuptools()["package-dir"]
    folders = sorted(
        path.parent.name for path in TOP.glob("*/__init__.py")
        if path.parent.name not in {"tests", ".venv", "build"}
    )
    assert folders, "no top-level package folder found"
    unmapped = [folder for folder in folders if package_dir.get(f"locomesh.{folder}") != folder]
    assert not unmapped, f"add to pyproject.toml's [tool.setuptools.package-dir]: {unmapped}"
    assert {f"locomesh.{folder}" for folder in folders} == set(package_dir), "package-dir maps a folder that is gone"


def test_every_listed_package_is_a_folder() -> None:
    """No stale name in `packages` (a renamed room stays listed and the build fails), and package
    data is declared only for listed packages (setuptools would otherwise warn and drop it)."""
    config = _setuptools()
    package_dir = config["package-dir"]

    def folder_of(package: str) -> Path:
        top = ".".join(package.split(".")[:2])
        assert top in package_dir, f"{package} is under no package-dir mapping"
        return TOP / package_dir[top] / Path(*package.split(".")[2:])

    gone = [package for package in config["packages"] if not folder_of(package).is_dir()]
    assert not gone, f"listed in pyproject.toml's packages but not a folder: {gone}"
    unlisted = sorted(set(config.get("package-data", {})) - set(config["packages"]))
    assert not unlisted, f"package-data for packages that are not listed: {unlisted}"
