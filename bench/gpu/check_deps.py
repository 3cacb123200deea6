"""Check the carried packages' requirements against what this Python sees (the image plus the carry).

The GPU image is not ours: a package it already has (click, werkzeug, python-dateutil...) may be too old or
too new for what the carry needs. This reads every Requires-Dist of the distributions in SITE (markers
evaluated, extras ignored) and prints one line per requirement that is missing or of another version.
Exits 0 either way (it warns; the smoke run decides). Needs `packaging` (the image has it).
usage: python3 check_deps.py SITE_DIR
"""
import importlib.metadata as md
import sys
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:  # pragma: no cover
    print("check_deps: no `packaging` here: requirements not checked")
    sys.exit(0)


def main(site: Path) -> int:
    carried = {}
    for info in sorted(site.glob("*.dist-info")):
        dist = md.Distribution.at(info)
        carried[dist.metadata["Name"]] = dist
    problems = 0
    for name, dist in carried.items():
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                found = md.version(req.name)
            except md.PackageNotFoundError:
                print(f"check_deps: {name} needs {req}: not installed")
                problems += 1
                continue
            if req.specifier and not req.specifier.contains(found, prereleases=True):
                print(f"check_deps: {name} needs {req}: found {found}")
                problems += 1
    print(f"check_deps: {len(carried)} carried distributions, {problems} unmet requirements")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
