"""The installed packages, found rather than listed: each top folder of the checkout installs as radt.<folder> with
every sub-package under it, so a new room ships in the wheel without an edit here (pyproject.toml holds the rest)."""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
# the checkout's top folders and the package each installs as: radt adds one name to site-packages
FOLDERS = {"radt": "radt", "radt.app": "app", "radt.collectors": "collectors", "radt.pages": "pages", "radt.assets": "assets"}


def packages() -> list[str]:
    """Every package under each folder, named radt.<folder>.<sub>; a linked folder (radt/app -> ../app) is not found twice."""
    found = []
    for package, folder in FOLDERS.items():
        root = (HERE / folder).resolve()
        found.append(package)
        found += [f"{package}.{sub}" for sub in find_packages(folder) if (HERE / folder / sub.replace(".", "/")).resolve().is_relative_to(root)]
    return found


setup(packages=packages(), package_dir=FOLDERS)
