#!/usr/bin/env bash
# Sets up a fresh machine of this kind for the project (idempotent):
#   - Debian packages: PostgreSQL and Redis servers (and a JDK 17 + Maven when absent)
#   - a virtualenv in .venv with the project and its dev tools
# The Java artifacts (Kafka, Connect, Debezium) are fetched by `invoicing stack up`.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || need+=(postgresql)
command -v redis-server >/dev/null || need+=(redis-server)
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || need+=(maven)
# PDFs: WeasyPrint needs Pango, and renders with the DejaVu fonts; the tests read PDFs back
# with poppler-utils (pdftotext, pdftoppm) and drive the hosted invoice page in Chromium.
compgen -G "/usr/lib/*/libpango-1.0.so.0" >/dev/null || need+=(libpango-1.0-0 libpangoft2-1.0-0)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
command -v pdftotext >/dev/null || need+=(poppler-utils)
command -v chromium >/dev/null || need+=(chromium)
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "setup: installing Debian packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends "${need[@]}" >/dev/null 2>&1 || {
      apt-get update -qq && apt-get install -y --no-install-recommends "${need[@]}"
    }
  else
    echo "setup: missing Debian packages: ${need[*]}" >&2
    echo "setup: install them with: sudo apt-get update && sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
fi

PYTHON="${PYTHON:-python3}"
"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"setup: Python >= 3.11 is required, found {sys.version.split()[0]}")
PY
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e ".[dev]"
echo "setup: ready (.venv/bin/invoicing)"
