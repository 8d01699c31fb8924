#!/usr/bin/env bash
# Writes .ports.env: the INVOICING_* variables that move every service of the local
# stack by OFFSET ports, so that a second checkout (a git worktree) can run its own
# stack beside the default one on the same machine.
#
#   bash scripts/ports-env.sh 100      # Kafka 19192, PostgreSQL 15532, Redis 16479, ...
#   source .ports.env                  # then `invoicing stack up`, `make test`, ...
#   bash scripts/ports-env.sh 50 FILE  # the same, written to FILE instead of .ports.env
#
# OFFSET 0 writes the defaults. The file is git-ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
offset="${1:?usage: scripts/ports-env.sh OFFSET [FILE] (e.g. 100)}"
out="${2:-.ports.env}"
case "$offset" in '' | *[!0-9]*) echo "OFFSET must be a number" >&2; exit 2 ;; esac
p() { echo $(($1 + offset)); }
cat >"$out" <<EOF
# written by scripts/ports-env.sh $offset; source it before any invoicing command
export INVOICING_KAFKA__BOOTSTRAP_SERVERS=127.0.0.1:$(p 19092)
export INVOICING_KAFKA__CONTROLLER_PORT=$(p 19093)
export INVOICING_CONNECT__URL=http://127.0.0.1:$(p 18083)
export INVOICING_POSTGRES__PORT=$(p 15432)
export INVOICING_REDIS__URL=redis://127.0.0.1:$(p 16379)/0
export INVOICING_TAX__URL=http://127.0.0.1:$(p 18090)
export INVOICING_SMTP__PORT=$(p 12525)
export INVOICING_VIEW__PORT=$(p 18700)
export INVOICING_VIEW__URL=http://127.0.0.1:$(p 18700)
export INVOICING_INGEST__PORT=$(p 18800)
export INVOICING_PORTAL__PORT=$(p 18900)
export INVOICING_PORTAL__PUBLIC_URL=http://127.0.0.1:$(p 18900)
EOF
echo "wrote $out (offset $offset): source $out"
