#!/usr/bin/env bash
# Checks the layering contract of pyproject.toml ([tool.importlinter]) with import-linter.
#
# setup.py maps the top-level folders dsl/ kernels/ search/ plans/ onto wpk.dsl ...
# wpk.plans; import-linter finds modules by walking the package's folder, which an
# editable install does not have in one piece. So the tree is installed (no deps, no
# build isolation) into a temporary folder, where the mapping is applied, and linted there.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python -m pip install -q --no-deps --no-build-isolation --target "$work/layout" "$repo" \
    2> >(grep -v -e "^WARNING: Running pip as" -e "^$" >&2 || true)
rm -rf "$repo/build"
cd "$work"
PYTHONPATH="$work/layout" lint-imports --config "$repo/pyproject.toml" --no-cache
